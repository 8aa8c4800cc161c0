//! A node daemon's start: what its earlier life left in the run folders.
//!
//! A daemon's VMs are detached (see `crate::record`), so a daemon killed with
//! `kill -9`, or stopped gracefully, leaves them behind with their records. Before
//! its pool boots anything, the next start looks at every run folder whose
//! `sandbox.json` says a node holds it:
//! - **claimed, running**: adopted (`Launcher::adopt`) into a capacity slot, with its
//!   id, token, deadline, template, size and lineage from the record; its processes
//!   and files are untouched (nothing in the guest is restarted);
//! - **claimed, hibernated**: registered asleep; the next agent connection wakes it;
//! - **claimed, past its deadline** (it ran out while no node watched): destroyed;
//! - **claimed, dead** (QEMU gone, not hibernated): its run folder, RAM file and
//!   record are removed, and the log says so;
//! - **moved** (handed to another node of a fleet, `crate::moving`): removed;
//! - **unclaimed** (a warm VM of the pool): stopped, so none leaks; the new pool
//!   boots its own;
//! - **a record that cannot be read** (corrupt, wrong mode, another version): logged
//!   and skipped, the VM left as it is.
//!
//! Records of embedded engines (their VMs die with them) and run folders without a
//! record (`sandboxctl vm start`) are not this node's and are left alone.

use std::time::{Duration, SystemTime};

use sandbox_vmm::client::{AgentUrl, ConnectOptions};
use sandbox_vmm::launcher::run_dir::{read_token, RunDirEntry};
use sandbox_vmm::launcher::{VmId, VmStatus};

use crate::node::{sandbox_id_of, Node};
use crate::pool::launcher::{LaunchedVm, LauncherFactory, VM_STOP_GRACE_MS};
use crate::pool::{Lease, Pool};
use crate::record::{self, ClaimRecord, Owner, OwnerKind};
use crate::sandbox::{Backing, Claim, Deadline, Image, Sandbox, SandboxId};
use crate::snapshot::SnapshotHost;
use crate::token::SandboxToken;

/// What became of one run folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A running sandbox, adopted.
    Adopted,
    /// A hibernated sandbox, registered asleep.
    Asleep,
    /// Past its deadline: destroyed.
    Expired,
    /// Its QEMU was gone: cleaned up.
    Dead,
    /// A warm VM of an earlier life: stopped.
    WarmStopped,
    /// Not adopted (see the log for why).
    Skipped,
}

/// Counts for the summary line.
#[derive(Debug, Default)]
struct Tally {
    adopted: usize,
    asleep: usize,
    expired: usize,
    dead: usize,
    warm_stopped: usize,
    skipped: usize,
}

impl Tally {
    fn add(&mut self, found: Found) {
        let slot = match found {
            Found::Adopted => &mut self.adopted,
            Found::Asleep => &mut self.asleep,
            Found::Expired => &mut self.expired,
            Found::Dead => &mut self.dead,
            Found::WarmStopped => &mut self.warm_stopped,
            Found::Skipped => &mut self.skipped,
        };
        *slot += 1;
    }
}

