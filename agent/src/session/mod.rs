//! Interpreter sessions (`eval`, `close_session`): a named, long-lived Python or sh
//! interpreter whose state persists between evaluations, like a notebook's kernel.
//!
//! # How it fits together
//! A session is an interpreter started through the same launch path as every exec
//! (its own process group and cgroup, the template's environment, a row of kind
//! `session` in `ps`, killable by pid). Three channels connect it to the agent:
//! - **control**: a Unix socket pair; the child's end is its fd 0, which the driver
//!   moves to a private descriptor at once (fd 0 becomes `/dev/null`, so code that
//!   reads stdin reads nothing, and subprocesses never inherit the socket). Requests
//!   and replies are framed by length or by line ([`control`]).
//! - **stdout and stderr**: the same two pipes for the interpreter's whole life, so
//!   what a cell prints by any route (`print`, `os.system`, a subprocess writing to
//!   fd 1) is captured; an evaluation's share ends at a random marker sent only
//!   after the code finished ([`tap`]).
//!
//! The drivers (`driver.py`, `driver.sh`) are compiled into the agent and handed to
//! the interpreter through the control socket ([`driver`]): a template needs
//! nothing but `python3` or `/bin/sh`.
//!
//! # Layout
//! - [`registry`]: sessions by name, the live cap, what died, opening and closing.
//! - [`interpreter`]: one session: its start, the evaluation flow with its deadline,
//!   interrupt and kill, reseeding.
//! - [`driver`], [`control`], [`tap`]: the languages, the control channel, the output.
//! - [`requests`]: the `eval` and `close_session` handlers.
//! - [`warm`]: the template's boot sessions, and reseeding after a restore or fork.
//!
//! # Decisions
//! - Evaluations of one session run one at a time, in arrival order: a second
//!   `eval` waits for the first, as a notebook queues cells (its deadline counts from
//!   when it runs). Other sessions are not held up.
//! - A request that goes away (cancel, a dropped connection) interrupts its cell as a
//!   timeout would; the session lives on, in step.
//! - A session whose interpreter died stays known as dead (how it died) until an
//!   `eval` with `restart` replaces it or `close_session` forgets it, so state is
//!   never lost silently; at most [`MAX_SESSIONS`] dead ones are remembered, the
//!   oldest forgotten first. Only live sessions count against [`MAX_SESSIONS`].

pub mod control;
pub mod driver;
pub mod interpreter;
pub mod registry;
pub mod requests;
pub mod tap;
pub mod warm;

pub use registry::Sessions;

use sandbox_protocol::eval::{MAX_EVAL_CODE_BYTES, MAX_SESSIONS, MAX_SESSION_NAME_BYTES};
use sandbox_protocol::{ErrorKind, Language, WireError};

use crate::process::ProcessError;

/// How long a new interpreter has to load its driver: Python starts in tens of
/// milliseconds natively, in a second or two under emulation (TCG).
pub const DRIVER_START_SECS: u64 = 30;

/// How long a killed interpreter has to be reaped before the agent stops waiting.
pub const REAP_WAIT_SECS: u64 = 5;

/// The deadline of a boot session's setup code: it holds up the agent's readiness,
/// but `import torch` under emulation takes a while.
pub const WARM_SETUP_SECS: u64 = 120;

/// How much of a refused session name an error message shows.
const SHOWN_NAME_CHARS: usize = 80;

