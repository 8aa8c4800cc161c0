//! Errors as they cross the wire: a typed kind, a message for people, and the
//! errno when the failure came from a system call.

use serde::{Deserialize, Serialize};

/// What went wrong, in a form a program can branch on.
///
/// Append new kinds at the end; never reorder (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request was malformed or its arguments are invalid.
    BadRequest,
    /// The process, file or request named does not exist.
    NotFound,
    /// The operating system refused the operation.
    PermissionDenied,
    /// A size limit was exceeded; the message names the limit.
    TooLarge,
    /// A deadline passed.
    TimedOut,
    /// The agent does not implement this request.
    Unsupported,
    /// A bug or an unexpected system failure in the agent.
    Internal,
    /// The client and agent speak different protocol versions.
    VersionMismatch,
    /// The token in `Hello` was missing or wrong.
    Unauthorized,
    /// The request was cancelled by the client.
    Cancelled,
    /// The target already exists.
    AlreadyExists,
    /// The operation needs a different kind of object (e.g. a directory, not a file).
    WrongType,
    /// The agent is at a capacity limit (connections, processes).
    Busy,
    /// The object changed underneath the operation (a file rewritten while it was
    /// read); trying again may succeed.
    Conflict,
    /// Nothing listens on the guest port a `PortForward` named.
    NotListening,
}

impl ErrorKind {
    /// The snake_case name used in human and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::NotFound => "not_found",
            Self::PermissionDenied => "permission_denied",
            Self::TooLarge => "too_large",
            Self::TimedOut => "timed_out",
            Self::Unsupported => "unsupported",
            Self::Internal => "internal",
            Self::VersionMismatch => "version_mismatch",
            Self::Unauthorized => "unauthorized",
            Self::Cancelled => "cancelled",
            Self::AlreadyExists => "already_exists",
            Self::WrongType => "wrong_type",
            Self::Busy => "busy",
            Self::Conflict => "conflict",
            Self::NotListening => "not_listening",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed request, as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}{}", errno.map(|e| format!(" (errno {e})")).unwrap_or_default())]
pub struct WireError {
    /// What kind of failure this is.
    pub kind: ErrorKind,
    /// A short explanation for people, naming the limit or the reason.
    pub message: String,
    /// The OS error number when a system call failed.
    pub errno: Option<i32>,
}

impl WireError {
    /// An error without an errno.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            errno: None,
        }
    }

    /// Maps an I/O error onto a kind, keeping its errno; `context` says what was being done.
    pub fn from_io(context: impl std::fmt::Display, error: &std::io::Error) -> Self {
        use std::io::ErrorKind as Io;
        let kind = match error.kind() {
            Io::NotFound => ErrorKind::NotFound,
            Io::PermissionDenied => ErrorKind::PermissionDenied,
            Io::AlreadyExists => ErrorKind::AlreadyExists,
            Io::InvalidInput | Io::InvalidData => ErrorKind::BadRequest,
            Io::TimedOut => ErrorKind::TimedOut,
            Io::Unsupported => ErrorKind::Unsupported,
            Io::IsADirectory | Io::NotADirectory => ErrorKind::WrongType,
            // EAGAIN: out of processes or threads (fork or clone under pid
            // exhaustion), or a resource busy for now. Worth another try, not a bug.
            Io::WouldBlock => ErrorKind::Busy,
            _ => ErrorKind::Internal,
        };
        Self {
            kind,
            message: format!("{context}: {error}"),
            errno: error.raw_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_message_and_errno() {
        let err = WireError {
            kind: ErrorKind::NotFound,
            message: "no such pid 7".into(),
            errno: Some(3),
        };
        assert_eq!(err.to_string(), "not_found: no such pid 7 (errno 3)");
    }

    /// Regression (issue 22, item 9): under pid exhaustion a fork's EAGAIN came back
    /// as `internal`, which reads as a bug in the agent.
    #[test]
    fn eagain_is_busy_not_internal() {
        let io = std::io::Error::from_raw_os_error(libc_eagain());
        let err = WireError::from_io("fork", &io);
        assert_eq!(err.kind, ErrorKind::Busy);
        assert_eq!(err.errno, Some(libc_eagain()));
    }

    /// EAGAIN on Linux (the crate has no libc dependency).
    fn libc_eagain() -> i32 {
        11
    }

    #[test]
    fn io_errors_keep_their_errno() {
        let io = std::io::Error::from_raw_os_error(2);
        let err = WireError::from_io("open /nope", &io);
        assert_eq!(err.kind, ErrorKind::NotFound);
        assert_eq!(err.errno, Some(2));
        assert!(err.message.starts_with("open /nope: "));
    }
}
