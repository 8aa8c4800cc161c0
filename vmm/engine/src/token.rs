//! Per-sandbox tokens: a random secret made with each sandbox, which the
//! `--profile sandstorm` tools hand out once (`spawn_sandboxes`) and require back
//! as `sandbox_token` on the calls that reach the guest.
//!
//! A token is never logged (its `Debug` is redacted), never serialized by a
//! listing, and compared in constant time ([`sandbox_protocol::tokens_equal`], the
//! comparison the agent makes of its own token).
//!
//! This is not the VM's agent token: that one stays with the server (the launcher
//! makes it, and only the server's connection presents it).

use std::fmt;

use sandbox_vmm::launcher::run_dir::random_bytes;

/// Random bytes in a token (rendered as twice as many hex digits).
pub const SANDBOX_TOKEN_BYTES: usize = 32;

/// One sandbox's token.
#[derive(Clone, PartialEq, Eq)]
pub struct SandboxToken(String);

impl SandboxToken {
    /// A fresh token from the kernel's CSPRNG.
    pub fn generate() -> std::io::Result<Self> {
        let mut bytes = [0u8; SANDBOX_TOKEN_BYTES];
        random_bytes(&mut bytes)?;
        Ok(Self(
            bytes.iter().map(|byte| format!("{byte:02x}")).collect(),
        ))
    }

    /// A token read back from a sandbox's record; `None` unless it has the shape
    /// [`SandboxToken::generate`] gives (a record edited by hand is not trusted with
    /// a weaker secret).
    pub fn from_record(token: &str) -> Option<Self> {
        let valid = token.len() == 2 * SANDBOX_TOKEN_BYTES
            && token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| Self(token.to_owned()))
    }

    /// The token, to hand to whoever made the sandbox.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this token, in time independent of where they differ.
    pub fn matches(&self, given: &str) -> bool {
        sandbox_protocol::tokens_equal(given.as_bytes(), self.0.as_bytes())
    }
}

impl fmt::Debug for SandboxToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SandboxToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex_and_match_only_themselves() {
        let one = SandboxToken::generate().unwrap();
        let other = SandboxToken::generate().unwrap();
        assert_eq!(one.reveal().len(), 2 * SANDBOX_TOKEN_BYTES);
        assert!(one.reveal().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(one, other);
        assert!(one.matches(one.reveal()));
        assert!(!one.matches(other.reveal()));
        assert!(!one.matches(""));
        assert!(!one.matches(&one.reveal()[1..]));
    }

    #[test]
    fn a_recorded_token_must_have_the_generated_shape() {
        let one = SandboxToken::generate().unwrap();
        assert_eq!(SandboxToken::from_record(one.reveal()), Some(one.clone()));
        for bad in ["", "abc", &"A".repeat(64), &"g".repeat(64), &"a".repeat(65)] {
            assert_eq!(SandboxToken::from_record(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_token_is_never_in_debug_output() {
        let token = SandboxToken::generate().unwrap();
        let shown = format!("{token:?}");
        assert!(!shown.contains(token.reveal()), "{shown}");
    }
}
