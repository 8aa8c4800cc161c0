//! The snapshot operations, as methods of [`Node`]: resolve the sandbox, take
//! capacity, drive the launcher, and make children sandboxes of this session.
//!
//! A sandbox being captured (fork, checkpoint, promote) is held through
//! [`crate::sandbox::Sandbox::running`]: a hibernated one is woken first, and nothing
//! can hibernate or destroy it meanwhile. Capacity for children is taken before
//! anything starts ([`crate::pool::Pool::slots`]), so a fork that does not fit is
//! refused without pausing the parent.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use sandbox_vmm::launcher::snapshot::manifest::check_name;
use sandbox_vmm::launcher::snapshot::{CheckpointSpec, Manifest, SnapshotError};
use sandbox_vmm::launcher::{TemplateRef, Vm, VmId};
use tokio::sync::OwnedSemaphorePermit;

use super::render::{
    BranchResult, CheckpointResult, CheckpointRow, ChildRow, DeleteCheckpointResult, ForkResult,
    HibernateResult, ListCheckpointsResult, PromoteResult,
};
use super::SnapshotHost;
use crate::error::{Op, ToolError};
use crate::node::{NewVm, Node, DEFAULT_TTL_SECS};
use crate::pool::launcher::LaunchedVm;
use crate::pool::Lease;
use crate::render::rfc3339;
use crate::sandbox::{Lineage, Sandbox, SandboxId, Slept};
use crate::util::millis;

impl Node {
    /// `fork`
    pub async fn fork(&self, sandbox_id: &str, count: u64) -> Result<ForkResult, ToolError> {
        let host = self.snapshot_host("fork")?;
        let max = host.max_fork_count();
        let count = match usize::try_from(count) {
            Ok(count) if (1..=max).contains(&count) => count,
            _ => {
                return Err(ToolError::new(format!(
                    "count must be between 1 and {max} (this server's max_fork_count); got \
                     {count}. Call fork with a count in that range, several times if you need \
                     more children."
                )))
            }
        };
        let parent = self.sandbox(sandbox_id)?;
        let started = Instant::now();
        let slots = host
            .pool()
            .slots(count)
            .await
            .map_err(|error| ToolError::no_room("fork", count, &error))?;
        let fork = capture(&parent, "fork", |vm_id| async move {
            host.launcher()
                .fork(&vm_id, count, host.branch_spec())
                .await
        })
        .await?;
        host.remember_fork(&fork.checkpoint.manifest.id);
        let children = self
            .adopt(
                fork.children,
                slots,
                &parent.template,
                Lineage::Fork(parent.id.clone()),
                started,
            )
            .await?;
        tracing::info!(
            sandbox = %parent.id,
            count,
            pause_ms = millis(fork.checkpoint.pause),
            fork_ms = millis(started.elapsed()),
            "forked"
        );
        Ok(ForkResult {
            sandbox_id: parent.id.to_string(),
            children: children.iter().map(|child| child_row(child)).collect(),
            pause_ms: millis(fork.checkpoint.pause),
            fork_ms: millis(started.elapsed()),
        })
    }

    /// `checkpoint`
    pub async fn checkpoint(
        &self,
        sandbox_id: &str,
        name: Option<String>,
    ) -> Result<CheckpointResult, ToolError> {
        let host = self.snapshot_host("checkpoint")?;
        let name = name.filter(|name| !name.trim().is_empty());
        if let Some(name) = &name {
            check_name(name).map_err(|error| ToolError::snapshot("checkpoint", &error))?;
        }
        let sandbox = self.sandbox(sandbox_id)?;
        let spec = CheckpointSpec {
            name,
            ephemeral: false,
        };
        let taken = capture(&sandbox, "checkpoint", |vm_id| async move {
            host.launcher().checkpoint(&vm_id, spec).await
        })
        .await?;
        let manifest = &taken.manifest;
        tracing::info!(sandbox = %sandbox.id, checkpoint = %manifest.id, pause_ms = manifest.pause_ms, "checkpoint taken");
        Ok(CheckpointResult {
            checkpoint_id: manifest.id.clone(),
            name: manifest.name.clone(),
            sandbox_id: sandbox.id.to_string(),
            template: sandbox.template.clone(),
            created_at: created_at(manifest),
            pause_ms: millis(taken.pause),
            took_ms: millis(taken.total),
            bytes_on_disk: bytes_on_disk(manifest),
        })
    }

