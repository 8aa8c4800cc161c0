//! `vm run|start|ls|stop`, and resolving `--vm ID` to the VM's agent URL.

use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use sandbox_protocol::Command as Cmd;
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use sandbox_vmm::launcher::{
    BootSpec, GuestEnd, Launcher, LauncherConfig, PostMortem, Size, StopOutcome, TemplateRef, Vm,
    VmId, VmStatus,
};

use sandbox_vmm::egress::{Allowlist, Net, Policy, Verdict};

use crate::args::{
    NetMode, VmBootArgs, VmCommand, VmEgressLogArgs, VmLsArgs, VmRunArgs, VmStopArgs,
};
use crate::exec;
use crate::output::{self, print_json_line};
use crate::run::{process_spec, seconds};
use crate::snapshot;

/// Exit code of `vm run` when SIGTERM or SIGHUP stopped it.
const EXIT_SIGNALLED: u8 = 143;

/// Resolves with the name of the first of SIGINT, SIGTERM or SIGHUP to arrive, so
/// the caller can stop what it started instead of dying with the run folder left.
pub(crate) async fn terminating_signal() -> &'static str {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        name = termination_request() => name,
    }
}

/// Resolves on SIGTERM or SIGHUP (never, if they cannot be watched).
async fn termination_request() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

/// How long the guest gets to power off after a shutdown request.
const GUEST_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long connecting to a freshly booted agent may take.
const CONNECT_AFTER_READY: Duration = Duration::from_secs(30);

pub(crate) async fn run(command: &VmCommand, token: Option<String>) -> anyhow::Result<u8> {
    let launcher = launcher()?;
    match command {
        VmCommand::Run(args) => vm_run(&launcher, args, token).await,
        VmCommand::Start(args) => vm_start(&launcher, args).await,
        VmCommand::Ls(args) => vm_ls(&launcher, args),
        VmCommand::Stop(args) => vm_stop(&launcher, args, token).await,
        VmCommand::Checkpoint(args) => snapshot::checkpoint(&launcher, args).await,
        VmCommand::Branch(args) => snapshot::branch(&launcher, args).await,
        VmCommand::Fork(args) => snapshot::fork(&launcher, args).await,
        VmCommand::Checkpoints(args) => snapshot::list(&launcher, args),
        VmCommand::RmCheckpoint(args) => snapshot::remove(&launcher, args),
        VmCommand::Hibernate(args) => snapshot::hibernate(&launcher, args).await,
        VmCommand::Wake(args) => snapshot::wake(&launcher, args).await,
        VmCommand::Promote(args) => snapshot::promote(&launcher, args).await,
        VmCommand::EgressLog(args) => egress_log(&launcher, args),
    }
}

fn launcher() -> anyhow::Result<Launcher> {
    Ok(Launcher::new(
        LauncherConfig::from_env().context("Cannot configure the launcher")?,
    ))
}

/// Exit code when the VM behind `--vm ID` is no longer running (its guest powered off
/// or panicked): apart from 1 (the tool failed) and from the command's own codes.
pub(crate) const EXIT_VM_GONE: u8 = 125;

/// Console lines quoted when a VM is found stopped.
const GONE_CONSOLE_LINES: usize = 12;

/// The VM behind `--vm ID` stopped; says how and quotes its console.
#[derive(Debug, thiserror::Error)]
#[error("VM {id} is not running: {end}. The last console lines:\n{console}")]
pub(crate) struct VmGone {
    id: String,
    end: GuestEnd,
    console: String,
}

/// Turns `error` (from a command on VM `id`) into a [`VmGone`] when the VM has
/// stopped, so the report names the cause rather than a lost connection.
pub(crate) fn explain_failure(id: &str, error: anyhow::Error) -> anyhow::Error {
    let id = vm_name(id);
    let Ok(launcher) = launcher() else {
        return error;
    };
    let Ok(entries) = launcher.list() else {
        return error;
    };
    match entries.into_iter().find(|entry| entry.name == id) {
        Some(entry) if entry.status != VmStatus::Running => {
            let report = PostMortem::read(&entry.path);
            anyhow::Error::new(VmGone {
                id: id.to_owned(),
                end: report.end,
                console: report.excerpt(GONE_CONSOLE_LINES),
            })
            .context(format!("{error:#}"))
        }
        _ => error,
    }
}

/// The prefix of a sandbox id as `sandbox-mcp` shows it: `sbx-` and the VM's id.
const SANDBOX_ID_PREFIX: &str = "sbx-";

/// The VM id a command-line id names: a VM id as `vm ls` shows it, or the sandbox
/// id `sandbox-mcp` gives the same VM (`sbx-ID`), so both front ends share one id
/// space. (The launcher's ids are hex, so none begins with the prefix.)
pub(crate) fn vm_name(id: &str) -> &str {
    id.strip_prefix(SANDBOX_ID_PREFIX).unwrap_or(id)
}

