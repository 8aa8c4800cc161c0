//! The handshake: the first frame on every connection.
//!
//! `Hello` and `HelloReply` never change shape: `magic` and `version` come first so
//! that any future agent can read them and answer a mismatch with a clear error.

use serde::{Deserialize, Serialize};

/// Identifies this protocol in the first bytes of a `Hello`.
pub const MAGIC: [u8; 4] = *b"SBX1";

/// The protocol version this crate speaks. Bumped only for incompatible changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// Sent by the client as the first frame (request id 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must be [`MAGIC`].
    pub magic: [u8; 4],
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The shared secret, when the agent requires one.
    pub token: Option<String>,
}

impl Hello {
    /// A hello for this crate's protocol version.
    pub fn new(token: Option<String>) -> Self {
        Self {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            token,
        }
    }
}

/// Whether a presented secret equals the expected one, in time that does not depend
/// on where they first differ, so timing reveals no prefix of a token (only whether
/// the lengths match, and tokens have a fixed length).
pub fn tokens_equal(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The agent's answer to a valid [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    /// The agent's protocol version.
    pub version: u32,
    /// The agent's crate version.
    pub agent_version: String,
    /// Random per boot of the agent, so hosts notice a restart.
    pub boot_id: String,
    /// Optional features this agent serves (for example `"pty"`).
    pub capabilities: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_is_exact() {
        assert!(tokens_equal(b"abc", b"abc"));
        assert!(!tokens_equal(b"abc", b"abd"));
        assert!(!tokens_equal(b"abc", b"ab"));
        assert!(!tokens_equal(b"", b"a"));
    }
}
