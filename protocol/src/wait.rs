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
    /// A regular file in the guest, by absolute path; it, and its directory, may not
    /// exist yet. Raw bytes like every path on the wire (see [`crate::files`]):
    /// Linux paths need not be UTF-8. (Postcard encodes bytes and a string alike, so
    /// a UTF-8 path has the bytes it would have had as a `String`.)
    File(#[serde(with = "serde_bytes")] Vec<u8>),
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
///
/// For a file, the match is the first at or after the offset the agent started
/// scanning from: offset 0, or the start of the file's new content after it was
/// replaced, truncated or rewritten while the agent waited.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the target encoded as before paths became bytes: a UTF-8 path must keep
    /// its bytes on the wire.
    #[derive(Serialize)]
    enum StringTarget {
        File(String),
    }

    #[test]
    fn a_file_target_is_variant_zero_and_encodes_like_the_string_it_replaced() {
        let bytes = postcard::to_allocvec(&WaitTarget::File(b"/a".to_vec())).unwrap();
        assert_eq!(bytes, [0, 2, b'/', b'a']);
        let before = postcard::to_allocvec(&StringTarget::File("/a".into())).unwrap();
        assert_eq!(bytes, before);
        // A path that is not UTF-8 travels as it is.
        let raw = WaitTarget::File(b"/\xff".to_vec());
        let bytes = postcard::to_allocvec(&raw).unwrap();
        assert_eq!(postcard::from_bytes::<WaitTarget>(&bytes).unwrap(), raw);
    }
}
