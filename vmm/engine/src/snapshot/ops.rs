//! The snapshot operations, as methods of [`Node`]: resolve the sandbox, take
//! capacity, drive the launcher, and make children sandboxes of the node.
//!
//! A sandbox being captured (fork, checkpoint, promote) is held through
//! [`crate::sandbox::Sandbox::running`]: a hibernated one is woken first, and nothing
//! can hibernate or destroy it meanwhile. Capacity for children is taken before
//! anything starts ([`crate::pool::Pool::slots`]), so a fork that does not fit is
//! refused without pausing the parent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_vmm::launcher::snapshot::manifest::check_name;
use sandbox_vmm::launcher::snapshot::{CheckpointSpec, Manifest, SnapshotError};
use sandbox_vmm::launcher::{TemplateRef, Vm, VmId};
use tokio::sync::OwnedSemaphorePermit;

use super::SnapshotHost;
use crate::config::DEFAULT_TTL_SECS;
use crate::error::{
    AdoptError, BranchError, CaptureError, CheckpointError, CheckpointUser, DeleteCheckpointError,
    ForkError, HibernateOpError, ListCheckpointsError, PromoteError,
};
use crate::node::{sandbox_id_of, NewVm, Node};
use crate::pool::launcher::LaunchedVm;
use crate::pool::Lease;
use crate::sandbox::{Image, Lineage, Sandbox, Slept};
use crate::util::millis;

/// What a fork made.
#[derive(Debug)]
pub struct Forked {
    /// The sandbox forked (it runs on).
    pub parent: Arc<Sandbox>,
    /// Its children, each a sandbox of the node living [`DEFAULT_TTL_SECS`].
    pub children: Vec<Arc<Sandbox>>,
    /// How long the parent was paused.
    pub pause: Duration,
    /// From the call until every child answered.
    pub took: Duration,
}

/// How much of a sandbox's RAM a checkpoint writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamCapture {
    /// The pages that differ from the sandbox's newest kept checkpoint, when it has
    /// one (the launcher's `diff`); made whole at its first branch or upload.
    Incremental,
    /// The whole image: for a checkpoint that is uploaded or branched at once,
    /// which would make an incremental one whole right away.
    Whole,
}

/// A checkpoint taken.
#[derive(Debug)]
pub struct Checkpointed {
    /// The sandbox captured (it runs on).
    pub sandbox: Arc<Sandbox>,
    /// The checkpoint.
    pub manifest: Manifest,
    /// How long the sandbox was paused.
    pub pause: Duration,
    /// The whole capture.
    pub took: Duration,
}

/// Sandboxes started from a checkpoint.
#[derive(Debug)]
pub struct Branched {
    /// The new sandboxes.
    pub children: Vec<Arc<Sandbox>>,
    /// The checkpoint they started from.
    pub manifest: Manifest,
    /// From the call until every child answered.
    pub took: Duration,
}

/// A checkpoint in the store, with who uses it.
#[derive(Debug)]
pub struct CheckpointEntry {
    /// The checkpoint.
    pub manifest: Manifest,
    /// Sandboxes and VMs that map it or back onto it.
    pub users: Vec<CheckpointUser>,
}

/// A hibernation done (or found done).
#[derive(Debug)]
pub struct Hibernated {
    /// The sandbox.
    pub sandbox: Arc<Sandbox>,
    /// Its image.
    pub image: Image,
    /// False when it was asleep already.
    pub now: bool,
}

/// A sandbox published as a template.
#[derive(Debug)]
pub struct Promoted {
    /// The sandbox captured (it runs on).
    pub sandbox: Arc<Sandbox>,
    /// The template's name.
    pub name: String,
    /// Whether an earlier promotion of that name was replaced.
    pub replaced: bool,
    /// How long the sandbox was paused.
    pub pause: Duration,
    /// The whole promotion.
    pub took: Duration,
    /// `sha256:` over the template's files ([`super::digest`]); empty when they
    /// could not be read back (logged).
    pub content_digest: String,
}