/// A VM id from the command line (either form of [`vm_name`]).
pub(crate) fn parse_vm_id(id: &str) -> anyhow::Result<VmId> {
    vm_name(id)
        .parse()
        .with_context(|| format!("Bad VM id {id:?}"))
}

/// Wakes VM `id` first when it is hibernated (`vm hibernate`), so `--vm ID` works on
/// it as on a running VM.
pub(crate) async fn wake_if_hibernated(id: &str) -> anyhow::Result<()> {
    let id = vm_name(id);
    let launcher = launcher()?;
    // A VM being woken by another process (its lock held, maybe its QEMU up) still
    // says so in its record: the wake below waits for that one and shares its result.
    let hibernated = launcher.list()?.into_iter().any(|entry| {
        entry.name == id
            && (entry.status == VmStatus::Hibernated
                || entry.record.is_some_and(|r| r.hibernation.is_some()))
    });
    if !hibernated {
        return Ok(());
    }
    let vm_id = parse_vm_id(id)?;
    let wake = launcher
        .wake(&vm_id)
        .await
        .with_context(|| format!("Cannot wake VM {id}"))?;
    tracing::info!(id, took = ?wake.took, "woke a hibernated VM");
    Ok(())
}

/// Where VM `id`'s agent listens and the token it requires, from its run folder.
pub(crate) fn agent_address(id: &str) -> anyhow::Result<(String, Option<String>)> {
    let id = vm_name(id);
    let launcher = launcher()?;
    let entry = launcher
        .list()?
        .into_iter()
        .find(|entry| entry.name == id)
        .with_context(|| format!("No VM with id {id}; `sandboxctl vm ls` lists them"))?;
    let token = entry.token();
    let record = entry
        .record
        .with_context(|| format!("VM {id} has no readable vm.json"))?;
    Ok((record.agent_url, token))
}

/// The template `--template` names: an image reference (`oci://…`, `python:3.12`)
/// becomes the template built from it, held already or built now when
/// `--allow-registry` allows its registry (the engine's claim-time build, with its
/// progress on stderr); anything else as given.
async fn boot_template(launcher: &Launcher, args: &VmBootArgs) -> anyhow::Result<TemplateRef> {
    let held = |text: &str| launcher.template(&TemplateRef::parse(text)).is_ok();
    if !sandbox_engine::image_build::is_reference(&args.template, held) {
        return Ok(TemplateRef::parse(&args.template));
    }
    let config = launcher.config();
    let builds = sandbox_engine::image_build::ImageBuilds::new(
        args.registry.policy()?,
        config.home.root().to_owned(),
        config.templates_root(),
    );
    let progress = sandbox_engine::image_build::BuildProgress(std::sync::Arc::new(|line: &str| {
        eprintln!("sandboxctl: {line}")
    }));
    let name = tokio::select! {
        name = builds.resolve(&args.template, Some(&progress)) => name?,
        signal = terminating_signal() => bail!("Interrupted by {signal} while building the template"),
    };
    Ok(TemplateRef::Name(name))
}

fn boot_spec(args: &VmBootArgs, template: TemplateRef, detached: bool) -> anyhow::Result<BootSpec> {
    let size = match &args.size {
        Some(name) => Some(Size::preset(name).with_context(|| {
            format!("Unknown size {name:?}: use small, medium, large, xlarge or 2xlarge")
        })?),
        None => None,
    };
    let net = match (args.net, args.allow.is_empty()) {
        (NetMode::None, true) => Net::None,
        (NetMode::None, false) => bail!("--allow needs --net egress"),
        (NetMode::Egress, true) => {
            bail!("--net egress needs at least one --allow (an empty allowlist allows nothing)")
        }
        (NetMode::Egress, false) => Net::Egress(Policy::new(Allowlist::parse(&args.allow)?)),
    };
    Ok(BootSpec {
        size,
        net,
        ready_timeout: seconds("--boot-timeout", args.boot_timeout)?,
        detached,
        transport: args.transport,
        cold: args.cold,
        ..BootSpec::new(template)
    })
}

/// `vm egress-log ID`: a table, or the stored JSON lines.
fn egress_log(launcher: &Launcher, args: &VmEgressLogArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let records = launcher.egress_log(&id, args.tail)?;
    if args.json {
        for record in &records {
            print_json_line(record)?;
        }
        return Ok(0);
    }
    println!(
        "{:<24} {:<8} {:<40} {:<22} {:>10} {:>10} {:>8}  REASON",
        "TIME", "VERDICT", "DESTINATION", "ADDRESS", "OUT", "IN", "MS"
    );
    for r in &records {
        let verdict = match r.verdict {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::Failed => "failed",
            Verdict::Refused => "refused",
        };
        let destination = if r.port == 0 {
            "-".to_owned()
        } else {
            format!("{}:{}", r.host, r.port)
        };
        println!(
            "{:<24} {:<8} {:<40} {:<22} {:>10} {:>10} {:>8}  {}",
            utc(r.time_unix_ms),
            verdict,
            destination,
            r.address.as_deref().unwrap_or("-"),
            r.bytes_out,
            r.bytes_in,
            r.duration_ms,
            r.reason.as_deref().unwrap_or(""),
        );
    }
    Ok(0)
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the civil-from-days
/// algorithm of Howard Hinnant's date library).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ms % 1000
    )
}

