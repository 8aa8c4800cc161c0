//! Failures of the snapshot tools, and of waking a hibernated sandbox, as
//! [`ToolError`]s: what went wrong, then the tool to call next.

use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::snapshot::SnapshotError;

use crate::error::{Op, ToolError};
use sandbox_engine::error::{
    AdoptError, BranchError, CaptureError, CheckpointError, DeleteCheckpointError, ForkError,
    HibernateOpError, ListCheckpointsError, PromoteError,
};
use sandbox_engine::pool::ClaimError;
use sandbox_engine::sandbox::{HibernateError, Unreachable, WakeError};

impl ToolError {
    /// A sandbox whose guest could not be reached: its agent, or its wake.
    pub fn unreachable(op: Op, sandbox_id: &str, error: &Unreachable) -> Self {
        let text = error_chain(error);
        match error {
            Unreachable::Agent(error) => Self::agent(op, sandbox_id, error),
            Unreachable::Wake(WakeError::Capacity(_)) => Self::new(format!(
                "Sandbox {sandbox_id} is hibernated and there is no room to wake it: {text}. \
                 Release a sandbox you no longer need (release; node_info lists them) or \
                 hibernate one, then call this tool again."
            )),
            Unreachable::Wake(WakeError::Restore(_)) => Self::new(format!(
                "Sandbox {sandbox_id} is hibernated and did not wake: {text}. Call this tool \
                 again; if it fails again, release it and call create_sandbox for a new one."
            )),
            Unreachable::Destroyed => Self::new(format!(
                "Sandbox {sandbox_id} was destroyed (released, or its TTL ran out) while this \
                 call waited for it. Call create_sandbox for a new one."
            )),
            Unreachable::Attached => Self::new(format!(
                "Sandbox {sandbox_id} is the attached agent, which runs in no VM of this \
                 server: snapshot tools need a server that launches microVMs. exec and the \
                 file tools work on it."
            )),
        }
    }

    /// A snapshot tool used in attach mode.
    pub fn needs_launch_mode(tool: &str) -> Self {
        Self::new(format!(
            "{tool} needs a server that launches microVMs; this one is attached to one \
             existing agent (sandbox_id \"attached\"), which it cannot snapshot. exec and the \
             file tools work on it."
        ))
    }