impl Node {
    /// Clones the sandbox `sandbox_id` into `count` children, all or none.
    pub async fn fork(&self, sandbox_id: &str, count: u64) -> Result<Forked, ForkError> {
        let host = self.snapshot_host().ok_or(ForkError::NotLaunch)?;
        let max = host.max_fork_count();
        let count = match usize::try_from(count) {
            Ok(count) if (1..=max).contains(&count) => count,
            _ => return Err(ForkError::Count { count, max }),
        };
        let parent = self.sandbox(sandbox_id).map_err(ForkError::Lookup)?;
        let started = Instant::now();
        let slots = host
            .pool()
            .slots(count)
            .await
            .map_err(|error| ForkError::NoRoom {
                wanted: count,
                error,
            })?;
        let fork = capture(&parent, host, move |host, vm_id| async move {
            host.launcher()
                .fork(&vm_id, count, host.branch_spec())
                .await
        })
        .await
        .map_err(ForkError::Capture)?;
        host.remember_fork(&fork.checkpoint.manifest.id);
        let children = self
            .adopt(
                fork.children,
                slots,
                &parent.template,
                Lineage::Fork(parent.id.clone()),
                started,
            )
            .await
            .map_err(ForkError::Children)?;
        tracing::info!(
            sandbox = %parent.id,
            count,
            pause_ms = millis(fork.checkpoint.pause),
            fork_ms = millis(started.elapsed()),
            "forked"
        );
        Ok(Forked {
            parent,
            children,
            pause: fork.checkpoint.pause,
            took: started.elapsed(),
        })
    }

    /// Captures the sandbox `sandbox_id` into a checkpoint (named when `name` is),
    /// keeping only the RAM pages that changed since its last kept checkpoint (see
    /// [`Node::checkpoint_with`]).
    pub async fn checkpoint(
        &self,
        sandbox_id: &str,
        name: Option<String>,
    ) -> Result<Checkpointed, CheckpointError> {
        self.checkpoint_with(sandbox_id, name, RamCapture::Incremental)
            .await
    }

    /// Captures the sandbox `sandbox_id` into a checkpoint, its RAM as `ram` says.
    pub async fn checkpoint_with(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        ram: RamCapture,
    ) -> Result<Checkpointed, CheckpointError> {
        let host = self.snapshot_host().ok_or(CheckpointError::NotLaunch)?;
        let name = name.filter(|name| !name.trim().is_empty());
        if let Some(name) = &name {
            check_name(name).map_err(CheckpointError::Name)?;
        }
        let sandbox = self.sandbox(sandbox_id).map_err(CheckpointError::Lookup)?;
        let spec = CheckpointSpec {
            name,
            ephemeral: false,
            incremental: ram == RamCapture::Incremental,
            ..CheckpointSpec::default()
        };
        let taken = capture(&sandbox, host, |host, vm_id| async move {
            host.launcher().checkpoint(&vm_id, spec).await
        })
        .await
        .map_err(CheckpointError::Capture)?;
        let manifest = taken.manifest;
        tracing::info!(sandbox = %sandbox.id, checkpoint = %manifest.id, pause_ms = manifest.pause_ms, "checkpoint taken");
        Ok(Checkpointed {
            sandbox,
            manifest,
            pause: taken.pause,
            took: taken.total,
        })
    }

    /// The checkpoint `key` (an id or a name) in the store, before anything is taken.
    pub fn find_checkpoint(&self, key: &str) -> Result<Manifest, BranchError> {
        let host = self.snapshot_host().ok_or(BranchError::NotLaunch)?;
        let key = key.trim();
        if key.is_empty() {
            return Err(BranchError::EmptyKey);
        }
        host.launcher()
            .checkpoint_store()
            .find(key)
            .map(|info| info.manifest)
            .map_err(BranchError::Find)
    }

    /// `count` new sandboxes from the checkpoint `key`, all or none.
    pub async fn branch(&self, key: &str, count: usize) -> Result<Branched, BranchError> {
        let host = self.snapshot_host().ok_or(BranchError::NotLaunch)?;
        if self.is_draining() {
            return Err(BranchError::Draining);
        }
        // Found before a slot is taken: an unknown id costs nothing.
        let manifest = self.find_checkpoint(key)?;
        let started = Instant::now();
        let slots = host
            .pool()
            .slots(count)
            .await
            .map_err(|error| BranchError::NoRoom {
                wanted: count,
                error: Box::new(error),
            })?;
        let children = self.branch_into(&manifest, slots).await?;
        // As it is now: the branch flattened an incremental one.
        let manifest = self.find_checkpoint(&manifest.id).unwrap_or(manifest);
        tracing::info!(checkpoint = %manifest.id, count, branch_ms = millis(started.elapsed()), "branched");
        Ok(Branched {
            children,
            manifest,
            took: started.elapsed(),
        })
    }