async fn connect(vm: &Vm, token: Option<String>) -> anyhow::Result<Client> {
    let opts = ConnectOptions {
        token,
        connect_timeout: CONNECT_AFTER_READY,
    };
    vm.client(&opts)
        .await
        .with_context(|| format!("Cannot reach the agent of VM {}", vm.id()))
}

async fn vm_run(
    launcher: &Launcher,
    args: &VmRunArgs,
    token: Option<String>,
) -> anyhow::Result<u8> {
    let template = boot_template(launcher, &args.boot).await?;
    let spec = boot_spec(&args.boot, template, false)?;
    // A signal while booting drops the boot, which stops everything it started.
    let vm = tokio::select! {
        vm = launcher.boot(spec) => vm.context("Cannot boot the VM")?,
        signal = terminating_signal() => bail!("Interrupted by {signal} while booting"),
    };
    tracing::info!(id = %vm.id(), boot = ?vm.boot_duration(), "VM ready");
    let result = match connect(&vm, token).await {
        Ok(client) => {
            let spec = process_spec(Cmd::Argv(args.command.clone()), args.process.clone());
            // SIGTERM or SIGHUP ends the command and the VM like the end of the
            // command would: the VM is shut down and its run folder removed.
            // (Ctrl-C is the exec's own: it cancels the command, exiting 130.)
            let code = tokio::select! {
                code = exec::exec(&client, spec, &args.run) => code,
                signal = termination_request() => {
                    eprintln!("sandboxctl: {signal}: stopping the VM");
                    Ok(EXIT_SIGNALLED)
                }
            };
            let shutdown = async {
                if let Err(error) = client.shutdown(false).await {
                    tracing::warn!(%error, "the guest did not accept the shutdown");
                }
            };
            if let Err(error) = vm.shutdown_with(GUEST_SHUTDOWN_GRACE, shutdown).await {
                eprintln!("sandboxctl: stopping the VM: {error:#}");
            }
            code
        }
        Err(error) => {
            let _ = vm.shutdown(Duration::from_secs(1)).await;
            Err(error)
        }
    };
    result
}

async fn vm_start(launcher: &Launcher, args: &VmBootArgs) -> anyhow::Result<u8> {
    let spec = boot_spec(args, boot_template(launcher, args).await?, true)?;
    let vm = tokio::select! {
        vm = launcher.boot(spec) => vm.context("Cannot boot the VM")?,
        signal = terminating_signal() => bail!("Interrupted by {signal} while booting"),
    };
    let boot = vm.boot_duration();
    let record = match vm.detach() {
        Ok(record) => record,
        Err(_) => bail!("The VM could not be detached"),
    };
    output::print(&format!("{}\t{}\n", record.id, record.agent_url))?;
    eprintln!(
        "booted in {:.2}s ({:?}); use --vm {} with other commands, `sandboxctl vm stop {}` to end it",
        boot.as_secs_f64(),
        record.accel,
        record.id,
        record.id
    );
    Ok(0)
}

#[derive(Serialize)]
struct VmView {
    id: String,
    status: VmStatus,
    template: Option<String>,
    agent_url: Option<String>,
    vcpus: Option<u16>,
    memory_mib: Option<u32>,
    created_at_unix_ms: Option<u64>,
    /// From the engine's record (`sandbox.json`), the same file a node daemon
    /// re-adopts from: which sandbox the VM is, who holds it, until when. Never its
    /// token.
    sandbox_id: Option<String>,
    held_by: Option<&'static str>,
    deadline_unix_ms: Option<u64>,
}