    /// Too few capacity slots for `wanted` new VMs.
    pub fn no_room<E: std::error::Error + 'static>(
        tool: &str,
        wanted: usize,
        error: &ClaimError<E>,
    ) -> Self {
        let text = error_chain(error);
        match error {
            ClaimError::Closed => Self::new(text),
            _ => Self::new(format!(
                "{tool} needs room for {wanted} more VM(s) and did not get it: {text}. Release \
                 sandboxes you no longer need (release; node_info shows capacity and live \
                 claims), hibernate idle ones (hibernate frees their room), or ask for fewer.{}",
                crate::error::capacity_limit(error)
                    .map(|max| format!(" {}", crate::error::raise_limit(max)))
                    .unwrap_or_default()
            )),
        }
    }

    /// A hibernation that failed.
    pub fn hibernation(sandbox_id: &str, error: &HibernateError) -> Self {
        let text = error_chain(error);
        let hint = match error {
            HibernateError::NotCapable(_) => {
                "It keeps running as it is: exec, spawn and the file tools work on it."
            }
            HibernateError::Destroyed => "Call create_sandbox for a new one.",
            HibernateError::Capture { lost: false, .. } => {
                "It is still running as before: keep using it, or try hibernate again later."
            }
            HibernateError::Capture { lost: true, .. } => {
                "Its VM did not survive: release it and call create_sandbox for a new one."
            }
        };
        Self::new(format!(
            "hibernate failed for sandbox {sandbox_id}: {text}. {hint}"
        ))
    }

    /// A launcher snapshot operation that failed; `what` says which, for the text.
    pub fn snapshot(what: &str, error: &SnapshotError) -> Self {
        let text = error_chain(error);
        let hint = match error {
            SnapshotError::NoCheckpoint(key) => {
                return Self::new(format!(
                    "Unknown checkpoint_id {key:?}: this host holds no checkpoint with that id \
                     or name. Call list_checkpoints for the ones it holds, or checkpoint a \
                     sandbox to make one."
                ))
            }
            SnapshotError::NameTaken(_) => {
                "Pass another name (list_checkpoints shows the names in use)."
            }
            SnapshotError::BadName(_) => "Pass a name like \"base-1\".",
            SnapshotError::NoTemplate(_) | SnapshotError::NotPromoted(_) => {
                "node_info lists the templates and which ones promote made."
            }
            SnapshotError::InUse { .. } => {
                "Release the sandboxes started from it (release) first, then call \
                 delete_checkpoint again."
            }
            SnapshotError::Damaged { .. } => {
                "The checkpoint cannot be used: delete it with delete_checkpoint and take a \
                 new one with checkpoint."
            }
            SnapshotError::Write { .. } => {
                "The host's disk may be full: delete checkpoints you no longer need \
                 (list_checkpoints, delete_checkpoint) and try again."
            }
            SnapshotError::Count(_) => "Ask for fewer.",
            SnapshotError::Busy { .. } => {
                "Another snapshot of this sandbox is being taken; try again in a moment."
            }
            SnapshotError::Child { .. }
            | SnapshotError::Identity { .. }
            | SnapshotError::IdentityTimeout { .. } => {
                "No new sandbox was kept and nothing else changed; the host may be \
                 overloaded: try again, or with fewer children."
            }
            SnapshotError::NoVm { .. }
            | SnapshotError::NotRunning { .. }
            | SnapshotError::NotCapable { .. }
            | SnapshotError::NotHibernated { .. }
            | SnapshotError::Wake { .. } => {
                "The sandbox's VM is not in a state to snapshot: if exec fails on it too, \
                 release it and call create_sandbox for a new one."
            }
            SnapshotError::Qemu { .. } | SnapshotError::RunDir(_) | SnapshotError::Launch(_) => {
                "The sandbox keeps running as before; try again."
            }
        };
        Self::new(format!("{what} failed: {text}. {hint}"))
    }
}

/// The snapshot operations' errors, each in the words of the tool that called it.
impl ToolError {
    /// A capture (fork, checkpoint, promote) that failed, for `tool`.
    pub fn capture(tool: &str, sandbox_id: &str, error: &CaptureError) -> Self {
        match error {
            CaptureError::Unreachable(error) => Self::unreachable(Op::Other, sandbox_id, error),
            CaptureError::Snapshot(error) => Self::snapshot(tool, error),
            CaptureError::Interrupted => Self::new(format!(
                "{tool} failed: the node is shutting down. Try again once it is back."
            )),
        }
    }

    /// Children that could not be kept.
    pub fn adopt(error: &AdoptError) -> Self {
        match error {
            AdoptError::Connect(error) => Self::new(format!(
                "A new sandbox's agent did not answer ({}); none was kept. Try again.",
                error_chain(error)
            )),
            AdoptError::Insert(error) => Self::insert(error),
        }
    }

    /// `fork`
    pub fn fork(sandbox_id: &str, error: &ForkError) -> Self {
        match error {
            ForkError::NotLaunch => Self::needs_launch_mode("fork"),
            ForkError::Count { count, max } => Self::new(format!(
                "count must be between 1 and {max} (this server's max_fork_count, which the \
                 user raises by starting it with --max-fork-count or SANDBOX_MAX_FORK_COUNT); \
                 got {count}. Call fork with a count in that range, several times if you need \
                 more children."
            )),
            ForkError::Lookup(error) => Self::unknown(error),
            ForkError::NoRoom { wanted, error } => Self::no_room("fork", *wanted, error),
            ForkError::Capture(error) => Self::capture("fork", sandbox_id, error),
            ForkError::Children(error) => Self::adopt(error),
        }
    }

    /// `checkpoint`
    pub fn checkpoint(sandbox_id: &str, error: &CheckpointError) -> Self {
        match error {
            CheckpointError::NotLaunch => Self::needs_launch_mode("checkpoint"),
            CheckpointError::Name(error) => Self::snapshot("checkpoint", error),
            CheckpointError::Lookup(error) => Self::unknown(error),
            CheckpointError::Capture(error) => Self::capture("checkpoint", sandbox_id, error),
        }
    }

