//! Outputs of the snapshot tools: one serializable type per tool (its schema is the
//! tool's `outputSchema`) and its text rendering, carried by [`crate::render::success`]
//! like every other tool's.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Serialize;

use crate::render::Render;

/// A sandbox made by fork or branch_checkpoint.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ChildRow {
    /// Pass this to every other tool.
    pub sandbox_id: String,
    /// When it is destroyed (RFC 3339, UTC): one hour after it was made.
    pub deadline: String,
    /// Seconds from its making to its deadline.
    pub ttl_seconds: u64,
}

/// `fork`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ForkResult {
    /// The sandbox forked; it keeps running.
    pub sandbox_id: String,
    /// The children, each a sandbox of this session with its own id, token and
    /// hostname, starting from the parent's memory and files at the fork.
    pub children: Vec<ChildRow>,
    /// How long the parent was paused for the capture, in milliseconds.
    pub pause_ms: u64,
    /// From the call until every child answered, in milliseconds.
    pub fork_ms: u64,
}

impl Render for ForkResult {
    fn render(&self) -> String {
        let mut out = format!(
            "forked {} into {} children in {} ms (parent paused {} ms, still running):",
            self.sandbox_id,
            self.children.len(),
            self.fork_ms,
            self.pause_ms
        );
        for child in &self.children {
            let _ = write!(
                out,
                "\nsandbox_id: {} (deadline {})",
                child.sandbox_id, child.deadline
            );
        }
        out
    }
}

/// `checkpoint`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CheckpointResult {
    /// Pass to branch_checkpoint (any number of times, in this session or a later
    /// one) or delete_checkpoint.
    pub checkpoint_id: String,
    /// Its name, if one was given.
    pub name: Option<String>,
    /// The sandbox captured; it keeps running.
    pub sandbox_id: String,
    /// The template the sandbox runs.
    pub template: String,
    /// When it was taken (RFC 3339, UTC).
    pub created_at: String,
    /// How long the sandbox was paused, in milliseconds.
    pub pause_ms: u64,
    /// The whole call, in milliseconds.
    pub took_ms: u64,
    /// Bytes it occupies on the host's disk.
    pub bytes_on_disk: u64,
}

impl Render for CheckpointResult {
    fn render(&self) -> String {
        let mut out = format!("checkpoint_id: {}", self.checkpoint_id);
        if let Some(name) = &self.name {
            let _ = write!(out, " (name: {name})");
        }
        let _ = write!(
            out,
            "\ncaptured {} in {} ms (paused {} ms; it keeps running), {} on disk\n\
             branch_checkpoint starts a new sandbox from this moment; the checkpoint \
             stays until delete_checkpoint",
            self.sandbox_id,
            self.took_ms,
            self.pause_ms,
            mib(self.bytes_on_disk)
        );
        out
    }
}

/// `branch_checkpoint`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BranchResult {
    /// The new sandbox: pass this to every other tool.
    pub sandbox_id: String,
    /// The checkpoint it started from (in use while the sandbox lives).
    pub checkpoint_id: String,
    /// When it is destroyed (RFC 3339, UTC): one hour after it was made.
    pub deadline: String,
    /// Seconds from its making to its deadline.
    pub ttl_seconds: u64,
    /// The template the checkpointed sandbox ran.
    pub template: String,
    /// The size preset (or VCPUSxMIB).
    pub size: String,
    /// Virtual CPUs.
    pub vcpus: u16,
    /// Memory in MiB.
    pub memory_mib: u32,
    /// How long the restore took, in milliseconds.
    pub branch_ms: u64,
}

impl Render for BranchResult {
    fn render(&self) -> String {
        format!(
            "sandbox_id: {}\ndeadline: {} (destroyed then; not renewable)\nstarted from \
             checkpoint {} in {} ms (template {}, size {}: {} vCPU, {} MiB)",
            self.sandbox_id,
            self.deadline,
            self.checkpoint_id,
            self.branch_ms,
            self.template,
            self.size,
            self.vcpus,
            self.memory_mib
        )
    }
}

/// One checkpoint, in `list_checkpoints`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CheckpointRow {
    /// Pass to branch_checkpoint or delete_checkpoint.
    pub checkpoint_id: String,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// The sandbox it was taken from (it may be gone).
    pub source_sandbox_id: String,
    /// The template that sandbox ran.
    pub template: String,
    /// When it was taken (RFC 3339, UTC).
    pub created_at: String,
    /// Bytes it occupies on the host's disk.
    pub bytes_on_disk: u64,
    /// What keeps it from being deleted: sandboxes started from it, checkpoints
    /// based on it. Empty when delete_checkpoint can remove it.
    pub in_use_by: Vec<String>,
}

/// `list_checkpoints`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListCheckpointsResult {
    /// The host's checkpoints, oldest first (a fork's own, which go by themselves, are
    /// left out).
    pub checkpoints: Vec<CheckpointRow>,
}