fn vm_ls(launcher: &Launcher, args: &VmLsArgs) -> anyhow::Result<u8> {
    // Dead VMs (owner and QEMU gone) are removed, not listed: a home nobody boots
    // from again would keep them forever otherwise.
    if let Err(error) = launcher.sweep() {
        tracing::warn!(error = %error, "sweep of stale run folders failed");
    }
    let views: Vec<VmView> = launcher
        .list()?
        .into_iter()
        .map(|entry| {
            let held = match sandbox_engine::record::read(&entry.path) {
                Ok(record) => record,
                Err(error) => {
                    tracing::warn!(error = %sandbox_vmm::error_chain(&error), "unreadable sandbox record");
                    None
                }
            };
            let claim = held.as_ref().and_then(|r| r.claim.as_ref());
            VmView {
            sandbox_id: claim.map(|c| c.id.clone()),
            held_by: held.as_ref().map(|r| r.owner.kind.as_str()),
            deadline_unix_ms: claim.map(|c| c.deadline_unix_ms),
            id: entry.name,
            status: entry.status,
            template: entry.record.as_ref().map(|r| r.template.clone()),
            agent_url: entry.record.as_ref().map(|r| r.agent_url.clone()),
            vcpus: entry.record.as_ref().map(|r| r.size.vcpus),
            memory_mib: entry.record.as_ref().map(|r| r.size.memory_mib),
            created_at_unix_ms: entry.record.as_ref().map(|r| r.created_at_unix_ms),
        }})
        .collect();
    if args.json {
        print_json_line(&views)?;
        return Ok(0);
    }
    let mut table = format!(
        "{:<14}{:<11}{:<12}{:<6}{:<8}{:<10}{:<22}AGENT\n",
        "ID", "STATUS", "TEMPLATE", "CPUS", "MEMORY", "HELD BY", "DEADLINE"
    );
    for view in views {
        let deadline = view.deadline_unix_ms.map_or("-".to_owned(), |ms| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            humantime::format_rfc3339_seconds(at).to_string()
        });
        let held_by = match (view.held_by, &view.sandbox_id) {
            (Some(kind), Some(_)) => kind.to_owned(),
            (Some(kind), None) => format!("{kind}:warm"),
            (None, _) => "-".to_owned(),
        };
        table.push_str(&format!(
            "{:<14}{:<11}{:<12}{:<6}{:<8}{:<10}{:<22}{}\n",
            view.id,
            serde_json::to_value(view.status)?.as_str().unwrap_or("?"),
            view.template.as_deref().unwrap_or("-"),
            view.vcpus.map_or("-".into(), |v| v.to_string()),
            view.memory_mib.map_or("-".into(), |m| format!("{m}M")),
            held_by,
            deadline,
            view.agent_url.as_deref().unwrap_or("-"),
        ));
    }
    output::print(&table)?;
    Ok(0)
}

async fn vm_stop(
    launcher: &Launcher,
    args: &VmStopArgs,
    token: Option<String>,
) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let grace = seconds("--grace", args.grace)?;
    // Ask the guest to power off first, so its processes get SIGTERM, and give QEMU
    // the grace period to exit by itself; the launcher then stops what is left.
    let started = tokio::time::Instant::now();
    let powered_off = match ask_guest_to_power_off(id.as_str(), token).await {
        true => wait_until_not_running(launcher, &id, started + grace).await,
        false => false,
    };
    let outcome = launcher
        .stop(
            &id,
            grace
                .saturating_sub(started.elapsed())
                .max(Duration::from_secs(1)),
        )
        .await
        .with_context(|| format!("Cannot stop VM {id}"))?;
    match (powered_off, outcome) {
        (true, _) => eprintln!("VM {id} powered off"),
        (false, StopOutcome::Exited(status)) => eprintln!("VM {id} powered off ({status})"),
        (false, other) => eprintln!("VM {id} stopped: {other:?}"),
    }
    Ok(0)
}

/// True when the guest's agent accepted a shutdown request.
async fn ask_guest_to_power_off(id: &str, token: Option<String>) -> bool {
    let Ok((url, vm_token)) = agent_address(id) else {
        return false;
    };
    let Ok(url) = url.parse::<AgentUrl>() else {
        return false;
    };
    let opts = ConnectOptions {
        token: token.or(vm_token),
        connect_timeout: Duration::from_secs(2),
    };
    match Client::connect(&url, &opts).await {
        Ok(client) => client.shutdown(false).await.is_ok(),
        Err(_) => false,
    }
}

/// Polls until VM `id`'s QEMU is no longer running, or the deadline.
async fn wait_until_not_running(
    launcher: &Launcher,
    id: &VmId,
    deadline: tokio::time::Instant,
) -> bool {
    while tokio::time::Instant::now() < deadline {
        let running = launcher.list().is_ok_and(|entries| {
            entries
                .iter()
                .any(|e| e.name == id.as_str() && e.status == VmStatus::Running)
        });
        if !running {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_log_times_are_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_796_102_400_123), "2026-12-01T05:20:00.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn a_sandbox_id_names_its_vm() {
        assert_eq!(vm_name("sbx-6df9f06540c1"), "6df9f06540c1");
        assert_eq!(vm_name("6df9f06540c1"), "6df9f06540c1");
        assert_eq!(
            parse_vm_id("sbx-6df9f06540c1").unwrap().as_str(),
            "6df9f06540c1"
        );
        assert!(parse_vm_id("sbx-").is_err(), "no VM id after the prefix");
    }
}
