//! Failures of the snapshot tools, and of waking a hibernated sandbox, as
//! [`ToolError`]s: what went wrong, then the tool to call next.

use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::snapshot::SnapshotError;

use crate::error::{Op, ToolError};
use crate::pool::ClaimError;
use crate::sandbox::{HibernateError, Unreachable, WakeError};

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

#[cfg(test)]
mod tests {
    use super::*;

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
