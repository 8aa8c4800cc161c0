//! Ordinary tool failures: [`ToolError`] becomes an `isError` result whose text
//! says what went wrong and what to do next. Protocol errors are reserved for
//! requests the server cannot route at all.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use sandbox_protocol::ErrorKind;
use sandbox_vmm::client::ClientError;

use crate::pool::ClaimError;
use crate::registry::{Gone, Lookup};
use crate::render::rfc3339;
use sandbox_vmm::error_chain;

/// A tool call that failed in an ordinary way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// What happened and what to do next.
    pub message: String,
}

impl ToolError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The `isError` result.
    pub fn into_result(self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(self.message)])
    }

    /// An id the session does not hold.
    pub fn lookup(id: &str, why: &Lookup, live: &[String]) -> Self {
        let live = if live.is_empty() {
            "none".to_owned()
        } else {
            live.join(", ")
        };
        let message = match why {
            Lookup::Unknown => format!(
                "Unknown sandbox_id {id:?}. Live sandboxes: {live}. Use one of those, or call \
                 create_sandbox for a new one."
            ),
            Lookup::Gone(Gone::Released) => format!(
                "Unknown sandbox_id {id:?}: it was released and its VM destroyed. Live \
                 sandboxes: {live}. Call create_sandbox for a new one."
            ),
            Lookup::Gone(Gone::Expired(at)) => format!(
                "Unknown sandbox_id {id:?}: its TTL ran out at {} and its VM was destroyed. \
                 Live sandboxes: {live}. Call create_sandbox for a new one (pass a larger \
                 ttl_seconds if you need longer).",
                rfc3339(*at)
            ),
            Lookup::Closed => "The server is shutting down; no sandbox is available.".to_owned(),
        };
        Self::new(message)
    }

    /// A claim that failed.
    pub fn claim<E: std::error::Error + 'static>(template: &str, error: &ClaimError<E>) -> Self {
        let text = error_chain(error);
        let message = match error {
            ClaimError::AtCapacity { .. } => format!(
                "{text}. Release a sandbox you no longer need (release tool) and try again; \
                 node_info lists the live claims."
            ),
            ClaimError::Closed => text,
            _ => format!(
                "Could not start a sandbox from template {template:?}: {text}. Check the \
                 template name against node_info's templates; if this persists, the host \
                 cannot boot VMs right now."
            ),
        };
        Self::new(message)
    }

    /// A request the sandbox's agent failed; `op` names the tool for the hints.
    pub fn agent(op: Op, sandbox_id: &str, error: &ClientError) -> Self {
        let text = error_chain(error);
        let hint = match (op, error.wire_kind()) {
            (Op::Wait, Some(kind)) => wait_hint(kind),
            (Op::Wait, None) => UNREACHABLE,
            (_, kind) => other_hint(op, kind),
        };
        let message = if hint.is_empty() {
            format!("{} failed in sandbox {sandbox_id}: {text}", op.name())
        } else {
            format!(
                "{} failed in sandbox {sandbox_id}: {text}. {hint}",
                op.name()
            )
        };
        Self::new(message)
    }
}

/// What to do after a failed `wait_for_text`.
fn wait_hint(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::TimedOut => {
            "The text did not appear in time: call wait_for_text again to keep waiting \
             (timeout_seconds up to 300), or look at what is there with logs or read_file."
        }
        ErrorKind::NotFound => {
            "A process that exited without the text: read its output with logs; an unknown \
             pid: call ps (exited processes are forgotten 5 minutes after they exit)."
        }
        ErrorKind::WrongType => {
            "wait_for_text reads regular files: not a directory, device or pipe, and every \
             directory on the path must be one."
        }
        ErrorKind::TooLarge => "Wait for a shorter text (at most 4096 bytes).",
        ErrorKind::BadRequest => {
            "Check the arguments: an absolute path, a non-empty text, timeout_seconds at \
             most 300."
        }
        ErrorKind::Busy => "Too many waits run at once in this sandbox; try again shortly.",
        ErrorKind::Unsupported => {
            "This sandbox's agent predates wait_for_text: poll with logs or read_file."
        }
        _ => "",
    }
}

