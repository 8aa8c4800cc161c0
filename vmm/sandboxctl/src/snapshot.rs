//! `vm checkpoint|branch|fork|checkpoints|rm-checkpoint`: snapshots through the
//! launcher (`sandbox_vmm::launcher::snapshot`).

use anyhow::{bail, Context};
use serde::Serialize;

use sandbox_vmm::launcher::snapshot::{BranchSpec, CaptureMethod, CheckpointInfo, CheckpointSpec};
use sandbox_vmm::launcher::{Launcher, Vm};

use crate::args::{
    CaptureMethodArg, ChildrenArgs, VmBranchArgs, VmCheckpointArgs, VmForkArgs, VmIdArgs, VmLsArgs,
    VmPromoteArgs, VmRmCheckpointArgs,
};
use crate::output::{self, print_json_line};
use crate::run::seconds;
use crate::vm::{parse_vm_id, terminating_signal};

pub(crate) async fn checkpoint(launcher: &Launcher, args: &VmCheckpointArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let spec = CheckpointSpec {
        name: args.name.clone(),
        ephemeral: false,
        method: match args.method {
            CaptureMethodArg::Auto => CaptureMethod::Auto,
            CaptureMethodArg::Paused => CaptureMethod::Paused,
            CaptureMethodArg::Live => CaptureMethod::Live,
        },
        incremental: !args.full,
    };
    let checkpoint = launcher
        .checkpoint(&id, spec)
        .await
        .with_context(|| format!("Cannot checkpoint VM {id}"))?;
    let view = CheckpointView::of(&checkpoint.manifest, Vec::new());
    if args.json {
        print_json_line(&view)?;
    } else {
        output::print(&format!("{}\n", checkpoint.manifest.id))?;
        eprintln!(
            "checkpoint of VM {id}: paused {} ms, {} in all; device state {}, RAM {} on disk",
            checkpoint.pause.as_millis(),
            humantime_ms(checkpoint.total.as_millis()),
            bytes(checkpoint.manifest.state_bytes),
            bytes(checkpoint.manifest.ram_bytes)
        );
    }
    Ok(0)
}

pub(crate) async fn branch(launcher: &Launcher, args: &VmBranchArgs) -> anyhow::Result<u8> {
    let spec = branch_spec(&args.children)?;
    let started = std::time::Instant::now();
    let children = tokio::select! {
        children = launcher.branch(&args.checkpoint, args.children.count, spec) => {
            children.with_context(|| format!("Cannot branch checkpoint {}", args.checkpoint))?
        }
        signal = terminating_signal() => bail!("Interrupted by {signal} while starting"),
    };
    print_children(children, args.children.json, started.elapsed())
}

/// Children are detached: they outlive this command.
fn branch_spec(args: &ChildrenArgs) -> anyhow::Result<BranchSpec> {
    Ok(BranchSpec {
        detached: true,
        ready_timeout: seconds("--boot-timeout", args.boot_timeout)?,
    })
}

pub(crate) async fn fork(launcher: &Launcher, args: &VmForkArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let spec = branch_spec(&args.children)?;
    let fork = tokio::select! {
        fork = launcher.fork(&id, args.children.count, spec) => {
            fork.with_context(|| format!("Cannot fork VM {id}"))?
        }
        signal = terminating_signal() => bail!("Interrupted by {signal} while forking"),
    };
    eprintln!(
        "VM {id} paused {} ms for checkpoint {}",
        fork.checkpoint.pause.as_millis(),
        fork.checkpoint.manifest.id
    );
    print_children(fork.children, args.children.json, fork.total)
}

fn print_children(children: Vec<Vm>, json: bool, took: std::time::Duration) -> anyhow::Result<u8> {
    let count = children.len();
    for vm in children {
        let ready = vm.boot_duration();
        let Ok(record) = vm.detach() else {
            bail!("A VM could not be detached");
        };
        if json {
            print_json_line(&ChildView {
                id: record.id.to_string(),
                agent_url: record.agent_url,
                ready_ms: u64::try_from(ready.as_millis()).unwrap_or(u64::MAX),
            })?;
        } else {
            output::print(&format!("{}\t{}\n", record.id, record.agent_url))?;
        }
    }
    if !json {
        eprintln!(
            "{count} VM(s) answering after {}; use --vm ID with other commands",
            humantime_ms(took.as_millis())
        );
    }
    Ok(0)
}