    /// A branch of a checkpoint that failed, for `tool`.
    pub fn branch(tool: &str, error: &BranchError) -> Self {
        match error {
            BranchError::NotLaunch => Self::needs_launch_mode(tool),
            BranchError::EmptyKey => {
                Self::new("checkpoint_id is empty: pass an id from checkpoint or list_checkpoints.")
            }
            BranchError::Find(error) | BranchError::Branch(error) => Self::snapshot(tool, error),
            BranchError::NoRoom { wanted, error } => Self::no_room(tool, *wanted, error.as_ref()),
            BranchError::Children(error) => Self::adopt(error),
            BranchError::Draining => Self::new(
                "The node is draining: it takes no new claims. Use the sandboxes you hold, or \
                 ask its operator to end the drain.",
            ),
        }
    }

    /// `list_checkpoints`
    pub fn list_checkpoints(error: &ListCheckpointsError) -> Self {
        match error {
            ListCheckpointsError::NotLaunch => Self::needs_launch_mode("list_checkpoints"),
            ListCheckpointsError::List(error) => Self::snapshot("list_checkpoints", error),
        }
    }

    /// `delete_checkpoint`
    pub fn delete_checkpoint(error: &DeleteCheckpointError) -> Self {
        match error {
            DeleteCheckpointError::NotLaunch => Self::needs_launch_mode("delete_checkpoint"),
            DeleteCheckpointError::Find(error) | DeleteCheckpointError::Delete(error) => {
                Self::snapshot("delete_checkpoint", error)
            }
            DeleteCheckpointError::InUse { id, users } => Self::new(format!(
                "Checkpoint {id} is in use by {}, and is kept while they live. Release those \
                 sandboxes first (release), then call delete_checkpoint again.",
                users
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// `hibernate`
    pub fn hibernate(sandbox_id: &str, error: &HibernateOpError) -> Self {
        match error {
            HibernateOpError::Lookup(error) => Self::unknown(error),
            HibernateOpError::Hibernate(error) => Self::hibernation(sandbox_id, error),
        }
    }

    /// `promote`
    pub fn promote(sandbox_id: &str, error: &PromoteError) -> Self {
        match error {
            PromoteError::NotLaunch => Self::needs_launch_mode("promote"),
            PromoteError::Name(error) => Self::snapshot("promote", error),
            PromoteError::Default(name) => Self::new(format!(
                "{name:?} is this server's default template (its warm pool serves it) and \
                 cannot be replaced by promote. Call promote with another template name."
            )),
            PromoteError::Built(name) => Self::new(format!(
                "{name:?} is a built template, not one made by promote, and promote does \
                 not replace it. Call promote with another template name (node_info lists \
                 the templates)."
            )),
            PromoteError::Lookup(error) => Self::unknown(error),
            PromoteError::Capture(error) => Self::capture("promote", sandbox_id, error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_count_past_the_limit_names_the_flag_that_raises_it() {
        let error = ToolError::fork(
            "sbx-1",
            &sandbox_engine::error::ForkError::Count { count: 99, max: 16 },
        );
        assert!(
            error.message.contains("--max-fork-count"),
            "{}",
            error.message
        );
    }

    #[test]
    fn an_unknown_checkpoint_names_the_listing_tool() {
        let error = ToolError::snapshot(
            "branch_checkpoint",
            &SnapshotError::NoCheckpoint("nope".into()),
        );
        assert!(error.message.starts_with("Unknown checkpoint_id \"nope\""));
        assert!(
            error.message.contains("list_checkpoints"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_sandbox_that_cannot_wake_for_room_is_told_how_to_make_some() {
        let error = Unreachable::Wake(WakeError::Capacity("All 2 sandboxes are claimed".into()));
        let tool = ToolError::unreachable(Op::Command, "sbx-1", &error);
        assert!(tool.message.contains("hibernated"), "{}", tool.message);
        assert!(tool.message.contains("release"), "{}", tool.message);
        assert!(tool.message.contains("All 2 sandboxes"), "{}", tool.message);
    }
}
