//! `sandboxctl`'s command line, as clap types. Validation that clap cannot do (the
//! agent URL, timeouts) happens in [`crate::run`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use sandbox_vmm::launcher::AgentTransport;

/// Drive a sandbox agent: run commands, manage processes, open terminals.
#[derive(Debug, Parser)]
#[command(name = "sandboxctl", version, about, propagate_version = true)]
pub struct Cli {
    /// Agent URL: unix://PATH, vsock://CID:PORT or hvsock://PATH:PORT.
    #[arg(long, env = "SANDBOX_AGENT", global = true, value_name = "URL")]
    pub agent: Option<String>,
    /// A node daemon (sandboxd) to drive instead of this machine's VMs: `vm ...`
    /// goes through its control plane, `--vm ID` through its data plane.
    /// HOST:PORT, http(s)://HOST:PORT, or https://HOST:PORT?ca=PEM_FILE.
    #[arg(
        long,
        env = "SANDBOXD_ADDR",
        global = true,
        value_name = "ADDR",
        conflicts_with = "agent"
    )]
    pub node: Option<String>,
    /// Shared secret the agent requires; with --node, the node's token (the
    /// operator's, or a sandbox's own from its claim; default SANDBOXD_TOKEN, then
    /// this machine's node operator token file).
    #[arg(
        long,
        env = "SANDBOX_TOKEN",
        global = true,
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Give up connecting after this many seconds.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Keep retrying the connection for up to this many seconds (a booting VM).
    #[arg(long, global = true, value_name = "SECS")]
    pub wait: Option<f64>,
    /// Talk to the agent of a VM started with `vm start` (instead of --agent).
    #[arg(long, global = true, value_name = "ID", conflicts_with = "agent")]
    pub vm: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command, stream its output, exit with its code (128+N when killed by
    /// signal N, 124 on timeout).
    Exec(ExecArgs),
    /// Like exec, but run one shell command line with `/bin/sh -c`.
    Sh(ShArgs),
    /// Start a detached command and print its pid.
    Spawn(SpawnArgs),
    /// List tracked processes.
    Ps(PsArgs),
    /// Print a process's output (stdout and stderr to ours); -f follows it to the end.
    Logs(LogsArgs),
    /// Send a signal to a process's group (0 means SIGKILL).
    Kill(KillArgs),
    /// Wait until a guest file (--file) or a process's output (--pid) contains TEXT;
    /// print where. Exits 124 at the timeout.
    WaitFor(WaitForArgs),
    /// Open an interactive terminal (Ctrl-] detaches; `attach` comes back).
    Shell(ShellArgs),
    /// Re-attach to a terminal: replay what it printed, then follow it.
    Attach(AttachArgs),
    /// Run code in an interpreter session whose variables, imports and working
    /// directory persist between runs (Python, or sh with --lang sh); prints its
    /// output, then a trailing expression's value or the exception's traceback.
    Eval(EvalArgs),
    /// End an interpreter session: its interpreter and all it started are killed.
    CloseSession(CloseSessionArgs),
    /// Describe the agent.
    Info(InfoArgs),
    /// Listen on a local port and pipe every connection to a guest TCP port
    /// (`[LOCAL:]GUEST`, like kubectl port-forward); Ctrl-C ends it.
    PortForward(PortForwardArgs),
    /// Copy a local file into the guest (any size; atomic on completion).
    Put(PutArgs),
    /// Copy a guest file to a local path ("-" writes to stdout).
    Get(GetArgs),
    /// Print a guest file (a regular file of at most 1 MiB).
    Cat(PathArgs),
    /// Replace a guest file atomically with our stdin.
    Write(WriteArgs),
    /// List a guest directory.
    Ls(LsArgs),
    /// Describe a guest path (a final symlink is not followed).
    Stat(StatArgs),
    /// Remove a guest path.
    Rm(RmArgs),
    /// Create a guest directory.
    Mkdir(MkdirArgs),
    /// Tell the guest it was restored: set its clock to ours, reseed its random
    /// generator, and with --new-identity give it a new machine id.
    Resume(ResumeArgs),
    /// Stop every process in the guest and power it off (or reboot it).
    Shutdown(ShutdownArgs),
    /// Boot, list and stop microVMs.
    #[command(subcommand)]
    Vm(VmCommand),
    /// Report what is present or missing to boot microVMs here.
    Doctor,
    /// A node daemon itself: info, drain, uncordon, templates (--node, or
    /// SANDBOXD_ADDR, or 127.0.0.1:7777).
    #[command(subcommand)]
    Node(NodeCommand),
}

