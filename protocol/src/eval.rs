//! Interpreter sessions: `eval` runs code in a named, long-lived interpreter whose
//! state (variables, imports, open files, the working directory) persists between
//! calls, like a notebook's kernel; `close_session` ends one.
//!
//! A session is started by the first `eval` that names it, or at boot by the
//! template ([`crate::image::ImageConfig::sessions`]), so a template's ready snapshot
//! holds a live, imported interpreter. It shows in `ps` as
//! [`ProcessKind::Session`](crate::ProcessKind::Session) and is killed like any other
//! tracked process. When its interpreter dies the session is dead: `eval` on it fails
//! with `NotFound` unless the request asks for a [`restart`](EvalRequest::restart).

use serde::{Deserialize, Serialize};

use crate::process::{ExitStatus, Pid};

/// Longest session name, in bytes: 1 to this many ASCII letters, digits, `-`, `_`, `.`.
pub const MAX_SESSION_NAME_BYTES: usize = 64;

/// The session `eval` uses when a front end is not told another.
pub const DEFAULT_SESSION: &str = "default";

/// Longest code one `eval` accepts, in bytes (`TooLarge` beyond): a cell, not a data
/// transfer (files go with `put`).
pub const MAX_EVAL_CODE_BYTES: usize = 1024 * 1024;

/// How long an interpreter has, after the interrupt at an evaluation's deadline, to
/// report back before it is killed (and the session with it): the exec deadline's
/// grace, since a loaded emulated guest can take seconds to run a shell's trap. So
/// the reply to an `eval` comes at most this long after its deadline, plus the time
/// to reap.
pub const EVAL_INTERRUPT_GRACE_MS: u64 = 5000;

/// Sessions one agent keeps at once; an `eval` that would start one more fails with
/// `Busy` (close one first).
pub const MAX_SESSIONS: usize = 32;

/// The repr of a trailing expression is cut to this many bytes (`value_truncated`).
pub const EVAL_VALUE_CAP_BYTES: usize = 64 * 1024;

/// An exception's message and traceback are each cut to this many bytes.
pub const EVAL_EXCEPTION_CAP_BYTES: usize = 64 * 1024;

/// The interpreter behind a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// CPython 3 (`python3` in the guest's `PATH`).
    Python,
    /// A POSIX shell (`/bin/sh`): the working directory, variables and functions
    /// persist between calls. `sh` in JSON (the image config) as everywhere else;
    /// `shell` is accepted too. (Postcard carries the variant index, not the name.)
    #[serde(rename = "sh", alias = "shell")]
    Shell,
}

impl Language {
    /// The name used in human and JSON output and accepted by [`Language::parse`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Shell => "sh",
        }
    }

    /// `python` (or `python3`, `py`) and `sh` (or `shell`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "python" | "python3" | "py" => Some(Self::Python),
            "sh" | "shell" => Some(Self::Shell),
            _ => None,
        }
    }
}

/// Whether `name` can name a session: 1 to [`MAX_SESSION_NAME_BYTES`] ASCII letters,
/// digits, `-`, `_` and `.` (it shows in `ps` as an argument of the interpreter).
pub fn is_valid_session_name(name: &str) -> bool {
    (1..=MAX_SESSION_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Evaluate `code` in the session `session`, starting it if it does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalRequest {
    /// The session's name (see [`MAX_SESSION_NAME_BYTES`]).
    pub session: String,
    /// Its language. A session that exists with another language is `WrongType`.
    pub language: Language,
    /// The code: a Python cell (its trailing expression's value is returned), or
    /// shell commands.
    pub code: String,
    /// Deadline in milliseconds; `None` or anything above the maximum means
    /// [`crate::limits::EXEC_DEADLINE_SECS`]. At the deadline the evaluation is
    /// interrupted (SIGINT: Python raises `KeyboardInterrupt`) and the session lives
    /// on; an interpreter that does not come back from the interrupt is killed.
    pub timeout_ms: Option<u64>,
    /// When the named session's interpreter has died: start a fresh one (`true`) or
    /// fail with `NotFound` (`false`), so state is never lost silently.
    pub restart: bool,
}

/// An exception raised by evaluated code (Python), as the interpreter reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalException {
    /// Its type's qualified name, e.g. `ZeroDivisionError` or `json.decoder.JSONDecodeError`.
    pub type_name: String,
    /// `str(exception)`.
    pub message: String,
    /// The formatted traceback, without the driver's own frames.
    pub traceback: String,
}

/// A session as an `eval` found or left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Its name.
    pub name: String,
    /// Its language.
    pub language: Language,
    /// The interpreter's pid (tracked: `ps`, `kill`).
    pub pid: Pid,
    /// This request started the interpreter (the first use of the name, or a restart).
    pub started: bool,
    /// Evaluations the session has run, this one included.
    pub evaluations: u64,
}