    /// One new sandbox from checkpoint `manifest` in each of `slots` (capacity the
    /// caller took, so it can say in its own words when there is none), all or none.
    pub async fn branch_into(
        &self,
        manifest: &Manifest,
        slots: Vec<OwnedSemaphorePermit>,
    ) -> Result<Vec<Arc<Sandbox>>, BranchError> {
        let host = self.snapshot_host().ok_or(BranchError::NotLaunch)?;
        let started = Instant::now();
        let vms = host
            .launcher()
            .branch(&manifest.id, slots.len(), host.branch_spec())
            .await
            .map_err(BranchError::Branch)?;
        let lineage = Lineage::Checkpoint {
            id: manifest.id.clone(),
            name: manifest.name.clone(),
        };
        self.adopt(vms, slots, &manifest.machine.template, lineage, started)
            .await
            .map_err(BranchError::Children)
    }

    /// The checkpoints in the store (a fork's own excluded), with their users.
    pub fn list_checkpoints(&self) -> Result<Vec<CheckpointEntry>, ListCheckpointsError> {
        let host = self
            .snapshot_host()
            .ok_or(ListCheckpointsError::NotLaunch)?;
        let all = host
            .launcher()
            .checkpoints()
            .map_err(ListCheckpointsError::List)?;
        Ok(all
            .into_iter()
            .filter(|info| !info.manifest.ephemeral)
            .map(|info| CheckpointEntry {
                users: self.users(&info.users),
                manifest: info.manifest,
            })
            .collect())
    }

    /// Deletes the checkpoint `key` unless something uses it. Off the runtime's
    /// threads: incremental checkpoints based on it first take in its pages, up to
    /// a RAM image's worth of reading and writing (see the launcher's `diff`).
    pub async fn delete_checkpoint(&self, key: &str) -> Result<Manifest, DeleteCheckpointError> {
        let host = self
            .snapshot_host()
            .ok_or(DeleteCheckpointError::NotLaunch)?;
        let store = host.launcher().checkpoint_store();
        let info = store
            .find(key.trim())
            .map_err(DeleteCheckpointError::Find)?;
        if !info.users.is_empty() {
            return Err(DeleteCheckpointError::InUse {
                id: info.manifest.id.clone(),
                users: self.users(&info.users),
            });
        }
        let store = host.launcher().checkpoint_store();
        let id = info.manifest.id.clone();
        let manifest = tokio::task::spawn_blocking(move || store.delete(&id))
            .await
            .map_err(|error| {
                DeleteCheckpointError::Delete(SnapshotError::Write {
                    path: host.launcher().checkpoint_store().root().to_owned(),
                    error: std::io::Error::other(error),
                })
            })?
            .map_err(DeleteCheckpointError::Delete)?;
        tracing::info!(checkpoint = %manifest.id, "checkpoint deleted");
        Ok(manifest)
    }

    /// Hibernates the sandbox `sandbox_id` (one asleep already is left as it is).
    pub async fn hibernate(&self, sandbox_id: &str) -> Result<Hibernated, HibernateOpError> {
        let sandbox = self.sandbox(sandbox_id).map_err(HibernateOpError::Lookup)?;
        let slept = sandbox
            .hibernate()
            .await
            .map_err(HibernateOpError::Hibernate)?;
        let (image, now) = match slept {
            Slept::Now(image) => (image, true),
            Slept::Already(image) => (image, false),
        };
        tracing::info!(sandbox = %sandbox.id, took_ms = millis(image.took), now, "hibernated");
        Ok(Hibernated {
            sandbox,
            image,
            now,
        })
    }

    /// Publishes the sandbox `sandbox_id` as the template `template`.
    pub async fn promote(
        &self,
        sandbox_id: &str,
        template: &str,
    ) -> Result<Promoted, PromoteError> {
        let host = self.snapshot_host().ok_or(PromoteError::NotLaunch)?;
        let name = template.trim();
        check_name(name).map_err(PromoteError::Name)?;
        self.replaceable(host, name)?;
        let sandbox = self.sandbox(sandbox_id).map_err(PromoteError::Lookup)?;
        let started = Instant::now();
        let template_name = name.to_owned();
        let promoted = capture(&sandbox, host, |host, vm_id| async move {
            host.launcher().promote(&vm_id, &template_name).await
        })
        .await
        .map_err(PromoteError::Capture)?;
        let dir = promoted.dir.clone();
        let content_digest =
            match tokio::task::spawn_blocking(move || super::digest::content_digest(&dir)).await {
                Ok(Ok(digest)) => digest,
                Ok(Err(error)) => {
                    tracing::warn!(template = name, %error, "cannot digest the promoted template");
                    String::new()
                }
                Err(error) => {
                    tracing::warn!(template = name, %error, "the digest task failed");
                    String::new()
                }
            };
        tracing::info!(sandbox = %sandbox.id, template = name, replaced = promoted.replaced, "promoted");
        Ok(Promoted {
            sandbox,
            name: name.to_owned(),
            replaced: promoted.replaced,
            pause: promoted.checkpoint.pause,
            took: started.elapsed(),
            content_digest,
        })
    }