/// Why a session request failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Not a name a session can have.
    #[error(
        "Invalid session name {shown:?}: use 1 to {MAX_SESSION_NAME_BYTES} ASCII letters, \
         digits, '-', '_' and '.'"
    )]
    InvalidName {
        /// The name, cut to a readable length.
        shown: String,
    },
    /// More code than one evaluation takes.
    #[error("The code has {len} bytes; an evaluation takes at most {MAX_EVAL_CODE_BYTES}")]
    CodeTooLarge {
        /// Its length.
        len: usize,
    },
    /// Shell code travels as lines of text.
    #[error("Shell code cannot hold a NUL byte")]
    NulInShellCode,
    /// The session exists with another language.
    #[error("Session {name:?} is a {existing} session, not {asked}; use another name")]
    WrongLanguage {
        /// The session.
        name: String,
        /// Its language.
        existing: Language,
        /// The language asked for.
        asked: Language,
    },
    /// Its interpreter ended, and with it the session's state.
    #[error(
        "Session {name:?} is dead: its interpreter {how}, and its state is gone. Evaluate \
         with restart to start a fresh one, or close it"
    )]
    Died {
        /// The session.
        name: String,
        /// How it ended.
        how: String,
    },
    /// No session by that name, live or dead.
    #[error("No session {name:?}")]
    Unknown {
        /// The name.
        name: String,
    },
    /// The live-session cap is reached.
    #[error("{MAX_SESSIONS} sessions are running, the most an agent keeps; close one first")]
    TooMany,
    /// The control channel could not be made.
    #[error("Cannot make the control channel of session {name:?}")]
    Channel {
        /// The session.
        name: String,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// The interpreter could not be started (`python3` missing, a bad working
    /// directory or user in the template).
    #[error("Cannot start the {language} interpreter of session {name:?}")]
    Start {
        /// The session.
        name: String,
        /// Its language.
        language: Language,
        /// Why.
        #[source]
        error: ProcessError,
    },
    /// The interpreter started but did not run the driver (a Python 2 named
    /// `python3`, a broken installation).
    #[error("The {language} interpreter of session {name:?} did not load its driver: {reason}")]
    Driver {
        /// The session.
        name: String,
        /// Its language.
        language: Language,
        /// What happened, with what it printed.
        reason: String,
    },
    /// The request went away before its evaluation began.
    #[error("The evaluation was cancelled before it began")]
    Cancelled,
    /// The evaluation's task failed (a bug).
    #[error("The evaluation failed: {0}")]
    Task(String),
}

impl SessionError {
    /// The error as the client sees it.
    pub fn to_wire(&self) -> WireError {
        let kind = match self {
            Self::InvalidName { .. } | Self::NulInShellCode => ErrorKind::BadRequest,
            Self::CodeTooLarge { .. } => ErrorKind::TooLarge,
            Self::WrongLanguage { .. } => ErrorKind::WrongType,
            Self::Died { .. } | Self::Unknown { .. } => ErrorKind::NotFound,
            Self::TooMany => ErrorKind::Busy,
            Self::Cancelled => ErrorKind::Cancelled,
            Self::Driver { .. } | Self::Task(_) => ErrorKind::Internal,
            Self::Channel { error, .. } => return WireError::from_io(self, error),
            Self::Start { error, .. } => {
                let inner = error.to_wire();
                return WireError {
                    kind: inner.kind,
                    message: format!("{self}: {}", inner.message),
                    errno: inner.errno,
                };
            }
        };
        WireError::new(kind, self.to_string())
    }

    /// The error for a name that is not valid.
    pub fn invalid_name(name: &str) -> Self {
        Self::InvalidName {
            shown: name.chars().take(SHOWN_NAME_CHARS).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_kind() {
        let kinds = [
            (SessionError::invalid_name("a b"), ErrorKind::BadRequest),
            (SessionError::NulInShellCode, ErrorKind::BadRequest),
            (SessionError::CodeTooLarge { len: 5 }, ErrorKind::TooLarge),
            (
                SessionError::WrongLanguage {
                    name: "s".into(),
                    existing: Language::Python,
                    asked: Language::Shell,
                },
                ErrorKind::WrongType,
            ),
            (
                SessionError::Died {
                    name: "s".into(),
                    how: "exited with code 0".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                SessionError::Unknown { name: "s".into() },
                ErrorKind::NotFound,
            ),
            (SessionError::TooMany, ErrorKind::Busy),
        ];
        for (error, kind) in kinds {
            assert_eq!(error.to_wire().kind, kind, "{error}");
        }
    }

    #[test]
    fn a_missing_interpreter_is_not_found_and_says_which() {
        let error = SessionError::Start {
            name: "s".into(),
            language: Language::Python,
            error: ProcessError::Start {
                program: "python3".into(),
                error: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "python3 not found in PATH",
                ),
            },
        };
        let wire = error.to_wire();
        assert_eq!(wire.kind, ErrorKind::NotFound);
        assert!(wire.message.contains("python3 not found"), "{wire}");
    }

    #[test]
    fn a_long_bad_name_is_shown_cut() {
        let error = SessionError::invalid_name(&"!".repeat(10_000));
        assert!(error.to_string().len() < 300, "{error}");
    }
}