pub(crate) fn list(launcher: &Launcher, args: &VmLsArgs) -> anyhow::Result<u8> {
    let all = launcher.checkpoints().context("Cannot list checkpoints")?;
    if args.json {
        for info in &all {
            print_json_line(&CheckpointView::of(&info.manifest, info.users.clone()))?;
        }
        return Ok(0);
    }
    output::print("ID\tNAME\tVM\tTEMPLATE\tPAUSE\tRAM\tUSED BY\n")?;
    for CheckpointInfo {
        manifest, users, ..
    } in &all
    {
        let name = match (&manifest.name, manifest.ephemeral) {
            (Some(name), _) => name.clone(),
            (None, true) => "(fork)".to_owned(),
            (None, false) => "-".to_owned(),
        };
        output::print(&format!(
            "{}\t{}\t{}\t{}\t{} ms\t{}\t{}\n",
            manifest.id,
            name,
            manifest.source_vm,
            manifest.machine.template,
            manifest.pause_ms,
            match &manifest.ram_base {
                // An incremental image: what it keeps, and of what.
                Some(base) => format!(
                    "{} (changes since {base})",
                    bytes(manifest.ram_bytes + manifest.state_bytes)
                ),
                None => bytes(manifest.ram_bytes + manifest.state_bytes),
            },
            if users.is_empty() {
                "-".to_owned()
            } else {
                users.join(", ")
            }
        ))?;
    }
    Ok(0)
}

pub(crate) fn remove(launcher: &Launcher, args: &VmRmCheckpointArgs) -> anyhow::Result<u8> {
    let manifest = launcher
        .delete_checkpoint(&args.checkpoint)
        .with_context(|| format!("Cannot delete checkpoint {}", args.checkpoint))?;
    eprintln!("deleted checkpoint {}", manifest.id);
    Ok(0)
}

pub(crate) async fn hibernate(launcher: &Launcher, args: &VmIdArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let done = launcher
        .hibernate(&id)
        .await
        .with_context(|| format!("Cannot hibernate VM {id}"))?;
    eprintln!(
        "VM {id} hibernated in {}: {} on disk; `--vm {id}` or `sandboxctl vm wake {id}` brings it back",
        humantime_ms(done.took.as_millis()),
        bytes(done.bytes_on_disk)
    );
    Ok(0)
}

pub(crate) async fn wake(launcher: &Launcher, args: &VmIdArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let woken = launcher
        .wake(&id)
        .await
        .with_context(|| format!("Cannot wake VM {id}"))?;
    output::print(&format!(
        "{}\t{}\n",
        woken.record.id, woken.record.agent_url
    ))?;
    eprintln!("VM {id} woken in {}", humantime_ms(woken.took.as_millis()));
    Ok(0)
}

pub(crate) async fn promote(launcher: &Launcher, args: &VmPromoteArgs) -> anyhow::Result<u8> {
    let id = parse_vm_id(&args.id)?;
    let done = launcher
        .promote(&id, &args.name)
        .await
        .with_context(|| format!("Cannot promote VM {id} to template {}", args.name))?;
    output::print(&format!("{}\n", done.dir.display()))?;
    eprintln!(
        "template {} {} from VM {id} (paused {} ms); `sandboxctl vm start -t {}` restores it",
        args.name,
        if done.replaced { "replaced" } else { "made" },
        done.checkpoint.pause.as_millis(),
        args.name
    );
    Ok(0)
}

#[derive(Serialize)]
struct CheckpointView {
    id: String,
    name: Option<String>,
    ephemeral: bool,
    source_vm: String,
    parent: Option<String>,
    template: String,
    created_at_unix_ms: u64,
    pause_ms: u64,
    state_bytes: u64,
    ram_bytes: u64,
    /// The checkpoint an incremental RAM image keeps the differences from.
    #[serde(skip_serializing_if = "Option::is_none")]
    ram_base: Option<String>,
    disk_bytes: u64,
    used_by: Vec<String>,
}

impl CheckpointView {
    fn of(m: &sandbox_vmm::launcher::snapshot::Manifest, used_by: Vec<String>) -> Self {
        Self {
            id: m.id.clone(),
            name: m.name.clone(),
            ephemeral: m.ephemeral,
            source_vm: m.source_vm.clone(),
            parent: m.parent.clone(),
            template: m.machine.template.clone(),
            created_at_unix_ms: m.created_at_unix_ms,
            pause_ms: m.pause_ms,
            state_bytes: m.state_bytes,
            ram_bytes: m.ram_bytes,
            ram_base: m.ram_base.clone(),
            disk_bytes: m.disk_bytes,
            used_by,
        }
    }
}

#[derive(Serialize)]
struct ChildView {
    id: String,
    agent_url: String,
    ready_ms: u64,
}

fn bytes(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // a display figure
    let mib = n as f64 / (1024.0 * 1024.0);
    format!("{mib:.1} MiB")
}

fn humantime_ms(ms: u128) -> String {
    format!("{ms} ms")
}
