//! Snapshots of sandboxes: fork, checkpoint, branch, list and delete checkpoints,
//! hibernate and promote, over the launcher's snapshots
//! (`sandbox_vmm::launcher::snapshot`).
//!
//! # What belongs to whom
//! - **Fork and branch children** are sandboxes of the node like any claim: own ids
//!   and tokens, a one-hour deadline. Each takes a capacity slot within the node's
//!   limit; all are taken before anything starts, so a fork that does not fit is
//!   refused with nothing evicted.
//! - **Checkpoints** are the host's (`SANDBOX_HOME/checkpoints`): they outlive the
//!   node's process, and a branch takes any id or name the store holds, whoever made
//!   it. A fork's own checkpoint is ephemeral: the launcher removes it once no VM maps
//!   it, and the node deletes its forks' at shutdown.
//! - **Promoted templates** are the host's (`SANDBOX_HOME/templates/NAME`).
//! - **Hibernation** is a state of the sandbox (`crate::sandbox`): the
//!   [`SnapshotHost`] is its [`Hibernator`], so whatever next reaches the guest wakes
//!   it.
//!
//! # Layout
//! - this file: [`SnapshotHost`] (the launcher, the pool, the fork limit) and its
//!   [`Hibernator`] implementation.
//! - [`ops`]: the operations, as methods of [`crate::node::Node`], and their results.
//! - [`templates`]: deleting a promoted template.
//! - [`digest`]: a promoted template's content digest.

pub mod digest;
pub mod ops;
pub mod templates;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sandbox_vmm::launcher::snapshot::{BranchSpec, NotHibernated, SnapshotError};
use sandbox_vmm::launcher::{Launcher, VmId};

use crate::pool::launcher::{LaunchedVm, LauncherFactory};
use crate::pool::{Lease, Pool};
use crate::sandbox::{BoxFuture, HibernateError, Hibernator, Image, NotSlept, WakeError};
use crate::util::lock;

/// How long a discarded image's QEMU may take to stop: none runs (it is asleep).
const DISCARD_GRACE_MS: u64 = 0;

/// What snapshot operations run on: the pool (capacity slots, its launcher), the
/// fork limit, and this session's forks' checkpoints.
#[derive(Debug)]
pub struct SnapshotHost {
    pool: Arc<Pool<LauncherFactory>>,
    max_fork_count: usize,
    /// Ephemeral checkpoints of this session's forks, deleted at shutdown (the
    /// launcher would only sweep them at some later boot).
    fork_checkpoints: Mutex<Vec<String>>,
}

impl SnapshotHost {
    /// Snapshots over `pool`'s launcher and capacity.
    pub fn new(pool: Arc<Pool<LauncherFactory>>, max_fork_count: usize) -> Self {
        Self {
            pool,
            max_fork_count,
            fork_checkpoints: Mutex::new(Vec::new()),
        }
    }

    /// The launcher.
    pub fn launcher(&self) -> &Launcher {
        self.pool.factory().launcher()
    }

    /// The pool, for capacity slots.
    pub fn pool(&self) -> &Pool<LauncherFactory> {
        &self.pool
    }

    /// `--max-fork-count`.
    pub fn max_fork_count(&self) -> usize {
        self.max_fork_count
    }

    /// How children are started: held as the pool's VMs are (a node daemon's are
    /// detached, an embedded engine's die with it), each given a boot timeout to
    /// answer.
    pub fn branch_spec(&self) -> BranchSpec {
        BranchSpec {
            detached: self.pool.factory().detached(),
            ready_timeout: self.pool.boot_timeout(),
        }
    }

    /// Notes a fork's checkpoint, to delete at shutdown.
    pub fn remember_fork(&self, checkpoint_id: &str) {
        lock(&self.fork_checkpoints).push(checkpoint_id.to_owned());
    }

    /// Deletes this session's forks' checkpoints; call once the sandboxes are
    /// destroyed (one a VM still maps is refused by the launcher and left to its
    /// sweep).
    pub fn shutdown(&self) {
        let ids = std::mem::take(&mut *lock(&self.fork_checkpoints));
        for id in ids {
            match self.launcher().delete_checkpoint(&id) {
                Ok(_) => tracing::debug!(checkpoint = %id, "fork checkpoint deleted"),
                Err(error) => tracing::debug!(checkpoint = %id, %error, "fork checkpoint kept"),
            }
        }
    }
}

impl Hibernator<LaunchedVm> for SnapshotHost {
    fn hibernate(
        &self,
        lease: Lease<LaunchedVm>,
    ) -> BoxFuture<'_, Result<Image, NotSlept<LaunchedVm>>> {
        Box::pin(async move {
            let (launched, slot) = lease.into_parts();
            let LaunchedVm { vm, url, client } = launched;
            let vm_id = vm.id().to_string();
            match self.launcher().hibernate_owned(vm).await {
                Ok(done) => {
                    // Its memory is free: so is its slot.
                    drop(client);
                    drop(slot);
                    Ok(Image {
                        vm_id,
                        at: SystemTime::now(),
                        took: done.took,
                        bytes_on_disk: done.bytes_on_disk,
                    })
                }
                Err(refused) => {
                    let NotHibernated { error, vm } = *refused;
                    // A failed capture resumed the VM: its relay and connection are
                    // as they were.
                    let lease = vm.map(|vm| Lease::new(LaunchedVm { vm, url, client }, slot));
                    let error = HibernateError::Capture {
                        lost: lease.is_none(),
                        error: Box::new(error),
                    };
                    Err(NotSlept { error, lease })
                }
            }
        })
    }

    fn wake<'a>(&'a self, image: &'a Image) -> BoxFuture<'a, Result<Lease<LaunchedVm>, WakeError>> {
        Box::pin(async move {
            let restore =
                |error: Box<dyn std::error::Error + Send + Sync>| WakeError::Restore(error);
            let id: VmId = image.vm_id.parse().map_err(|e| restore(Box::new(e)))?;
            let slot = self
                .pool
                .slots(1)
                .await
                .map_err(|error| WakeError::Capacity(Box::new(error)))?
                .pop()
                .ok_or_else(|| WakeError::Capacity("no slot was handed out".into()))?;
            let vm = match self.launcher().wake_owned(&id).await {
                Ok(vm) => vm,
                // Woken meanwhile by someone else (`sandboxctl --vm ID`, `vm wake`):
                // the run folder's record says it runs, detached; use that VM rather
                // than insist it sleeps.
                Err(SnapshotError::NotHibernated { .. }) => {
                    let vm = self
                        .launcher()
                        .adopt(&id)
                        .map_err(|e| restore(Box::new(e)))?;
                    tracing::info!(vm = %id, "woken by another process; adopted it");
                    vm
                }
                Err(error) => return Err(restore(Box::new(error))),
            };
            let vm = LaunchedVm::connect(vm)
                .await
                .map_err(|e| restore(Box::new(e)))?;
            Ok(Lease::new(vm, slot))
        })
    }

    fn discard(&self, image: Image) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Ok(id) = image.vm_id.parse::<VmId>() else {
                return;
            };
            let grace = Duration::from_millis(DISCARD_GRACE_MS);
            match self.launcher().stop(&id, grace).await {
                Ok(_) => tracing::info!(vm = %id, "hibernated VM's image removed"),
                Err(error) => tracing::warn!(vm = %id, %error, "cannot remove a hibernated VM"),
            }
        })
    }
}
