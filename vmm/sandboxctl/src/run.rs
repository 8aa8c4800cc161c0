//! One run of `sandboxctl`: the runtime, connecting to the agent, dispatching to the
//! command modules, and what commands share (building a `ProcessSpec`, exit bytes).

use std::time::Duration;

use anyhow::{bail, Context};
use sandbox_protocol::{Command as Cmd, ProcessSpec, User};
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};

use crate::args::{Cli, Command, ProcessArgs};
use crate::{
    doctor, eval, exec, files, info, logs, node, port_forward, procs, shell, system, vm, wait,
};

/// Exit code when `exec`/`sh` hit their timeout (as coreutils `timeout` does), and
/// when `wait-for` gives up.
pub const EXIT_TIMED_OUT: u8 = 124;

/// Runs one `sandboxctl` invocation and returns the exit code to use.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("Cannot start the async runtime")?;
    let result = runtime.block_on(dispatch(cli));
    // Do not wait for blocking reads of our stdin that can never be cancelled.
    runtime.shutdown_background();
    result
}

async fn dispatch(mut cli: Cli) -> anyhow::Result<u8> {
    // `port-forward ID ...` names its VM as `--vm ID` does.
    if let Command::PortForward(args) = &cli.command {
        match &cli.vm {
            Some(vm) if *vm != args.id => bail!("port-forward names VM {} and --vm {vm}", args.id),
            _ => cli.vm = Some(args.id.clone()),
        }
    }
    // These manage VMs rather than talk to one agent.
    match (&cli.command, &cli.node) {
        (Command::Node(command), node) => {
            let api = node::api(node.as_deref().unwrap_or(node::DEFAULT_NODE), cli.token)?;
            return node::node(command, &api).await;
        }
        (Command::Vm(command), Some(addr)) => {
            return node::vm(command, &node::api(addr, cli.token.clone())?).await
        }
        (Command::Vm(command), None) => return vm::run(command, cli.token.clone()).await,
        (Command::Doctor, _) => return doctor::doctor().await,
        _ => {}
    }
    if cli.node.is_some() {
        // The node's sandboxes are its own: a failure is the command's to report.
        return on_agent(cli).await;
    }
    // A failure on `--vm ID` whose VM has stopped is that VM's end, not the command's.
    let vm_id = cli.vm.clone();
    let result = on_agent(cli).await;
    match (result, vm_id) {
        (Err(error), Some(id)) => Err(vm::explain_failure(&id, error)),
        (result, _) => result,
    }
}

/// Connects to the agent and runs one command on it.
async fn on_agent(cli: Cli) -> anyhow::Result<u8> {
    let client = connect(&cli).await?;
    match cli.command {
        Command::Exec(args) => {
            let spec = process_spec(Cmd::Argv(args.command), args.process);
            exec::exec(&client, spec, &args.run).await
        }
        Command::Sh(args) => {
            let spec = process_spec(Cmd::Shell(args.script), args.process);
            exec::exec(&client, spec, &args.run).await
        }
        Command::Spawn(args) => {
            let spec = process_spec(Cmd::Argv(args.command), args.process);
            exec::spawn(&client, spec).await
        }
        Command::Ps(args) => procs::ps(&client, args.json).await,
        Command::Kill(args) => procs::kill(&client, args.pid, args.signal).await,
        Command::WaitFor(args) => wait::wait_for(&client, &args).await,
        Command::Logs(args) => logs::logs(&client, &args).await,
        Command::Shell(args) => {
            let mut spec = process_spec(Cmd::Argv(args.command), args.process);
            if matches!(&spec.command, Some(Cmd::Argv(argv)) if argv.is_empty()) {
                spec.command = None;
            }
            shell::shell(&client, spec).await
        }
        Command::Attach(args) => shell::attach(&client, args.pid).await,
        Command::Eval(args) => eval::eval(&client, &args).await,
        Command::CloseSession(args) => eval::close_session(&client, &args.name).await,
        Command::Info(args) => info::info(&client, args.json).await,
        Command::PortForward(args) => port_forward::port_forward(&client, &args).await,
        Command::Put(args) => files::put(&client, &args).await,
        Command::Get(args) => files::get(&client, &args).await,
        Command::Cat(args) => files::cat(&client, &args.path).await,
        Command::Write(args) => files::write(&client, &args).await,
        Command::Ls(args) => files::ls(&client, &args).await,
        Command::Stat(args) => files::stat(&client, &args).await,
        Command::Rm(args) => files::rm(&client, &args).await,
        Command::Mkdir(args) => files::mkdir(&client, &args).await,
        Command::Resume(args) => system::resume(&client, args.new_identity).await,
        Command::Shutdown(args) => system::shutdown(&client, args.reboot).await,
        // Handled before connecting.
        Command::Vm(_) | Command::Doctor | Command::Node(_) => Ok(0),
    }
}

async fn connect(cli: &Cli) -> anyhow::Result<Client> {
    // --vm ID brings the VM's own token; --token (or SANDBOX_TOKEN) overrides it.
    let (vm_url, vm_token) = match (&cli.vm, &cli.node) {
        (Some(id), Some(addr)) => {
            let (url, token) = node::agent(&node::api(addr, cli.token.clone())?, id);
            return connect_to(cli, &url, token).await;
        }
        (None, Some(_)) => bail!("--node drives a node's sandboxes: name one with --vm ID"),
        (Some(id), None) => {
            // A hibernated VM wakes transparently on its next use.
            vm::wake_if_hibernated(id).await?;
            let (url, token) = vm::agent_address(id)?;
            (Some(url), token)
        }
        (None, None) => (None, None),
    };
    let Some(url) = vm_url.as_ref().or(cli.agent.as_ref()) else {
        bail!(
            "No agent given: pass --agent URL, --vm ID, --node ADDR --vm ID, or set SANDBOX_AGENT"
        );
    };
    let url: AgentUrl = url
        .parse()
        .with_context(|| format!("Invalid agent URL {url:?}"))?;
    connect_to(cli, &url, cli.token.clone().or(vm_token)).await
}

/// Connects to `url` with `token`, retrying for `--wait`.
async fn connect_to(cli: &Cli, url: &AgentUrl, token: Option<String>) -> anyhow::Result<Client> {
    let url = url.clone();
    let opts = ConnectOptions {
        token,
        connect_timeout: seconds("--connect-timeout", cli.connect_timeout)?,
    };
    let client = match cli.wait {
        Some(wait) => {
            let deadline = tokio::time::Instant::now() + seconds("--wait", wait)?;
            Client::connect_with_retry(&url, &opts, deadline).await
        }
        None => Client::connect(&url, &opts).await,
    };
    client.with_context(|| format!("Cannot reach the agent at {url}"))
}

/// A positive, finite number of seconds as a duration.
pub(crate) fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        bail!("{flag} must be a positive number of seconds, not {secs}");
    }
    Duration::try_from_secs_f64(secs).with_context(|| format!("{flag} {secs} is out of range"))
}

pub(crate) fn process_spec(command: Cmd, args: ProcessArgs) -> ProcessSpec {
    ProcessSpec {
        command: Some(command),
        env: args.env,
        cwd: args.cwd,
        user: args.user.map(|user| match user.parse::<u32>() {
            Ok(uid) => User::Uid(uid),
            Err(_) => User::Name(user),
        }),
    }
}

/// Converts a status code into a process exit code (0..=255).
pub(crate) fn exit_byte(code: i32) -> u8 {
    u8::try_from(code.rem_euclid(256)).unwrap_or(u8::MAX)
}