/// `node …`
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Warm pool, templates, capacity, claims and drain state.
    Info(VmLsArgs),
    /// Refuse new claims; claimed sandboxes run out their deadlines. In a fleet
    /// with an object store, hibernated sandboxes move to other nodes.
    Drain(NodeDrainArgs),
    /// Take claims again after a drain.
    Uncordon,
    /// Delete a promoted template (fleet-wide with an object store).
    RmTemplate(NodeTemplateArgs),
    /// Put one of the node's templates in the fleet's object store: any node then
    /// claims it.
    Publish(NodeTemplateArgs),
    /// Delete the object store's blobs no checkpoint, parked sandbox or template
    /// names.
    StoreGc(NodeStoreGcArgs),
}

/// `node drain`
#[derive(Debug, Args)]
pub struct NodeDrainArgs {
    /// Hibernate the running sandboxes too, so that every sandbox moves to another
    /// node of the fleet (the node empties itself; needs --store and --etcd on it).
    #[arg(long)]
    pub hibernate: bool,
}

/// `node store-gc`
#[derive(Debug, Args)]
pub struct NodeStoreGcArgs {
    /// Spare unnamed blobs younger than this many seconds (default a day; at
    /// least an hour).
    #[arg(long, default_value_t = 0)]
    pub grace: u64,
    /// Count what would go; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `node rm-template`
#[derive(Debug, Args)]
pub struct NodeTemplateArgs {
    /// The promoted template's name.
    pub name: String,
}

/// `vm …`
#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// Boot a VM, run one command in it (output streamed), shut it down, and exit
    /// with the command's code.
    Run(VmRunArgs),
    /// Boot a VM that outlives this command; prints its id and agent URL.
    Start(VmBootArgs),
    /// List VMs and their state.
    Ls(VmLsArgs),
    /// Shut a VM down (the guest first, then QEMU) and remove its run folder.
    Stop(VmStopArgs),
    /// Checkpoint a running VM (brief pause; the VM goes on); prints the checkpoint id.
    Checkpoint(VmCheckpointArgs),
    /// Start N VMs from a checkpoint (copy-on-write RAM, each with its own identity);
    /// prints each one's id and agent URL.
    Branch(VmBranchArgs),
    /// Checkpoint a VM and start N copies of it at once: all or nothing.
    Fork(VmForkArgs),
    /// List checkpoints and what uses them.
    Checkpoints(VmLsArgs),
    /// Delete a checkpoint (refused while a VM or another checkpoint uses it).
    RmCheckpoint(VmRmCheckpointArgs),
    /// Save a VM's state to disk and stop its QEMU (its memory is freed); the next
    /// `--vm ID` (or `vm wake`) brings it back as it was.
    Hibernate(VmIdArgs),
    /// Wake a hibernated VM.
    Wake(VmIdArgs),
    /// Make a running VM's current state a template: VMs started from it restore that
    /// state (re-promoting a name replaces it).
    Promote(VmPromoteArgs),
    /// Print a VM's egress log: each connection it tried, allowed or denied, with
    /// bytes and times.
    EgressLog(VmEgressLogArgs),
}

/// `vm egress-log`
#[derive(Debug, Args)]
pub struct VmEgressLogArgs {
    /// The VM's id.
    pub id: String,
    /// Only the last N records.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub tail: usize,
    /// Print JSON lines, as stored.
    #[arg(long)]
    pub json: bool,
}

/// `vm promote`
#[derive(Debug, Args)]
pub struct VmPromoteArgs {
    /// The VM's id.
    pub id: String,
    /// The template's name.
    pub name: String,
}