impl Node {
    /// Re-adopts what an earlier life of this node left (see the module docs).
    pub(crate) async fn adopt_leftovers(&self) {
        let (Some(pool), Some(snapshots)) = (self.pool(), self.snapshots()) else {
            return;
        };
        let launcher = pool.factory().launcher();
        let entries = match launcher.list() {
            Ok(entries) => entries,
            Err(error) => {
                tracing::error!(error = %sandbox_vmm::error_chain(&error), "cannot list run folders: nothing re-adopted");
                return;
            }
        };
        let mut tally = Tally::default();
        for entry in entries {
            let record = match record::read(&entry.path) {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(
                        folder = %entry.path.display(),
                        error = %sandbox_vmm::error_chain(&error),
                        "skipping a sandbox record that cannot be used; its VM is left as it is"
                    );
                    tally.add(Found::Skipped);
                    continue;
                }
            };
            if record.owner.kind != OwnerKind::Node {
                continue;
            }
            let Ok(vm_id) = entry.name.parse::<VmId>() else {
                continue;
            };
            let found = match record.claim {
                None => {
                    stop(pool, &vm_id, "a warm VM of an earlier life of this node").await;
                    Found::WarmStopped
                }
                Some(claim) => {
                    self.adopt_claimed(pool, snapshots, &vm_id, &entry, claim)
                        .await
                }
            };
            tally.add(found);
        }
        tracing::info!(
            adopted = tally.adopted,
            hibernated = tally.asleep,
            expired = tally.expired,
            dead = tally.dead,
            warm_stopped = tally.warm_stopped,
            skipped = tally.skipped,
            "re-adoption of an earlier life's sandboxes done"
        );
    }

    pub(crate) async fn adopt_claimed(
        &self,
        pool: &Pool<LauncherFactory>,
        snapshots: &std::sync::Arc<SnapshotHost>,
        vm_id: &VmId,
        entry: &RunDirEntry,
        claim: ClaimRecord,
    ) -> Found {
        let id = sandbox_id_of(vm_id.as_str());
        if entry.path.join(crate::moving::MOVED_FILE).exists() {
            tracing::info!(sandbox = %id, "handed to another node before this node stopped: its run folder is removed");
            stop(pool, vm_id, "moved").await;
            return Found::Dead;
        }
        if claim.id != id.as_str() {
            tracing::warn!(folder = %entry.path.display(), recorded = %claim.id, "the record names another sandbox than its folder; skipped");
            return Found::Skipped;
        }
        let Some(token) = SandboxToken::from_record(&claim.token) else {
            tracing::warn!(sandbox = %id, "the record's token is malformed; skipped");
            return Found::Skipped;
        };
        if claim.deadline() <= SystemTime::now() {
            tracing::warn!(sandbox = %id, "its deadline passed while no node ran: destroying it and its files");
            stop(pool, vm_id, "expired").await;
            return Found::Expired;
        }
        let (agent, backing, found) = match entry.status {
            VmStatus::Running => {
                let vm = match pool.factory().launcher().adopt(vm_id) {
                    Ok(vm) => vm,
                    Err(error) => {
                        tracing::warn!(sandbox = %id, error = %sandbox_vmm::error_chain(&error), "cannot adopt its VM; skipped");
                        return Found::Skipped;
                    }
                };
                let slot = match pool.slots(1).await.map(|mut slots| slots.pop()) {
                    Ok(Some(slot)) => slot,
                    other => {
                        let why = other.err().map(|e| e.to_string()).unwrap_or_default();
                        tracing::error!(sandbox = %id, %why, "no capacity to adopt it: left running, not served; raise --max-sandboxes or stop it with `sandboxd stop-all`");
                        // Let go, not killed: the user's sandbox is not lost.
                        let _ = vm.detach();
                        return Found::Skipped;
                    }
                };
                let launched = match LaunchedVm::connect(vm).await {
                    Ok(launched) => launched,
                    Err(error) => {
                        // `connect` stopped it: a VM whose agent does not answer is
                        // of no use to anyone, and nobody else would stop it.
                        tracing::warn!(sandbox = %id, error = %sandbox_vmm::error_chain(&error), "its agent did not answer: destroyed");
                        return Found::Dead;
                    }
                };
                let agent = (
                    launched.url.clone(),
                    launched
                        .vm
                        .connect_options(ConnectOptions::default().connect_timeout),
                    Some(launched.client.clone()),
                );
                let lease = Lease::new(launched, slot);
                (
                    agent,
                    Backing::hibernating(lease, snapshots.clone()),
                    Found::Adopted,
                )
            }
            VmStatus::Hibernated => {
                let url = entry
                    .record
                    .as_ref()
                    .and_then(|r| r.agent_url.parse::<AgentUrl>().ok());
                let (Some(url), Some(vm_token)) = (url, read_token(&entry.path)) else {
                    tracing::warn!(sandbox = %id, "its hibernated VM's record or token is unreadable; skipped");
                    return Found::Skipped;
                };
                let options = ConnectOptions {
                    token: Some(vm_token),
                    ..ConnectOptions::default()
                };
                let image = Image {
                    vm_id: vm_id.to_string(),
                    at: SystemTime::now(),
                    took: Duration::ZERO,
                    bytes_on_disk: 0,
                };
                (
                    (url, options, None),
                    Backing::asleep(image, snapshots.clone()),
                    Found::Asleep,
                )
            }
            VmStatus::Stale => {
                tracing::warn!(sandbox = %id, "its QEMU is gone (the guest powered off or crashed while no node ran): removing its run folder, RAM file and record");
                stop(pool, vm_id, "dead").await;
                return Found::Dead;
            }
            VmStatus::Busy => {
                tracing::warn!(sandbox = %id, "another process holds its run folder; skipped");
                return Found::Skipped;
            }
        };
        let deadline = Deadline::at(claim.deadline());
        let sandbox = Sandbox::new(
            SandboxId::new(claim.id.clone()),
            Claim {
                template: claim.template.clone(),
                size: Some(claim.size),
                deadline: Some(deadline),
                warm: claim.warm,
                duration: Duration::ZERO,
                lineage: claim.lineage.lineage(),
                token,
            },
            agent,
            backing,
        )
        .with_record(entry.path.clone(), Owner::this(OwnerKind::Node))
        .with_claimed_at(claim.claimed_at());
        // The holder's pid is this life's now.
        if let Err(error) = sandbox.persist() {
            tracing::warn!(sandbox = %id, error = %sandbox_vmm::error_chain(&error), "cannot rewrite its record");
        }
        match self.registry.insert(sandbox).await {
            Ok(sandbox) => {
                tracing::info!(sandbox = %sandbox.id, state = ?found, template = %sandbox.template, "re-adopted");
                found
            }
            Err(_) => Found::Skipped,
        }
    }
}

/// Stops VM `vm_id` and removes its run folder (record and RAM file with it).
async fn stop(pool: &Pool<LauncherFactory>, vm_id: &VmId, what: &str) {
    let grace = Duration::from_millis(VM_STOP_GRACE_MS);
    match pool.factory().launcher().stop(vm_id, grace).await {
        Ok(outcome) => tracing::info!(vm = %vm_id, what, ?outcome, "stopped and removed"),
        Err(error) => {
            tracing::warn!(vm = %vm_id, what, error = %sandbox_vmm::error_chain(&error), "cannot stop it")
        }
    }
}