impl Render for ListCheckpointsResult {
    fn render(&self) -> String {
        if self.checkpoints.is_empty() {
            return "no checkpoints (make one with checkpoint)".to_owned();
        }
        let mut out = String::from("CHECKPOINT_ID\tNAME\tFROM\tTEMPLATE\tCREATED\tSIZE\tIN USE BY");
        for row in &self.checkpoints {
            let users = if row.in_use_by.is_empty() {
                "-".to_owned()
            } else {
                row.in_use_by.join(", ")
            };
            let _ = write!(
                out,
                "\n{}\t{}\t{}\t{}\t{}\t{}\t{}",
                row.checkpoint_id,
                row.name.as_deref().unwrap_or("-"),
                row.source_sandbox_id,
                row.template,
                row.created_at,
                mib(row.bytes_on_disk),
                users
            );
        }
        out
    }
}

/// `delete_checkpoint`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DeleteCheckpointResult {
    /// The checkpoint deleted; its id is now unknown.
    pub checkpoint_id: String,
    /// Its name, if it had one.
    pub name: Option<String>,
    /// Bytes freed on the host's disk.
    pub freed_bytes: u64,
}

impl Render for DeleteCheckpointResult {
    fn render(&self) -> String {
        format!(
            "deleted checkpoint {}{} ({} freed)",
            self.checkpoint_id,
            self.name
                .as_ref()
                .map_or_else(String::new, |name| format!(" ({name})")),
            mib(self.freed_bytes)
        )
    }
}

/// `hibernate`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HibernateResult {
    /// The sandbox; its id stays valid.
    pub sandbox_id: String,
    /// False when it was hibernated already (nothing was done).
    pub hibernated_now: bool,
    /// When it went to sleep (RFC 3339, UTC).
    pub hibernated_at: String,
    /// How long the hibernation took, in milliseconds.
    pub took_ms: u64,
    /// Bytes its image occupies on the host's disk.
    pub bytes_on_disk: u64,
    /// Its deadline, unchanged (RFC 3339, UTC).
    pub deadline: Option<String>,
}

impl Render for HibernateResult {
    fn render(&self) -> String {
        let what = if self.hibernated_now {
            format!("hibernated {} in {} ms", self.sandbox_id, self.took_ms)
        } else {
            format!(
                "{} was hibernated already (since {})",
                self.sandbox_id, self.hibernated_at
            )
        };
        format!(
            "{what}: its memory is freed, its files and processes are kept ({} on disk). \
             The next call that reaches it (exec, read_file, ...) wakes it; its deadline \
             ({}) still applies.",
            mib(self.bytes_on_disk),
            self.deadline.as_deref().unwrap_or("none")
        )
    }
}

/// `promote`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PromoteResult {
    /// Pass as create_sandbox's template.
    pub template: String,
    /// The sandbox promoted; it keeps running.
    pub sandbox_id: String,
    /// True when a template promoted earlier under this name was replaced.
    pub replaced: bool,
    /// How long the sandbox was paused, in milliseconds.
    pub pause_ms: u64,
    /// The whole call, in milliseconds.
    pub took_ms: u64,
}

impl Render for PromoteResult {
    fn render(&self) -> String {
        format!(
            "template {} {} from {} in {} ms (paused {} ms; it keeps running). \
             create_sandbox with template {:?} starts sandboxes from this state, each with \
             its own identity.",
            self.template,
            if self.replaced { "replaced" } else { "made" },
            self.sandbox_id,
            self.took_ms,
            self.pause_ms,
            self.template
        )
    }
}

/// Bytes as MiB with one decimal, for the renderings.
fn mib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // a display figure
    let mib = bytes as f64 / (1024.0 * 1024.0);
    format!("{mib:.1} MiB")
}

/// The engine's results as this profile's: ids as the tools show them, times in
/// RFC 3339, durations in milliseconds.
pub mod from_engine {
    use std::time::{Duration, UNIX_EPOCH};

    use sandbox_engine::config::DEFAULT_TTL_SECS;
    use sandbox_engine::node::sandbox_id_of;
    use sandbox_engine::sandbox::Sandbox;
    use sandbox_engine::snapshot::ops::{
        bytes_on_disk, Branched, CheckpointEntry, Checkpointed, Forked, Hibernated, Promoted,
    };
    use sandbox_engine::util::millis;
    use sandbox_vmm::launcher::snapshot::Manifest;

    use super::{
        BranchResult, CheckpointResult, CheckpointRow, ChildRow, DeleteCheckpointResult,
        ForkResult, HibernateResult, ListCheckpointsResult, PromoteResult,
    };
    use crate::render::rfc3339;

    /// A fork or branch child.
    pub fn child_row(child: &Sandbox) -> ChildRow {
        ChildRow {
            sandbox_id: child.id.to_string(),
            deadline: child
                .deadline()
                .map(|deadline| rfc3339(deadline.wall))
                .unwrap_or_default(),
            ttl_seconds: DEFAULT_TTL_SECS,
        }
    }

    /// When a checkpoint was taken.
    pub fn created_at(manifest: &Manifest) -> String {
        rfc3339(UNIX_EPOCH + Duration::from_millis(manifest.created_at_unix_ms))
    }