/// A VM by id.
#[derive(Debug, Args)]
pub struct VmIdArgs {
    /// The VM's id.
    pub id: String,
}

/// `vm checkpoint`
#[derive(Debug, Args)]
pub struct VmCheckpointArgs {
    /// The VM's id.
    pub id: String,
    /// A unique name to branch it by later.
    #[arg(long)]
    pub name: Option<String>,
    /// How RAM is captured: `live` copies it while the guest runs (a short pause
    /// whatever the memory in use), `paused` while it is stopped (the shortest call
    /// for a small guest), `auto` picks by the RAM in use (live from 128 MiB).
    #[arg(long, value_enum, default_value_t = CaptureMethodArg::Auto)]
    pub method: CaptureMethodArg,
    /// Write the whole RAM image, not only the pages that changed since the VM's
    /// last checkpoint (an incremental one is made whole at its first restore).
    #[arg(long)]
    pub full: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `vm checkpoint --method`
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CaptureMethodArg {
    /// Live from 128 MiB of RAM in use, paused below.
    Auto,
    /// Stop the VM, then copy its RAM.
    Paused,
    /// Write-protect RAM and copy it while the VM runs (a short pause whatever
    /// the RAM in use; a longer call).
    Live,
}

/// `vm branch`
#[derive(Debug, Args)]
pub struct VmBranchArgs {
    /// The checkpoint's id or name.
    pub checkpoint: String,
    #[command(flatten)]
    pub children: ChildrenArgs,
}

/// `vm fork`
#[derive(Debug, Args)]
pub struct VmForkArgs {
    /// The VM's id.
    pub id: String,
    #[command(flatten)]
    pub children: ChildrenArgs,
}

/// How many VMs a branch or fork starts, and how they are reported.
#[derive(Debug, Args)]
pub struct ChildrenArgs {
    /// How many VMs.
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    pub count: usize,
    /// Give up if a VM's agent does not answer within this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    pub boot_timeout: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `vm rm-checkpoint`
#[derive(Debug, Args)]
pub struct VmRmCheckpointArgs {
    /// The checkpoint's id or name.
    pub checkpoint: String,
}

/// What to boot.
#[derive(Debug, Args)]
pub struct VmBootArgs {
    /// Template name (under SANDBOX_HOME/templates) or folder, or an image reference
    /// (oci://REGISTRY/REPO:TAG, python:3.12-slim) whose template is built once when
    /// --allow-registry allows its registry.
    #[arg(long, short = 't', default_value = "default")]
    pub template: String,
    /// small, medium, large, xlarge or 2xlarge (default: the template's).
    #[arg(long, short = 's')]
    pub size: Option<String>,
    /// Give up if the agent is not ready within this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120.0)]
    pub boot_timeout: f64,
    /// How the host reaches the agent: serial (the default: can be checkpointed and
    /// forked) or vsock.
    #[arg(long, value_name = "serial|vsock")]
    pub transport: Option<AgentTransport>,
    /// Boot the kernel even when the template has a ready snapshot to restore.
    #[arg(long)]
    pub cold: bool,
    /// none (the default: no route out) or egress (through the host, to what
    /// `--allow` lists; programs find the proxy through http_proxy and friends).
    #[arg(long, value_name = "none|egress", default_value = "none")]
    pub net: NetMode,
    /// An allowlist entry for `--net egress` (repeatable): `pypi.org`,
    /// `*.github.com:443`, `*`, `203.0.113.7`, `10.0.0.0/8:8000-8099`, `[::1]:8080`.
    #[arg(long, value_name = "ENTRY")]
    pub allow: Vec<String>,
    /// With --node: the claim's lifetime in seconds (default one hour).
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    /// Templates from registries (without --node; a node has its own policy).
    #[command(flatten)]
    pub registry: sandbox_engine::image_build::RegistryArgs,
}

/// `--net`
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetMode {
    /// No route out.
    None,
    /// Egress through the host's allowlist.
    Egress,
}

/// `vm run`
#[derive(Debug, Args)]
pub struct VmRunArgs {
    #[command(flatten)]
    pub boot: VmBootArgs,
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `vm ls`
#[derive(Debug, Args)]
pub struct VmLsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `vm stop`
#[derive(Debug, Args)]
pub struct VmStopArgs {
    /// The VM's id.
    pub id: String,
    /// Seconds the guest gets to power off before QEMU is killed.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub grace: f64,
}

/// `put LOCAL REMOTE`
#[derive(Debug, Args)]
pub struct PutArgs {
    /// Local file ("-" reads our stdin).
    pub local: PathBuf,
    /// Absolute guest path; its directory must exist.
    pub remote: PathBuf,
    /// Permission bits in octal (default: the local file's, or 644 for stdin).
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<u32>,
}

/// `get REMOTE LOCAL`
#[derive(Debug, Args)]
pub struct GetArgs {
    /// Absolute guest path.
    pub remote: PathBuf,
    /// Local file ("-" writes to stdout).
    pub local: PathBuf,
}

/// A guest path.
#[derive(Debug, Args)]
pub struct PathArgs {
    /// Absolute guest path.
    pub path: PathBuf,
}

/// `write REMOTE`
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Absolute guest path; its directory must exist.
    pub path: PathBuf,
    /// Permission bits in octal (default: keep the old file's, or 644).
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<u32>,
}

/// `ls PATH`
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Absolute guest directory.
    #[arg(default_value = "/")]
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `stat PATH`
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Absolute guest path.
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `rm [-r] PATH`
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Absolute guest path.
    pub path: PathBuf,
    /// Remove a directory and everything in it.
    #[arg(short, long)]
    pub recursive: bool,
}

/// `mkdir [-p] PATH`
#[derive(Debug, Args)]
pub struct MkdirArgs {
    /// Absolute guest path.
    pub path: PathBuf,
    /// Create missing parents; an existing directory is fine.
    #[arg(short, long)]
    pub parents: bool,
    /// Permission bits in octal (default 755).
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<u32>,
}

/// `resume`
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// This guest is a new machine (a fork): write a new /etc/machine-id.
    #[arg(long)]
    pub new_identity: bool,
}