/// What to do after another failed request.
fn other_hint(op: Op, kind: Option<ErrorKind>) -> &'static str {
    match kind {
        Some(ErrorKind::NotFound) => match op {
            Op::Process => {
                "Call ps to list tracked processes; exited ones are forgotten 5 minutes \
                     after they exit."
            }
            Op::File => "Check the path with list_dir.",
            Op::Command => "Check the command and cwd (cwd must exist).",
            Op::Session => {
                "Call eval_code again with restart: true for a fresh session (what the \
                 old one defined is gone), or use language \"sh\" where the sandbox has \
                 no python3."
            }
            Op::Wait | Op::Other => "",
        },
        Some(ErrorKind::WrongType) if op == Op::Session => {
            "Each session has one language: pick another session name for this one."
        }
        Some(ErrorKind::Busy) if op == Op::Session => {
            "The sandbox runs the most sessions it keeps: kill the pid of one you no \
             longer need (ps lists them as kind session)."
        }
        Some(ErrorKind::TooLarge) => {
            "read_file returns at most 1 MiB: read parts with exec (head -c, tail -c, \
                 sed -n, grep)."
        }
        Some(ErrorKind::WrongType) => {
            "read_file reads regular files: use list_dir for a directory, and exec for \
                 devices or pipes."
        }
        Some(ErrorKind::PermissionDenied) => "The sandbox user may not do this.",
        Some(ErrorKind::BadRequest) => "Check the arguments (paths must be absolute).",
        Some(ErrorKind::Busy) => "The sandbox is at a limit; wait or stop processes with kill.",
        Some(_) => "",
        None => UNREACHABLE,
    }
}

/// The hint when the agent did not answer at all.
const UNREACHABLE: &str = "The sandbox's agent is unreachable (the VM may have crashed or been \
     destroyed): release it and call create_sandbox for a new one.";

/// What kind of request failed, for hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// exec, spawn.
    Command,
    /// logs, kill.
    Process,
    /// read_file, write_file, list_dir.
    File,
    /// wait_for_text.
    Wait,
    /// eval_code.
    Session,
    /// Anything else.
    Other,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::Command => "The command",
            Self::Process => "The process request",
            Self::File => "The file request",
            Self::Wait => "The wait",
            Self::Session => "The evaluation",
            Self::Other => "The request",
        }
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(self.into_result().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::WireError;

    #[test]
    fn a_second_release_is_reported_as_unknown_with_what_to_do() {
        let error = ToolError::lookup("sbx-1", &Lookup::Gone(Gone::Released), &[]);
        assert!(error.message.starts_with("Unknown sandbox_id \"sbx-1\""));
        assert!(error.message.contains("create_sandbox"));
        let error = ToolError::lookup("x", &Lookup::Unknown, &["a".into(), "b".into()]);
        assert!(error.message.contains("Live sandboxes: a, b"));
    }

    #[test]
    fn agent_errors_carry_a_hint_for_their_kind() {
        let error = ClientError::Agent(WireError::new(ErrorKind::TooLarge, "/big is 2 MiB"));
        let tool = ToolError::agent(Op::File, "s", &error);
        assert!(tool.message.contains("/big is 2 MiB"), "{}", tool.message);
        assert!(tool.message.contains("head -c"), "{}", tool.message);
        let lost = ClientError::ConnectionLost {
            reason: "reset".into(),
        };
        let tool = ToolError::agent(Op::Command, "s", &lost);
        assert!(tool.message.contains("release it"), "{}", tool.message);
    }

    #[test]
    fn a_failed_wait_says_how_to_go_on() {
        let timed_out = ClientError::Agent(WireError::new(ErrorKind::TimedOut, "Timed out"));
        let tool = ToolError::agent(Op::Wait, "s", &timed_out);
        assert!(
            tool.message
                .starts_with("The wait failed in sandbox s: timed_out: Timed out."),
            "{}",
            tool.message
        );
        assert!(
            tool.message.contains("call wait_for_text again"),
            "{}",
            tool.message
        );
        let big = ClientError::Agent(WireError::new(ErrorKind::TooLarge, "4097 bytes"));
        let tool = ToolError::agent(Op::Wait, "s", &big);
        assert!(!tool.message.contains("read_file"), "{}", tool.message);
    }
}