    /// `branch_checkpoint`
    pub async fn branch_checkpoint(&self, key: &str) -> Result<BranchResult, ToolError> {
        let host = self.snapshot_host("branch_checkpoint")?;
        let key = key.trim();
        if key.is_empty() {
            return Err(ToolError::new(
                "checkpoint_id is empty: pass an id from checkpoint or list_checkpoints.",
            ));
        }
        // Found before a slot is taken: an unknown id costs nothing.
        let info = host
            .launcher()
            .checkpoint_store()
            .find(key)
            .map_err(|error| ToolError::snapshot("branch_checkpoint", &error))?;
        let manifest = info.manifest;
        let started = Instant::now();
        let slots = host
            .pool()
            .slots(1)
            .await
            .map_err(|error| ToolError::no_room("branch_checkpoint", 1, &error))?;
        let children = self
            .branch_into(&manifest, slots, "branch_checkpoint")
            .await?;
        let child = children
            .first()
            .ok_or_else(|| ToolError::new("branch_checkpoint made no sandbox; try again."))?;
        let size = manifest.machine.size;
        tracing::info!(sandbox = %child.id, checkpoint = %manifest.id, branch_ms = millis(started.elapsed()), "branched");
        let row = child_row(child);
        Ok(BranchResult {
            sandbox_id: row.sandbox_id,
            checkpoint_id: manifest.id.clone(),
            deadline: row.deadline,
            ttl_seconds: row.ttl_seconds,
            template: child.template.clone(),
            size: size.to_string(),
            vcpus: size.vcpus,
            memory_mib: size.memory_mib,
            branch_ms: millis(started.elapsed()),
        })
    }

    /// One new sandbox from checkpoint `manifest` in each of `slots` (capacity the
    /// caller took, so it can say in its own words when there is none), all or none;
    /// `what` names the operation in errors.
    pub async fn branch_into(
        &self,
        manifest: &Manifest,
        slots: Vec<OwnedSemaphorePermit>,
        what: &str,
    ) -> Result<Vec<Arc<Sandbox>>, ToolError> {
        let host = self.snapshot_host(what)?;
        let started = Instant::now();
        let vms = host
            .launcher()
            .branch(&manifest.id, slots.len(), host.branch_spec())
            .await
            .map_err(|error| ToolError::snapshot(what, &error))?;
        let lineage = Lineage::Checkpoint {
            id: manifest.id.clone(),
            name: manifest.name.clone(),
        };
        self.adopt(vms, slots, &manifest.machine.template, lineage, started)
            .await
    }

    /// `list_checkpoints`
    pub fn list_checkpoints(&self) -> Result<ListCheckpointsResult, ToolError> {
        let host = self.snapshot_host("list_checkpoints")?;
        let all = host
            .launcher()
            .checkpoints()
            .map_err(|error| ToolError::snapshot("list_checkpoints", &error))?;
        let checkpoints = all
            .into_iter()
            .filter(|info| !info.manifest.ephemeral)
            .map(|info| CheckpointRow {
                checkpoint_id: info.manifest.id.clone(),
                name: info.manifest.name.clone(),
                source_sandbox_id: sandbox_id_of(&info.manifest.source_vm).to_string(),
                template: info.manifest.machine.template.clone(),
                created_at: created_at(&info.manifest),
                bytes_on_disk: bytes_on_disk(&info.manifest),
                in_use_by: self.users(&info.users),
            })
            .collect();
        Ok(ListCheckpointsResult { checkpoints })
    }

    /// `delete_checkpoint`
    pub fn delete_checkpoint(&self, key: &str) -> Result<DeleteCheckpointResult, ToolError> {
        let host = self.snapshot_host("delete_checkpoint")?;
        let store = host.launcher().checkpoint_store();
        let info = store
            .find(key.trim())
            .map_err(|error| ToolError::snapshot("delete_checkpoint", &error))?;
        if !info.users.is_empty() {
            return Err(ToolError::new(format!(
                "Checkpoint {} is in use by {}, and is kept while they live. Release those \
                 sandboxes first (release), then call delete_checkpoint again.",
                info.manifest.id,
                self.users(&info.users).join(", ")
            )));
        }
        let manifest = host
            .launcher()
            .delete_checkpoint(&info.manifest.id)
            .map_err(|error| ToolError::snapshot("delete_checkpoint", &error))?;
        tracing::info!(checkpoint = %manifest.id, "checkpoint deleted");
        Ok(DeleteCheckpointResult {
            checkpoint_id: manifest.id.clone(),
            name: manifest.name.clone(),
            freed_bytes: bytes_on_disk(&manifest),
        })
    }