/// `shutdown`
#[derive(Debug, Args)]
pub struct ShutdownArgs {
    /// Reboot instead of powering off.
    #[arg(long)]
    pub reboot: bool,
}

fn parse_mode(arg: &str) -> Result<u32, String> {
    u32::from_str_radix(arg.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
        .ok_or_else(|| format!("{arg:?} is not an octal mode like 644"))
}

/// How a process starts (shared by exec, sh, spawn and shell).
#[derive(Debug, Clone, Args)]
pub struct ProcessArgs {
    /// Working directory.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Set a variable (repeatable; later ones win).
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Run as this user (name or uid).
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
}

/// Options of a command that runs to completion.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kill the command and all it started after this many seconds (default and
    /// maximum: 300).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Feed this file to the command's stdin ("-" reads ours to the end). By
    /// default our stdin is fed when it is not a terminal (a pipe, a file), and the
    /// command's stdin is empty when it is.
    #[arg(long, value_name = "FILE", conflicts_with = "interactive")]
    pub stdin_file: Option<PathBuf>,
    /// Feed our stdin to the command even when it is a terminal (read to its end,
    /// Ctrl-D, before the command starts), as `docker exec -i` does.
    #[arg(short = 'i', long)]
    pub interactive: bool,
}

/// `exec`
#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `sh`
#[derive(Debug, Args)]
pub struct ShArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// Accepted and ignored, as `sh -c SCRIPT` is typed by habit: the script is
    /// always a command line.
    #[arg(short = 'c', hide = true)]
    pub dash_c: bool,
    /// The shell command line.
    pub script: String,
}

/// `spawn`
#[derive(Debug, Args)]
pub struct SpawnArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `ps`
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `logs`
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Keep following until the process exits.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Start at this absolute byte offset (default: the oldest byte still held).
    #[arg(long, value_name = "N")]
    pub cursor: Option<u64>,
    /// Print JSON (one object per line when following).
    #[arg(long)]
    pub json: bool,
    /// The process.
    pub pid: i32,
}

