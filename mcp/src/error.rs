//! Ordinary tool failures: [`ToolError`] becomes an `isError` result whose text
//! says what went wrong and what to do next. Protocol errors are reserved for
//! requests the server cannot route at all.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use sandbox_protocol::ErrorKind;
use sandbox_vmm::client::ClientError;

use crate::render::rfc3339;
use crate::upload::UploadError;
use sandbox_engine::config::ATTACHED_ID;
use sandbox_engine::error::{CreateError, InsertError, LookupError, NetError, SpecError, TtlError};
use sandbox_engine::image_build::ImageBuildError;
use sandbox_engine::pool::ClaimError;
use sandbox_engine::registry::{Gone, Lookup};
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
            Lookup::Gone(Gone::Moved) => format!(
                "Sandbox {id:?} was hibernated and handed to another node of the fleet, which \
                 wakes it on its next call. Live sandboxes here: {live}."
            ),
            Lookup::Closed => "The server is shutting down; no sandbox is available.".to_owned(),
        };
        Self::new(message)
    }

    /// An id that a session which has ended held: its sandboxes went with it.
    pub fn ended(id: &str, live: &[String]) -> Self {
        let live = if live.is_empty() {
            "none".to_owned()
        } else {
            live.join(", ")
        };
        Self::new(format!(
            "sandbox_id {id:?} belonged to an MCP session that has ended; its sandboxes were \
             released when it disconnected. Live sandboxes of this session: {live}. Call \
             create_sandbox for a new one (a checkpoint outlives its session: \
             branch_checkpoint starts a sandbox from one)."
        ))
    }

    /// A claim that failed.
    pub fn claim<E: std::error::Error + 'static>(template: &str, error: &ClaimError<E>) -> Self {
        let text = error_chain(error);
        let message = match error {
            ClaimError::AtCapacity { max } => format!(
                "{text}. Release a sandbox you no longer need (release tool) and try again; \
                 node_info lists the live claims. {}",
                raise_limit(*max)
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
        let hint = match (op, error) {
            (_, ClientError::Encode(_)) => TOO_LARGE_TO_SEND,
            (Op::Wait, error) => match error.wire_kind() {
                Some(kind) => wait_hint(kind),
                None => UNREACHABLE,
            },
            (_, error) => other_hint(op, error.wire_kind()),
        };
        if hint == UNREACHABLE {
            warn_unreachable(sandbox_id, &text);
        }
        let hint = unsaid(&text, hint);
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

    /// A part of a `write_file` in parts that was refused, or an upload that failed.
    pub fn upload(sandbox_id: &str, error: &UploadError) -> Self {
        match error {
            UploadError::Failed { error: cause, .. } => {
                let agent = Self::agent(Op::Write, sandbox_id, cause);
                Self::new(format!(
                    "{}: {}. Nothing was written; send the file again from offset 0.",
                    capitalized(&error.to_string()),
                    agent.message
                ))
            }
            _ => Self::new(format!("{}.", capitalized(&error.to_string()))),
        }
    }
}

/// The edge between the engine's typed errors and this server's words: what
/// happened, then what to call next.
impl ToolError {
    /// An id the node does not hold.
    pub fn unknown(error: &LookupError) -> Self {
        Self::lookup(&error.id, &error.why, &error.live)
    }

    /// A TTL out of range.
    pub fn ttl(error: &TtlError) -> Self {
        Self::new(format!(
            "ttl_seconds may be at most {} (24 hours); got {}. Pass a smaller value, or 0 \
             for one hour.",
            error.max, error.asked
        ))
    }

    /// A template or size a claim cannot use.
    pub fn spec(error: &SpecError) -> Self {
        Self::new(match error {
            SpecError::UnknownSize(name) => format!(
                "Size {name} is not one the launcher knows; use small, medium, large, xlarge \
                 or 2xlarge."
            ),
            SpecError::Template {
                template,
                error,
                available,
            } => format!(
                "Template {template} cannot be used: {error}. Templates available: {}.",
                available.join(", ")
            ),
        })
    }

    /// A network a claim cannot have.
    pub fn net(error: &NetError) -> Self {
        Self::new(match error {
            NetError::AllowWithoutEgress => "allow applies to net \"egress\" only: pass net \
                 \"egress\" with it, or leave it out."
                .to_owned(),
            NetError::Attached => "The attached agent runs in no VM this server launched, so \
                 it has no egress to give: claim with net \"none\"."
                .to_owned(),
            NetError::NoAllowlist => "This server gives no egress: its operator set no \
                 allowlist (sandbox-mcp --egress-allow ENTRY). Claim with net \"none\"; to get \
                 files in, use write_file."
                .to_owned(),
            NetError::Allow(error) => format!(
                "{error}. Entries are host names, \"*.domain\", \"*\", IP addresses or CIDR \
                 blocks, each with an optional \":port\" or \":low-high\"."
            ),
        })
    }

    /// A sandbox that could not be registered.
    pub fn insert(error: &InsertError) -> Self {
        match error {
            InsertError::Token(cause) => Self::new(format!(
                "Cannot make the sandbox's token: no random bytes from the kernel ({cause}). \
                 Nothing was kept; try again."
            )),
            InsertError::Closed => {
                Self::new("The server is shutting down; no sandbox is available.")
            }
            InsertError::Record(cause) => Self::new(format!(
                "Cannot write the sandbox's record ({}). Nothing was kept; check that \
                 SANDBOX_HOME is writable and not full, then try again.",
                sandbox_vmm::error_chain(cause)
            )),
        }
    }

    /// A `create_sandbox` that failed.
    pub fn create(error: &CreateError) -> Self {
        match error {
            CreateError::Ttl(error) => Self::ttl(error),
            CreateError::Net(error) => Self::net(error),
            CreateError::Spec(error) => Self::spec(error),
            CreateError::Claim { template, error } => Self::claim(template, error),
            CreateError::Insert(error) => Self::insert(error),
            CreateError::AttachedTaken => Self::new(format!(
                "This server is attached to one existing agent, exposed as sandbox_id \
                 {ATTACHED_ID:?}, and it is already yours: pass sandbox_id {ATTACHED_ID:?} to \
                 the other tools. No other sandbox can be created in attach mode."
            )),
            CreateError::Draining => Self::new(
                "The node is draining: it takes no new claims. Use the sandboxes you hold, or \
                 ask its operator to end the drain.",
            ),
            CreateError::Image(error) => Self::image_build(error),
        }
    }

    /// A claim by image reference that did not become a template.
    fn image_build(error: &ImageBuildError) -> Self {
        match error {
            ImageBuildError::Reference { .. } => Self::new(format!(
                "{error}. template takes a template name (list_templates shows them) or an \
                 image reference such as oci://REGISTRY/REPO:TAG."
            )),
            ImageBuildError::NotAllowed { .. } => Self::new(format!(
                "{error}. The user (who starts this server) can allow the registry with \
                 --allow-registry, or run that command; list_templates shows the templates \
                 there are."
            )),
            ImageBuildError::Build { .. } => Self::new(format!(
                "{error}. Nothing was kept; check the reference (its tag, its registry's \
                 credentials) or pass another template."
            )),
            ImageBuildError::Spawn { .. } | ImageBuildError::Output { .. } => Self::new(format!(
                "{}. The server's template builder is not usable: the user can point \
                 --rootfs-builder at sandbox-rootfs.",
                sandbox_vmm::error_chain(error)
            )),
        }
    }
}

impl From<LookupError> for ToolError {
    fn from(error: LookupError) -> Self {
        Self::unknown(&error)
    }
}

impl From<TtlError> for ToolError {
    fn from(error: TtlError) -> Self {
        Self::ttl(&error)
    }
}

/// How the limit of `max` sandboxes is raised: by whoever starts the server (a model
/// cannot), so the refusal names the flag for it to pass on.
pub(crate) fn raise_limit(max: usize) -> String {
    format!(
        "The limit of {max} is the server's --max-sandboxes (or SANDBOX_MAX): the user can \
         start it with a larger one."
    )
}

/// The limit a capacity refusal ran into, if it was one.
pub(crate) fn capacity_limit<E>(error: &ClaimError<E>) -> Option<usize> {
    match error {
        ClaimError::AtCapacity { max } | ClaimError::Short { max, .. } => Some(*max),
        ClaimError::Boot(_) | ClaimError::Closed => None,
    }
}

/// Logs a sandbox whose agent did not answer at all, so the client's log hears of
/// it too (see `crate::logging`): the sandbox is most likely gone for good.
pub(crate) fn warn_unreachable(sandbox_id: &str, text: &str) {
    tracing::warn!(
        sandbox = sandbox_id,
        text,
        "a sandbox's agent did not answer: its VM may have died"
    );
}

/// The sentences of `hint` that `text` does not already say (compared without case
/// and the final stop), so a message never repeats itself.
fn unsaid(text: &str, hint: &str) -> String {
    let said = text.to_lowercase();
    hint.split_inclusive(". ")
        .filter(|sentence| {
            let bare = sentence.trim().trim_end_matches('.').to_lowercase();
            !bare.is_empty() && !said.contains(&bare)
        })
        .collect::<String>()
        .trim_end()
        .to_owned()
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// What to do after a failed `wait_for_text`.
fn wait_hint(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::TimedOut => {
            "The text did not appear in time: call wait_for_text again to keep waiting \
             (timeout_seconds up to 300), or look at what is there with logs or read_file. \
             A program writing to a pipe may hold its output in a buffer: start Python \
             with python3 -u."
        }
        ErrorKind::NotFound => {
            "A process that exited without the text: read its output with logs; an unknown \
             pid: call ps with running_only: false (exited processes are forgotten 5 \
             minutes after they exit)."
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
    let Some(kind) = kind else {
        return UNREACHABLE;
    };
    match (op, kind) {
        (Op::Logs | Op::Kill, ErrorKind::NotFound) => {
            "Call ps with running_only: false to list tracked processes; exited ones are \
             forgotten 5 minutes after they exit."
        }
        (Op::Logs, ErrorKind::BadRequest) => {
            "The cursor is past the end of the output: pass the next_cursor the last logs \
             call returned, or omit cursor for the newest output."
        }
        (Op::Read, ErrorKind::NotFound) => {
            "Check the path with list_dir on its directory (paths are absolute)."
        }
        (Op::Read, ErrorKind::WrongType) => {
            "read_file reads regular files: list a directory with list_dir, and read a \
             device or pipe with exec (e.g. head -c 4096 PATH)."
        }
        (Op::Read, ErrorKind::Conflict) => {
            "The file changed while it was read: call read_file again."
        }
        (Op::Write, ErrorKind::NotFound) => {
            "Create the directory with exec (mkdir -p DIR), then write_file again."
        }
        (Op::Write, ErrorKind::WrongType) => {
            "write_file writes regular files: the path must name a file, not a directory or \
             a device, and every parent on it must be a directory (see list_dir)."
        }
        (Op::List, ErrorKind::NotFound) => {
            "Check the path with list_dir on a parent directory (paths are absolute)."
        }
        (Op::List, ErrorKind::WrongType) => {
            "list_dir lists directories: read a file with read_file."
        }
        (Op::List, ErrorKind::TooLarge) => {
            "The directory has too many entries for one reply: list parts of it with exec \
             (e.g. ls DIR | head -n 1000)."
        }
        (Op::CopyIn, ErrorKind::NotFound) => {
            "Create the directory in the sandbox with exec (mkdir -p DIR), then copy again."
        }
        (Op::CopyIn, ErrorKind::WrongType) => {
            "path must name a file, or an existing directory to copy into, and every parent \
             on it must be a directory (see list_dir)."
        }
        (Op::CopyOut, ErrorKind::NotFound) => {
            "Check the path with list_dir on its directory (paths are absolute)."
        }
        (Op::CopyOut, ErrorKind::WrongType) => {
            "copy_to_host copies regular files: pack a directory first with exec (tar -czf \
             /tmp/dir.tgz -C DIR .) and copy the archive."
        }
        (Op::Command, ErrorKind::NotFound) => "Check the command and cwd (cwd must exist).",
        (Op::Command, ErrorKind::PermissionDenied) => {
            "The program is not executable: a file without execute permission, or a \
             directory. Make it executable (exec chmod +x FILE) or run it through its \
             interpreter (sh FILE, python3 FILE)."
        }
        (Op::Session, ErrorKind::NotFound) => {
            "Here that is eval_code with restart: true (a fresh session, without what the \
             old one defined)."
        }
        (Op::Session, ErrorKind::WrongType) => {
            "Each session has one language: pick another session name for this one."
        }
        (Op::Session, ErrorKind::Busy) => {
            "The sandbox runs the most sessions it keeps: kill the pid of one you no \
             longer need (ps with kind \"session\" lists them)."
        }
        (_, ErrorKind::PermissionDenied) => "The sandbox user may not do this.",
        (_, ErrorKind::Busy) => "The sandbox is at a limit; wait or stop processes with kill.",
        (_, ErrorKind::BadRequest) => "Check the arguments against the tool's description.",
        _ => "",
    }
}

/// The hint when the agent did not answer at all.
const UNREACHABLE: &str = "The sandbox's agent is unreachable (the VM may have crashed or been \
     destroyed): release it and call create_sandbox for a new one.";

/// The hint when a request is over the agent's frame limit: the sandbox is fine.
const TOO_LARGE_TO_SEND: &str = "The request is larger than the 4 MiB one message to the \
     sandbox may carry; the sandbox is fine. Send files with write_file (in parts with offset \
     and more for large ones), and large stdin as a file: write_file it, then exec the \
     command with < FILE.";

/// What kind of request failed, for hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// exec, spawn.
    Command,
    /// logs.
    Logs,
    /// kill, ps.
    Kill,
    /// read_file.
    Read,
    /// write_file.
    Write,
    /// list_dir.
    List,
    /// wait_for_text.
    Wait,
    /// eval_code.
    Session,
    /// copy_from_host (the sandbox side).
    CopyIn,
    /// copy_to_host (the sandbox side).
    CopyOut,
    /// Anything else.
    Other,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::Command => "The command",
            Self::Logs | Self::Kill => "The process request",
            Self::Read => "read_file",
            Self::Write => "write_file",
            Self::List => "list_dir",
            Self::Wait => "The wait",
            Self::Session => "The evaluation",
            Self::CopyIn => "copy_from_host",
            Self::CopyOut => "copy_to_host",
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
        let error = ClientError::Agent(WireError::new(ErrorKind::WrongType, "/x is a file"));
        let tool = ToolError::agent(Op::List, "s", &error);
        assert!(tool.message.contains("/x is a file"), "{}", tool.message);
        assert!(
            tool.message.contains("read a file with read_file"),
            "{}",
            tool.message
        );
        let lost = ClientError::ConnectionLost {
            reason: "reset".into(),
        };
        let tool = ToolError::agent(Op::Command, "s", &lost);
        assert!(tool.message.contains("release it"), "{}", tool.message);
    }

    /// Regression: "The parent directory of ... does not exist. Its parent directory
    /// does not exist: ...", and a non-executable program reported as "The sandbox
    /// user may not do this".
    #[test]
    fn a_message_says_each_thing_once_and_names_a_non_executable_file() {
        let error = ClientError::Agent(WireError::new(
            ErrorKind::NotFound,
            "The parent directory of /a/b does not exist",
        ));
        let tool = ToolError::agent(Op::Write, "s", &error);
        assert_eq!(
            tool.message.matches("does not exist").count(),
            1,
            "{}",
            tool.message
        );
        assert!(tool.message.contains("mkdir -p"), "{}", tool.message);
        let error = ClientError::Agent(WireError::new(
            ErrorKind::PermissionDenied,
            "Cannot start /tmp/run.sh: Permission denied (os error 13)",
        ));
        let tool = ToolError::agent(Op::Command, "s", &error);
        assert!(tool.message.contains("not executable"), "{}", tool.message);
        assert!(
            !tool.message.contains("may not do this"),
            "{}",
            tool.message
        );
        // A hint sentence the agent's text already holds is left out.
        assert_eq!(
            unsaid("It is gone. Try again", "It is gone. Call x."),
            "Call x."
        );
    }

    /// Regression: a refusal at the sandbox limit did not say which flag raises it.
    #[test]
    fn a_refusal_at_the_limit_names_the_flag_that_raises_it() {
        let full: ClaimError<std::io::Error> = ClaimError::AtCapacity { max: 4 };
        let error = ToolError::claim("default", &full);
        assert!(
            error.message.contains("--max-sandboxes"),
            "{}",
            error.message
        );
        let short: ClaimError<std::io::Error> = ClaimError::Short {
            wanted: 3,
            room: 1,
            max: 4,
        };
        let error = ToolError::no_room("fork", 3, &short);
        assert!(
            error.message.contains("start it with a larger one"),
            "{}",
            error.message
        );
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
