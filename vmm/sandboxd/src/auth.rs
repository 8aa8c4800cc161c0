//! Who is calling: the operator (the node's token, for node-wide actions and every
//! sandbox), or the holder of one sandbox's token (that sandbox alone).
//!
//! Both come as `Authorization: Bearer TOKEN`; seed 000's clients also put a
//! sandbox's token in the body of `fork`, `checkpoint` and `promote` (`"token"`),
//! which counts the same. Tokens are compared in constant time and never logged or
//! listed. The operator token lives in a file of the operator's (mode 0600 or
//! stricter); a default one is made at first start.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use axum::http::HeaderMap;
use sandbox_engine::sandbox::Sandbox;
use sandbox_protocol::tokens_equal;

/// The shortest operator token accepted from a file.
const MIN_TOKEN_CHARS: usize = 16;

/// Why the operator token cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read (or made).
    #[error("Cannot read the operator token file {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// Others than its owner may read it.
    #[error("The operator token file {path} is readable by others (mode {mode:o}): chmod 600 it")]
    Exposed {
        /// The file.
        path: std::path::PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Too short to be a secret.
    #[error("The operator token in {path} is shorter than {MIN_TOKEN_CHARS} characters")]
    Short {
        /// The file.
        path: std::path::PathBuf,
    },
}

/// The node's operator token.
#[derive(Clone)]
pub struct OperatorToken(String);

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(<redacted>)")
    }
}

impl OperatorToken {
    /// Reads the token from `path`; when `create` and the file is missing, writes a
    /// fresh random one there first (mode 0600, its folder 0700).
    pub fn load(path: &Path, create: bool) -> Result<Self, TokenFileError> {
        let read_error = |error| TokenFileError::Read {
            path: path.to_owned(),
            error,
        };
        if create && !path.exists() {
            if let Some(dir) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(read_error)?;
            }
            let token = sandbox_vmm::launcher::run_dir::generate_token().map_err(read_error)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(read_error)?;
            file.write_all(format!("{token}\n").as_bytes())
                .map_err(read_error)?;
            tracing::info!(path = %path.display(), "made an operator token");
        }
        let meta = std::fs::metadata(path).map_err(read_error)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TokenFileError::Exposed {
                path: path.to_owned(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        let token = text.trim().to_owned();
        if token.chars().count() < MIN_TOKEN_CHARS {
            return Err(TokenFileError::Short {
                path: path.to_owned(),
            });
        }
        Ok(Self(token))
    }

    /// A token for tests.
    #[cfg(test)]
    pub fn for_test(token: &str) -> Self {
        Self(token.to_owned())
    }

    fn matches(&self, given: &str) -> bool {
        tokens_equal(given.as_bytes(), self.0.as_bytes())
    }
}

/// What a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The operator token.
    Operator,
    /// Some other bearer token (maybe a sandbox's: checked against one).
    Bearer,
    /// No token at all.
    Anonymous,
}

/// The bearer token of `headers`, if there is one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// Who `headers` says is calling.
pub fn caller(operator: &OperatorToken, headers: &HeaderMap) -> Caller {
    match bearer(headers) {
        None => Caller::Anonymous,
        Some(token) if operator.matches(token) => Caller::Operator,
        Some(_) => Caller::Bearer,
    }
}

/// Whether a request with `headers` (and, for the verbs that carry one, a body
/// `token`) may act on `sandbox`: the operator, or the sandbox's own token.
pub fn may_use(
    operator: &OperatorToken,
    headers: &HeaderMap,
    body_token: Option<&str>,
    sandbox: &Sandbox,
) -> bool {
    if caller(operator, headers) == Caller::Operator {
        return true;
    }
    let presented = [
        bearer(headers),
        body_token.filter(|token| !token.is_empty()),
    ];
    presented
        .into_iter()
        .flatten()
        .any(|token| sandbox.token.matches(token))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn only_the_operator_token_is_the_operator() {
        let operator = OperatorToken::for_test("0123456789abcdef0123");
        assert_eq!(
            caller(&operator, &headers("Bearer 0123456789abcdef0123")),
            Caller::Operator
        );
        assert_eq!(
            caller(&operator, &headers("bearer 0123456789abcdef0123")),
            Caller::Operator
        );
        assert_eq!(
            caller(&operator, &headers("Bearer 0123456789abcdef012")),
            Caller::Bearer
        );
        assert_eq!(caller(&operator, &headers("Basic abc")), Caller::Anonymous);
        assert_eq!(caller(&operator, &headers("Bearer ")), Caller::Anonymous);
        assert_eq!(caller(&operator, &HeaderMap::new()), Caller::Anonymous);
    }

    #[test]
    fn a_token_file_others_can_read_is_refused_and_a_default_one_is_made_private() {
        let dir = std::env::temp_dir().join(format!("sandboxd-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("token");
        let made = OperatorToken::load(&path, true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = OperatorToken::load(&path, false).unwrap();
        assert!(made.matches(&again.0), "the same token is read back");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = OperatorToken::load(&path, false).unwrap_err();
        assert!(
            matches!(refused, TokenFileError::Exposed { .. }),
            "{refused}"
        );
        assert!(
            !format!("{made:?}").contains(&made.0),
            "the token is never in debug output"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