/// `kill`
#[derive(Debug, Args)]
pub struct KillArgs {
    /// Signal name (TERM, SIGTERM, KILL, …) or number; 0 means SIGKILL.
    #[arg(long, short = 's', value_name = "SIG", default_value = "TERM", value_parser = parse_signal)]
    pub signal: i32,
    /// The process.
    pub pid: i32,
}

/// `wait-for`
/// `port-forward`
#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The VM (this machine's, or with --node the node's sandbox).
    pub id: String,
    /// `GUEST` (the same local port), `LOCAL:GUEST`, or `:GUEST` (any free local port).
    #[arg(value_name = "[LOCAL:]GUEST")]
    pub ports: String,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    pub address: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["file", "pid"])))]
pub struct WaitForArgs {
    /// A guest file (absolute path); it, and its directory, may not exist yet.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// A tracked process: its stdout and stderr (or terminal), from the oldest byte
    /// its ring still holds.
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// Give up after this many seconds (default 30, at most 300; 0 looks once).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The exact text to find.
    pub text: String,
}

/// `shell`
#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub process: ProcessArgs,
    /// What to run instead of the login shell (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `attach`
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The terminal's process.
    pub pid: i32,
}

/// `eval`
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The session; started on first use.
    #[arg(long, value_name = "NAME", default_value = sandbox_protocol::eval::DEFAULT_SESSION)]
    pub session: String,
    /// The session's language: python or sh.
    #[arg(long = "lang", value_name = "LANG", default_value = "python", value_parser = parse_language)]
    pub language: sandbox_protocol::Language,
    /// Interrupt the code after this many seconds (default and maximum: 300); an
    /// interpreter that does not come back within 2 s more is killed.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// When the session died: start a fresh one instead of failing.
    #[arg(long)]
    pub restart: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// The code ("-" reads it from stdin).
    #[arg(allow_hyphen_values = true)]
    pub code: String,
}

/// `close-session`
#[derive(Debug, Args)]
pub struct CloseSessionArgs {
    /// The session.
    pub name: String,
}

/// `info`
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_language(arg: &str) -> Result<sandbox_protocol::Language, String> {
    sandbox_protocol::Language::parse(arg)
        .ok_or_else(|| format!("unknown language {arg:?}: use python or sh"))
}

fn parse_env(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some(("", _)) => Err(format!("{arg:?} has an empty name")),
        Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
        None => Err(format!("{arg:?} is not K=V")),
    }
}

