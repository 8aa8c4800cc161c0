//! Process output: chunks tagged with their stream and absolute byte offsets, and
//! the `logs` request that replays and follows them.
//!
//! Every tracked process has one output ring. Each byte ever written to it has an
//! absolute offset that only grows, so a client that remembers a cursor can come back
//! later and get exactly what it has not seen yet: nothing twice, and anything lost to
//! the ring wrapping reported as a count of dropped bytes.

use serde::{Deserialize, Serialize};

use crate::process::{ExitStatus, Pid};

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// A terminal's output (stdout and stderr are one stream there).
    Pty,
}

/// A run of bytes from one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// The stream it came from.
    pub stream: Stream,
    /// Absolute offset of `data[0]` in the process's output.
    pub offset: u64,
    /// The bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Replay a process's output, and optionally follow it until the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsRequest {
    /// The tracked process.
    pub pid: Pid,
    /// Start from this absolute offset. `None` means offset 0: the reply starts at the
    /// oldest byte still held, and `dropped` says how much was lost before it.
    pub cursor: Option<u64>,
    /// Keep streaming [`crate::Event::Logs`] events until the process has ended and
    /// its output is drained, then reply.
    pub follow: bool,
}

/// A slice of a process's output starting at the requested cursor.
///
/// `dropped + sum(chunk lengths)` always equals `end - cursor`: bytes are either
/// delivered or counted as dropped, never silently skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsBatch {
    /// Chunks in the order they were written.
    pub chunks: Vec<OutputChunk>,
    /// Bytes between the cursor and the first chunk that the ring no longer holds.
    pub dropped: u64,
    /// The cursor to ask for next: one past the last byte in `chunks`.
    pub end: u64,
}

/// The final reply to a [`LogsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsReply {
    /// Output from the cursor (when following: what came after the last event).
    pub batch: LogsBatch,
    /// The exit status once the process has ended.
    pub exit: Option<ExitStatus>,
}
