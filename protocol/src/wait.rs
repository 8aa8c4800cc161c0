//! `wait_for_text`: wait until a file, or a tracked process's output, contains a
//! string. The agent watches (inotify on a file and its directory; the output ring of
//! a process) instead of polling through a shell, so a file that does not exist yet,
//! is replaced by a rename or is appended to is seen as soon as it changes.

use serde::{Deserialize, Serialize};

use crate::output::Stream;
use crate::process::Pid;

/// Longest text `wait_for_text` accepts, in bytes.
pub const MAX_WAIT_TEXT_BYTES: usize = 4096;

/// The deadline when a request names none, in milliseconds.
pub const WAIT_DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// The longest deadline, in milliseconds; a longer one is a `BadRequest`.
pub const WAIT_MAX_TIMEOUT_MS: u64 = 5 * 60 * 1000;

/// The line around a match is cut to this many bytes.
pub const WAIT_LINE_CAP_BYTES: usize = 4096;

/// Where to look for the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitTarget {
    /// A regular file in the guest, by absolute path; it may not exist yet.
    File(String),
    /// The output of a tracked process (stdout and stderr, or its terminal), as far
    /// back as its output ring still holds.
    Output(Pid),
}

/// Wait until `target` contains `text`; reply [`crate::Reply::TextFound`], or
/// `TimedOut` at the deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitForTextRequest {
    /// Where to look.
    pub target: WaitTarget,
    /// The exact bytes to find (UTF-8, 1 to [`MAX_WAIT_TEXT_BYTES`]).
    pub text: String,
    /// Deadline in milliseconds: `None` is [`WAIT_DEFAULT_TIMEOUT_MS`], more than
    /// [`WAIT_MAX_TIMEOUT_MS`] is a `BadRequest`.
    pub timeout_ms: Option<u64>,
}

/// Where the text was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextFound {
    /// Byte offset of the match's first byte: in the file, or in the process's
    /// output stream (the offsets `logs` reports).
    pub offset: u64,
    /// For a process: the stream the match is in.
    pub stream: Option<Stream>,
    /// The line holding the match (lossy UTF-8, at most [`WAIT_LINE_CAP_BYTES`]).
    pub line: String,
    /// How long the agent waited, in milliseconds (0 when the text was already there).
    pub waited_ms: u64,
}