    /// `hibernate`
    pub async fn hibernate(&self, sandbox_id: &str) -> Result<HibernateResult, ToolError> {
        let sandbox = self.sandbox(sandbox_id)?;
        let slept = sandbox
            .hibernate()
            .await
            .map_err(|error| ToolError::hibernation(sandbox_id, &error))?;
        let (image, now) = match slept {
            Slept::Now(image) => (image, true),
            Slept::Already(image) => (image, false),
        };
        tracing::info!(sandbox = %sandbox.id, took_ms = millis(image.took), now, "hibernated");
        Ok(HibernateResult {
            sandbox_id: sandbox.id.to_string(),
            hibernated_now: now,
            hibernated_at: rfc3339(image.at),
            took_ms: millis(image.took),
            bytes_on_disk: image.bytes_on_disk,
            deadline: sandbox.deadline.map(|deadline| rfc3339(deadline.wall)),
        })
    }

    /// `promote`
    pub async fn promote(
        &self,
        sandbox_id: &str,
        template: &str,
    ) -> Result<PromoteResult, ToolError> {
        let host = self.snapshot_host("promote")?;
        let name = template.trim();
        check_name(name).map_err(|error| ToolError::snapshot("promote", &error))?;
        self.replaceable(host, name)?;
        let sandbox = self.sandbox(sandbox_id)?;
        let started = Instant::now();
        let promoted = capture(&sandbox, "promote", |vm_id| async move {
            host.launcher().promote(&vm_id, name).await
        })
        .await?;
        tracing::info!(sandbox = %sandbox.id, template = name, replaced = promoted.replaced, "promoted");
        Ok(PromoteResult {
            template: name.to_owned(),
            sandbox_id: sandbox.id.to_string(),
            replaced: promoted.replaced,
            pause_ms: millis(promoted.checkpoint.pause),
            took_ms: millis(started.elapsed()),
        })
    }

    /// The snapshot host, or the error a snapshot operation gives in attach mode (where
    /// the server does not offer the tools).
    fn snapshot_host(&self, tool: &str) -> Result<&SnapshotHost, ToolError> {
        self.snapshots()
            .map(Arc::as_ref)
            .ok_or_else(|| ToolError::needs_launch_mode(tool))
    }

    /// Refuses a promotion that would replace a built template, or the template the
    /// warm pool serves: promote replaces only what promote made.
    fn replaceable(&self, host: &SnapshotHost, name: &str) -> Result<(), ToolError> {
        let reference = TemplateRef::Name(name.to_owned());
        if self.default_template() == Some(&reference) {
            return Err(ToolError::new(format!(
                "{name:?} is this server's default template (its warm pool serves it) and \
                 cannot be replaced by promote. Call promote with another template name."
            )));
        }
        if let Ok(existing) = host.launcher().template(&reference) {
            if existing.snapshot.is_none() {
                return Err(ToolError::new(format!(
                    "{name:?} is a built template, not one made by promote, and promote does \
                     not replace it. Call promote with another template name (node_info lists \
                     the templates)."
                )));
            }
        }
        Ok(())
    }

    /// Children of a fork or branch, each with its slot, as sandboxes of this
    /// session living one hour. All or nothing: when one cannot be reached, every
    /// child is stopped.
    async fn adopt(
        &self,
        vms: Vec<Vm>,
        slots: Vec<OwnedSemaphorePermit>,
        template: &str,
        lineage: Lineage,
        started: Instant,
    ) -> Result<Vec<Arc<Sandbox>>, ToolError> {
        let mut leases = Vec::with_capacity(vms.len());
        for (vm, slot) in vms.into_iter().zip(slots) {
            let vm = LaunchedVm::connect(vm).await.map_err(|error| {
                ToolError::new(format!(
                    "A new sandbox's agent did not answer ({}); none was kept. Try again.",
                    sandbox_vmm::error_chain(&error)
                ))
            })?;
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
                .await?;
            children.push(child);
        }
        Ok(children)
    }