    /// The snapshot host; `None` in attach mode.
    fn snapshot_host(&self) -> Option<&Arc<SnapshotHost>> {
        self.snapshots()
    }

    /// Refuses a promotion that would replace a built template, or the template the
    /// warm pool serves: promote replaces only what promote made.
    fn replaceable(&self, host: &SnapshotHost, name: &str) -> Result<(), PromoteError> {
        let reference = TemplateRef::Name(name.to_owned());
        if self.default_template() == Some(&reference) {
            return Err(PromoteError::Default(name.to_owned()));
        }
        if let Ok(existing) = host.launcher().template(&reference) {
            if existing.snapshot.is_none() {
                return Err(PromoteError::Built(name.to_owned()));
            }
        }
        Ok(())
    }

    /// Children of a fork or branch, each with its slot, as sandboxes of the node
    /// living one hour. All or nothing: when one cannot be reached, every child is
    /// stopped.
    async fn adopt(
        &self,
        vms: Vec<Vm>,
        slots: Vec<OwnedSemaphorePermit>,
        template: &str,
        lineage: Lineage,
        started: Instant,
    ) -> Result<Vec<Arc<Sandbox>>, AdoptError> {
        let mut leases = Vec::with_capacity(vms.len());
        for (vm, slot) in vms.into_iter().zip(slots) {
            let vm = LaunchedVm::connect(vm).await.map_err(AdoptError::Connect)?;
            leases.push(Lease::new(vm, slot));
        }
        let claim_duration = started.elapsed();
        let mut children = Vec::with_capacity(leases.len());
        for lease in leases {
            let size = lease.vm().vm.size();
            let child = self
                .insert_vm(NewVm {
                    lease,
                    template: template.to_owned(),
                    size,
                    ttl: Duration::from_secs(DEFAULT_TTL_SECS),
                    warm: false,
                    claim_duration,
                    lineage: lineage.clone(),
                })
                .await
                .map_err(AdoptError::Insert)?;
            children.push(child);
        }
        Ok(children)
    }

    /// A checkpoint's users as the node knows them: its sandboxes by id.
    fn users(&self, users: &[String]) -> Vec<CheckpointUser> {
        users
            .iter()
            .map(|user| match user.strip_prefix("VM ") {
                Some(vm) => {
                    let id = sandbox_id_of(vm);
                    if self.registry().get(id.as_str()).is_ok() {
                        CheckpointUser::Sandbox(id)
                    } else {
                        CheckpointUser::Vm(vm.to_owned())
                    }
                }
                None => CheckpointUser::Other(user.clone()),
            })
            .collect()
    }
}

/// Runs a launcher capture (`fork`, `checkpoint`, `promote`) on `sandbox`'s VM while
/// holding it running: woken first if it sleeps, and not hibernated, woken or
/// destroyed by anything else until the capture ends.
///
/// It runs in a task of its own, which the caller awaits: a capture dropped halfway
/// (a client that hung up, and the request with it) could leave the VM stopped, or
/// its disk on an overlay naming a checkpoint that never came. The sandbox's lease
/// is held in that task, so it also ends before the next operation on the sandbox.
async fn capture<T, F>(
    sandbox: &Arc<Sandbox>,
    host: &Arc<SnapshotHost>,
    run: impl FnOnce(Arc<SnapshotHost>, VmId) -> F + Send + 'static,
) -> Result<T, CaptureError>
where
    F: std::future::Future<Output = Result<T, SnapshotError>> + Send + 'static,
    T: Send + 'static,
{
    let (sandbox, host) = (sandbox.clone(), host.clone());
    let task = tokio::spawn(async move {
        let running = sandbox.running().await.map_err(CaptureError::Unreachable)?;
        let vm_id = running.vm().vm.id().clone();
        run(host, vm_id).await.map_err(CaptureError::Snapshot)
    });
    match task.await {
        Ok(done) => done,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => Err(CaptureError::Interrupted),
    }
}

/// Bytes a checkpoint occupies on disk.
pub fn bytes_on_disk(manifest: &Manifest) -> u64 {
    manifest.state_bytes + manifest.ram_bytes + manifest.disk_bytes
}
