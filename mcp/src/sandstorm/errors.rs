//! Failures of the sandstorm tools in this profile's words: every hint names a tool
//! this profile offers (spawn_sandboxes, list_sandboxes, kill_sandbox,
//! list_snapshots, ping_sandbox), never one of the default profile's.

use sandbox_protocol::ErrorKind;
use sandbox_vmm::client::ClientError;
use sandbox_vmm::error_chain;

use crate::error::ToolError;
use crate::render::rfc3339;
use sandbox_engine::error::BatchError;
use sandbox_engine::pool::ClaimError;
use sandbox_engine::registry::{Gone, Lookup};
use sandbox_engine::sandbox::{Unreachable, WakeError};

/// An id the session does not hold.
pub fn lookup(id: &str, why: &Lookup, live: &[String]) -> ToolError {
    let live = if live.is_empty() {
        "none".to_owned()
    } else {
        live.join(", ")
    };
    ToolError::new(match why {
        Lookup::Unknown => format!(
            "Unknown sandbox_id {id:?}. Live sandboxes: {live}. Use one of those, or call \
             spawn_sandboxes for new ones."
        ),
        Lookup::Gone(Gone::Released) => format!(
            "Sandbox {id:?} was killed (kill_sandbox). Live sandboxes: {live}. Call \
             spawn_sandboxes for new ones."
        ),
        Lookup::Gone(Gone::Expired(at)) => format!(
            "Sandbox {id:?} reached the end of its lifetime at {} and was destroyed. Live \
             sandboxes: {live}. Call spawn_sandboxes for new ones.",
            rfc3339(*at)
        ),
        Lookup::Gone(Gone::Moved) => format!(
            "Sandbox {id:?} was hibernated and handed to another node of the fleet. Live \
             sandboxes here: {live}."
        ),
        Lookup::Closed => "The server is shutting down; no sandbox is available.".to_owned(),
    })
}

/// A call that reaches the guest, made without a token.
pub fn token_missing(id: &str) -> ToolError {
    ToolError::new(format!(
        "sandbox_token is required for sandbox {id}: pass the token spawn_sandboxes \
         returned with it (list_sandboxes and get_sandbox do not show tokens)."
    ))
}

/// A call that reaches the guest, made with another token.
pub fn token_wrong(id: &str) -> ToolError {
    ToolError::new(format!(
        "sandbox_token is not the token of sandbox {id}: pass the token spawn_sandboxes \
         returned with this sandbox (each sandbox has its own)."
    ))
}

/// A batch of sandboxes from a template that was not made.
pub fn batch(error: &BatchError, tag: &str, n: u64) -> ToolError {
    match error {
        BatchError::Attached => ToolError::new(
            "This server is attached to one existing agent and cannot spawn sandboxes.",
        ),
        BatchError::Count { max, .. } => ToolError::new(format!(
            "n must be between 1 and {max} (this server's sandbox limit); got {n}. Call \
             spawn_sandboxes again with a smaller n."
        )),
        BatchError::Spec(error) => ToolError::spec(error),
        BatchError::Insert(error) => ToolError::insert(error),
        BatchError::Draining => ToolError::new(
            "The node is draining: it takes no new sandboxes. Use the ones you hold.",
        ),
        BatchError::Claim(claim) => self::claim(claim, tag, n),
    }
}

/// Capacity or boots that failed `spawn_sandboxes` of `n` from `tag`.
pub fn claim<E: std::error::Error + 'static>(
    error: &ClaimError<E>,
    tag: &str,
    n: u64,
) -> ToolError {
    let text = error_chain(error);
    ToolError::new(match error {
        ClaimError::Short { max, .. } | ClaimError::AtCapacity { max } => format!(
            "No room for {n} more sandboxes: {text}. Nothing was started. kill_sandbox the \
             ones you no longer need (list_sandboxes shows them), or ask for fewer. {}",
            crate::error::raise_limit(*max)
        ),
        ClaimError::Boot(_) => format!(
            "Could not start sandboxes from {tag:?}: {text}. None was kept; try again, or \
             with a smaller n."
        ),
        ClaimError::Closed => text,
    })
}