    /// `fork`
    pub fn fork(forked: &Forked) -> ForkResult {
        ForkResult {
            sandbox_id: forked.parent.id.to_string(),
            children: forked
                .children
                .iter()
                .map(|child| child_row(child))
                .collect(),
            pause_ms: millis(forked.pause),
            fork_ms: millis(forked.took),
        }
    }

    /// `checkpoint`
    pub fn checkpoint(taken: &Checkpointed) -> CheckpointResult {
        let manifest = &taken.manifest;
        CheckpointResult {
            checkpoint_id: manifest.id.clone(),
            name: manifest.name.clone(),
            sandbox_id: taken.sandbox.id.to_string(),
            template: taken.sandbox.template.clone(),
            created_at: created_at(manifest),
            pause_ms: millis(taken.pause),
            took_ms: millis(taken.took),
            bytes_on_disk: bytes_on_disk(manifest),
        }
    }

    /// `branch_checkpoint`: its one child, or `None` when the branch made none.
    pub fn branch(branched: &Branched) -> Option<BranchResult> {
        let child = branched.children.first()?;
        let row = child_row(child);
        let size = branched.manifest.machine.size;
        Some(BranchResult {
            sandbox_id: row.sandbox_id,
            checkpoint_id: branched.manifest.id.clone(),
            deadline: row.deadline,
            ttl_seconds: row.ttl_seconds,
            template: child.template.clone(),
            size: size.to_string(),
            vcpus: size.vcpus,
            memory_mib: size.memory_mib,
            branch_ms: millis(branched.took),
        })
    }

    /// `list_checkpoints`
    pub fn checkpoints(entries: &[CheckpointEntry]) -> ListCheckpointsResult {
        ListCheckpointsResult {
            checkpoints: entries
                .iter()
                .map(|entry| CheckpointRow {
                    checkpoint_id: entry.manifest.id.clone(),
                    name: entry.manifest.name.clone(),
                    source_sandbox_id: sandbox_id_of(&entry.manifest.source_vm).to_string(),
                    template: entry.manifest.machine.template.clone(),
                    created_at: created_at(&entry.manifest),
                    bytes_on_disk: bytes_on_disk(&entry.manifest),
                    in_use_by: entry.users.iter().map(ToString::to_string).collect(),
                })
                .collect(),
        }
    }

    /// `delete_checkpoint`
    pub fn deleted(manifest: &Manifest) -> DeleteCheckpointResult {
        DeleteCheckpointResult {
            checkpoint_id: manifest.id.clone(),
            name: manifest.name.clone(),
            freed_bytes: bytes_on_disk(manifest),
        }
    }

    /// `hibernate`
    pub fn hibernated(done: &Hibernated) -> HibernateResult {
        HibernateResult {
            sandbox_id: done.sandbox.id.to_string(),
            hibernated_now: done.now,
            hibernated_at: rfc3339(done.image.at),
            took_ms: millis(done.image.took),
            bytes_on_disk: done.image.bytes_on_disk,
            deadline: done
                .sandbox
                .deadline()
                .map(|deadline| rfc3339(deadline.wall)),
        }
    }

    /// `promote`
    pub fn promoted(done: &Promoted) -> PromoteResult {
        PromoteResult {
            template: done.name.clone(),
            sandbox_id: done.sandbox.id.to_string(),
            replaced: done.replaced,
            pause_ms: millis(done.pause),
            took_ms: millis(done.took),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_lists_every_child_and_the_parent_keeps_running() {
        let child = |id: &str| ChildRow {
            sandbox_id: id.into(),
            deadline: "2026-01-01T01:00:00Z".into(),
            ttl_seconds: 3600,
        };
        let result = ForkResult {
            sandbox_id: "sbx-p".into(),
            children: vec![child("sbx-a"), child("sbx-b")],
            pause_ms: 40,
            fork_ms: 900,
        };
        assert_eq!(
            result.render(),
            "forked sbx-p into 2 children in 900 ms (parent paused 40 ms, still running):\n\
             sandbox_id: sbx-a (deadline 2026-01-01T01:00:00Z)\n\
             sandbox_id: sbx-b (deadline 2026-01-01T01:00:00Z)"
        );
    }

    #[test]
    fn checkpoint_listings_say_what_holds_a_checkpoint() {
        let row = CheckpointRow {
            checkpoint_id: "c1".into(),
            name: None,
            source_sandbox_id: "sbx-p".into(),
            template: "default".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            bytes_on_disk: 3 << 20,
            in_use_by: vec!["sandbox sbx-a".into()],
        };
        let text = ListCheckpointsResult {
            checkpoints: vec![row],
        }
        .render();
        assert!(
            text.ends_with("c1\t-\tsbx-p\tdefault\t2026-01-01T00:00:00Z\t3.0 MiB\tsandbox sbx-a"),
            "{text}"
        );
        let empty = ListCheckpointsResult {
            checkpoints: Vec::new(),
        };
        assert!(empty.render().contains("checkpoint"));
    }
}