/// The reply to an [`EvalRequest`]. Output is capped like an exec's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalReply {
    /// The session after the evaluation.
    pub session: SessionInfo,
    /// The first [`crate::limits::EXEC_OUTPUT_CAP_BYTES`] of what the code wrote to stdout.
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    /// The first [`crate::limits::EXEC_OUTPUT_CAP_BYTES`] of what it wrote to stderr.
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    /// Stdout went past the cap.
    pub stdout_truncated: bool,
    /// Stderr went past the cap.
    pub stderr_truncated: bool,
    /// Python: the repr of the cell's trailing expression when it is not `None`.
    pub value: Option<String>,
    /// The repr went past [`EVAL_VALUE_CAP_BYTES`].
    pub value_truncated: bool,
    /// Python: the exception the code raised (a timeout's `KeyboardInterrupt` too).
    pub exception: Option<EvalException>,
    /// Shell: the status of the last command (`$?`).
    pub status: Option<i32>,
    /// The deadline passed and the evaluation was interrupted.
    pub timed_out: bool,
    /// The interpreter ended during the evaluation (the code exited it, it crashed,
    /// or it was killed after not coming back from the interrupt): how. The session
    /// is dead from now on.
    pub died: Option<ExitStatus>,
    /// Wall time of the evaluation in milliseconds (not the interpreter's start).
    pub duration_ms: u64,
}

/// End a session: its interpreter and everything it started are killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseSessionRequest {
    /// The session's name.
    pub session: String,
}

/// A session a template starts at boot, so it is warm before the first `eval`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmSession {
    /// The session's name (`default` is the one `eval` uses unless told otherwise).
    pub name: String,
    /// Its language.
    pub language: Language,
    /// Code run once at start, e.g. `import json, numpy`. Its failure is logged and
    /// the session stays up.
    #[serde(default)]
    pub setup: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_short_and_plain() {
        assert!(is_valid_session_name("default"));
        assert!(is_valid_session_name("a.b-c_9"));
        assert!(is_valid_session_name(&"x".repeat(MAX_SESSION_NAME_BYTES)));
        for bad in ["", " ", "a b", "a/b", "é", "a\0", "a\n"] {
            assert!(!is_valid_session_name(bad), "{bad:?}");
        }
        assert!(!is_valid_session_name(
            &"x".repeat(MAX_SESSION_NAME_BYTES + 1)
        ));
    }

    #[test]
    fn json_names_the_languages_as_people_do() {
        // The image config is JSON written by hand or by the template builder.
        assert_eq!(serde_json::to_string(&Language::Shell).unwrap(), "\"sh\"");
        assert_eq!(
            serde_json::to_string(&Language::Python).unwrap(),
            "\"python\""
        );
        for (json, language) in [
            ("\"sh\"", Language::Shell),
            ("\"shell\"", Language::Shell),
            ("\"python\"", Language::Python),
        ] {
            assert_eq!(serde_json::from_str::<Language>(json).unwrap(), language);
        }
    }

    #[test]
    fn languages_parse_by_their_names_and_aliases() {
        for language in [Language::Python, Language::Shell] {
            assert_eq!(Language::parse(language.as_str()), Some(language));
        }
        assert_eq!(Language::parse("python3"), Some(Language::Python));
        assert_eq!(Language::parse("shell"), Some(Language::Shell));
        assert_eq!(Language::parse("ruby"), None);
    }
}