/// A signal by name (`TERM`, `SIGTERM`, `term`) or number (`15`). `0` is this tool's
/// shorthand for `SIGKILL` (the wire carries the explicit signal).
pub fn parse_signal(arg: &str) -> Result<i32, String> {
    if let Ok(number) = arg.parse::<i32>() {
        return match number {
            0 => Ok(libc::SIGKILL),
            1..=sandbox_protocol::MAX_SIGNAL => Ok(number),
            _ => Err(format!(
                "signal number {number} is out of range (0 for SIGKILL, or 1 to {})",
                sandbox_protocol::MAX_SIGNAL
            )),
        };
    }
    let upper = arg.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|signal| signal as i32)
        .map_err(|_| format!("unknown signal {arg:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM"), Ok(15));
        assert_eq!(parse_signal("SIGKILL"), Ok(9));
        assert_eq!(parse_signal("hup"), Ok(1));
        assert_eq!(parse_signal("0"), Ok(9));
        assert!(parse_signal("65").is_err());
        assert_eq!(parse_signal("10"), Ok(10));
        assert!(parse_signal("-3").is_err());
        assert!(parse_signal("NOPE").is_err());
    }

    #[test]
    fn env_needs_a_name_and_equals() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("A="), Ok(("A".into(), String::new())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("A").is_err());
    }

    #[test]
    fn wait_for_needs_exactly_one_target() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["sandboxctl", "wait-for"].iter().chain(args)).map(|cli| {
                let Command::WaitFor(wait) = cli.command else {
                    panic!("not wait-for")
                };
                wait
            })
        };
        let wait = parse(&["--file", "/tmp/log", "--timeout", "2.5", "ready"]).unwrap();
        assert_eq!(wait.file.as_deref(), Some(std::path::Path::new("/tmp/log")));
        assert_eq!((wait.pid, wait.timeout), (None, Some(2.5)));
        assert_eq!(wait.text, "ready");
        let wait = parse(&["--pid", "42", "--json", "--", "--listening"]).unwrap();
        assert_eq!((wait.pid, wait.json), (Some(42), true));
        assert_eq!(wait.text, "--listening");
        assert!(parse(&["ready"]).is_err(), "no target");
        assert!(
            parse(&["--file", "/x", "--pid", "1", "ready"]).is_err(),
            "two targets"
        );
        assert!(parse(&["--pid", "1"]).is_err(), "no text");
    }

    #[test]
    fn eval_defaults_to_the_default_python_session() {
        let cli = Cli::try_parse_from(["sandboxctl", "eval", "1+1"]).unwrap();
        let Command::Eval(eval) = cli.command else {
            panic!("not eval")
        };
        assert_eq!(eval.session, "default");
        assert_eq!(eval.language, sandbox_protocol::Language::Python);
        assert_eq!(eval.code, "1+1");
        let cli = Cli::try_parse_from([
            "sandboxctl",
            "eval",
            "--lang",
            "sh",
            "--session",
            "w",
            "--restart",
            "-",
        ])
        .unwrap();
        let Command::Eval(eval) = cli.command else {
            panic!("not eval")
        };
        assert_eq!(eval.language, sandbox_protocol::Language::Shell);
        assert_eq!((eval.session.as_str(), eval.restart), ("w", true));
        assert_eq!(eval.code, "-");
        assert!(Cli::try_parse_from(["sandboxctl", "eval", "--lang", "ruby", "1"]).is_err());
    }

    #[test]
    fn exec_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "sandboxctl",
            "--agent",
            "unix:///a",
            "exec",
            "--env",
            "K=V",
            "--timeout",
            "2",
            "--",
            "ls",
            "-la",
        ])
        .unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(exec.command, ["ls", "-la"]);
        assert_eq!(exec.process.env, [("K".to_owned(), "V".to_owned())]);
        assert_eq!(exec.run.timeout, Some(2.0));
    }

    /// Regression: `exec -i -- cat` took `-i` as the command.
    #[test]
    fn exec_takes_dash_i_as_docker_does() {
        for args in [
            &["sandboxctl", "exec", "-i", "--", "cat"][..],
            &["sandboxctl", "exec", "-i", "cat"][..],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::Exec(exec) = cli.command else {
                panic!("not exec")
            };
            assert!(exec.run.interactive, "{args:?}");
            assert_eq!(exec.command, ["cat"], "{args:?}");
        }
        let cli = Cli::try_parse_from(["sandboxctl", "sh", "-i", "wc -c"]).unwrap();
        let Command::Sh(sh) = cli.command else {
            panic!("not sh")
        };
        assert!(sh.run.interactive);
        // `sh -c SCRIPT`, typed by habit, is `sh SCRIPT`.
        let cli = Cli::try_parse_from(["sandboxctl", "sh", "-c", "echo -n x | wc -c"]).unwrap();
        let Command::Sh(sh) = cli.command else {
            panic!("not sh")
        };
        assert_eq!(sh.script, "echo -n x | wc -c");
        // What follows the command is the command's.
        let cli = Cli::try_parse_from(["sandboxctl", "exec", "--", "grep", "-i", "x"]).unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("not exec")
        };
        assert!(!exec.run.interactive);
        assert_eq!(exec.command, ["grep", "-i", "x"]);
        assert!(
            Cli::try_parse_from(["sandboxctl", "exec", "-i", "--stdin-file", "f", "cat"]).is_err(),
            "-i and --stdin-file are two sources"
        );
    }
}