    /// A checkpoint's users as a model knows them: this session's sandboxes by id.
    fn users(&self, users: &[String]) -> Vec<String> {
        users
            .iter()
            .map(|user| match user.strip_prefix("VM ") {
                Some(vm) => {
                    let id = sandbox_id_of(vm);
                    if self.registry().get(id.as_str()).is_ok() {
                        format!("sandbox {id}")
                    } else {
                        format!("VM {vm} (not a sandbox of this session)")
                    }
                }
                None => user.clone(),
            })
            .collect()
    }
}

/// The sandbox id a VM has in a session (see [`Node::insert_vm`]).
/// Runs a launcher capture (`fork`, `checkpoint`, `promote`) on `sandbox`'s VM while
/// holding it running: woken first if it sleeps, and not hibernated, woken or
/// destroyed by anything else until the capture ends. Failures are reported for
/// `tool`.
async fn capture<T, F>(
    sandbox: &Sandbox,
    tool: &str,
    run: impl FnOnce(VmId) -> F,
) -> Result<T, ToolError>
where
    F: std::future::Future<Output = Result<T, SnapshotError>>,
{
    let running = sandbox
        .running()
        .await
        .map_err(|error| ToolError::unreachable(Op::Other, sandbox.id.as_str(), &error))?;
    let vm_id = running.vm().vm.id().clone();
    run(vm_id)
        .await
        .map_err(|error| ToolError::snapshot(tool, &error))
}

pub(crate) fn sandbox_id_of(vm_id: &str) -> SandboxId {
    SandboxId::new(format!("sbx-{vm_id}"))
}

fn child_row(child: &Sandbox) -> ChildRow {
    let deadline = child.deadline.map(|deadline| deadline.wall);
    ChildRow {
        sandbox_id: child.id.to_string(),
        deadline: deadline.map(rfc3339).unwrap_or_default(),
        ttl_seconds: DEFAULT_TTL_SECS,
    }
}

fn created_at(manifest: &Manifest) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_millis(manifest.created_at_unix_ms))
}

fn bytes_on_disk(manifest: &Manifest) -> u64 {
    manifest.state_bytes + manifest.ram_bytes + manifest.disk_bytes
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Args, Config};

    /// A node attached to an agent that is not there (nothing is called on it).
    async fn attached_node() -> Arc<Node> {
        let args =
            Args::try_parse_from(["sandbox-mcp", "--agent", "unix:///nonexistent/a.sock"]).unwrap();
        let config = Config::from_args(args, |_| None).unwrap();
        Node::start(config).await
    }

    #[tokio::test]
    async fn in_attach_mode_the_snapshot_tools_are_not_offered_and_say_what_they_need() {
        use rmcp::ServerHandler;
        let node = attached_node().await;
        let server = crate::tools::SandboxServer::new(
            node.clone(),
            crate::config::Profile::Default,
            Default::default(),
        );
        assert!(server.get_tool("exec").is_some());
        assert!(server.get_tool("fork").is_none());
        assert!(server.get_tool("hibernate").is_none());
        // The fleet tools that describe work on the attached agent; those that claim
        // or list templates are not offered.
        assert!(server.get_tool("list_sandboxes").is_some());
        assert!(server.get_tool("ping_sandbox").is_some());
        assert!(server.get_tool("create_sandboxes").is_none());
        assert!(server.get_tool("list_templates").is_none());
        let fork = node.fork("attached", 1).await.unwrap_err();
        assert!(fork
            .message
            .starts_with("fork needs a server that launches microVMs"));
        let list = node.list_checkpoints().unwrap_err();
        assert!(
            list.message.contains("exec and the file tools"),
            "{}",
            list.message
        );
        let branch = node.branch_checkpoint("c").await.unwrap_err();
        assert!(branch.message.starts_with("branch_checkpoint needs"));
        let hibernate = node.hibernate("attached").await.unwrap_err();
        assert!(
            hibernate.message.contains("attached agent"),
            "{}",
            hibernate.message
        );
        let unknown = node.hibernate("sbx-nope").await.unwrap_err();
        assert!(unknown.message.starts_with("Unknown sandbox_id"));
        node.shutdown().await;
    }
}