/// A sandbox whose guest could not be reached by `tool`.
pub fn unreachable(tool: &str, id: &str, error: &Unreachable) -> ToolError {
    match error {
        Unreachable::Agent(error) => agent(tool, id, error),
        Unreachable::Wake(WakeError::Capacity(_)) => ToolError::new(format!(
            "{tool} failed: sandbox {id} is asleep and there is no room to wake it ({}). \
             kill_sandbox one you no longer need, then call {tool} again.",
            error_chain(error)
        )),
        _ => ToolError::new(format!(
            "{tool} failed: sandbox {id} cannot be reached ({}). kill_sandbox it and call \
             spawn_sandboxes for a new one.",
            error_chain(error)
        )),
    }
}

/// A request `tool` made of the sandbox's agent that failed.
pub fn agent(tool: &str, id: &str, error: &ClientError) -> ToolError {
    let text = error_chain(error);
    let hint = match error.wire_kind() {
        None => {
            crate::error::warn_unreachable(id, &text);
            "The sandbox's agent does not answer: if ping_sandbox fails too, kill_sandbox it \
             and call spawn_sandboxes for a new one."
        }
        Some(ErrorKind::NotFound) if tool == "exec_command" => {
            "args[0] must be a program on the sandbox's PATH or an absolute path; for shell \
             syntax pass the command line as one string (\"LINE\") or [\"sh\", \"-c\", \
             \"LINE\"]."
        }
        Some(ErrorKind::PermissionDenied) if tool == "exec_command" => {
            "args[0] is not executable: a file without execute permission, or a directory. \
             Make it executable ([\"chmod\", \"+x\", \"FILE\"]) or run it through its \
             interpreter ([\"sh\", \"FILE\"], [\"python3\", \"FILE\"])."
        }
        Some(ErrorKind::NotFound) if tool == "eval_code" => {
            "eval_code runs Python: spawn sandboxes from a template with python3 \
             (list_snapshots)."
        }
        Some(ErrorKind::WrongType) if tool == "wait_for_text" => {
            "path must be a regular file (or not exist yet), and every directory on it a \
             directory."
        }
        Some(ErrorKind::TooLarge) => "Pass less (a marker is at most 4096 bytes).",
        Some(ErrorKind::BadRequest) => "Check the arguments (paths must be absolute).",
        Some(ErrorKind::Busy) => "The sandbox is at a limit; try again shortly.",
        Some(_) => "",
    };
    ToolError::new(
        format!("{tool} failed in sandbox {id}: {text}. {hint}")
            .trim_end()
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::WireError;

    /// The default profile's tool names, which this profile does not offer.
    const FOREIGN: [&str; 5] = [
        "create_sandbox",
        "release",
        "node_info",
        "logs",
        "checkpoint",
    ];

    fn assert_own_words(error: &ToolError) {
        for name in FOREIGN {
            assert!(
                !error.message.contains(name),
                "{name} named in: {}",
                error.message
            );
        }
    }

    #[test]
    fn hints_name_only_this_profiles_tools() {
        for why in [
            Lookup::Unknown,
            Lookup::Gone(Gone::Released),
            Lookup::Gone(Gone::Expired(std::time::UNIX_EPOCH)),
        ] {
            let error = lookup("sbx-1", &why, &["sbx-2".into()]);
            assert!(
                error.message.contains("spawn_sandboxes"),
                "{}",
                error.message
            );
            assert_own_words(&error);
        }
        assert_own_words(&token_missing("sbx-1"));
        assert_own_words(&token_wrong("sbx-1"));
        let short: ClaimError<std::io::Error> = ClaimError::Short {
            wanted: 3,
            room: 1,
            max: 4,
        };
        let error = claim(&short, "python", 3);
        assert!(error.message.contains("kill_sandbox"), "{}", error.message);
        assert_own_words(&error);
        let lost = ClientError::ConnectionLost {
            reason: "reset".into(),
        };
        let error = agent("exec_command", "sbx-1", &lost);
        assert!(error.message.contains("ping_sandbox"), "{}", error.message);
        assert_own_words(&error);
    }

    #[test]
    fn a_missing_program_says_how_to_name_one() {
        let error = ClientError::Agent(WireError::new(ErrorKind::NotFound, "no such file"));
        let tool = agent("exec_command", "sbx-1", &error);
        assert!(
            tool.message.contains("[\"sh\", \"-c\", \"LINE\"]"),
            "{}",
            tool.message
        );
    }
}
