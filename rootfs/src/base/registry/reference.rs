//! Image references as users type them: `oci://REGISTRY/REPO[:TAG|@sha256:DIGEST]`,
//! and the short forms docker accepts (`python:3.12-slim` is
//! `docker.io/library/python:3.12-slim`; no tag means `latest`). Parsing is the
//! distribution spec's grammar ([`oci_client::Reference`], from `oci-spec`); this
//! module adds the `oci://` scheme, refuses digests other than SHA-256 (the only
//! algorithm the layer cache names files by), and prints references back fully
//! qualified, as a template records them.

use std::fmt;
use std::str::FromStr;

use oci_client::Reference;

/// The scheme that marks a base as a registry image.
pub const SCHEME: &str = "oci://";

/// A reference that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Nothing after `oci://`.
    #[error("Empty image reference")]
    Empty,
    /// The distribution grammar refuses it.
    #[error("{text:?} is not an image reference: {reason}")]
    Grammar {
        /// The reference as given.
        text: String,
        /// What the grammar says.
        reason: String,
    },
    /// A digest with another algorithm than SHA-256.
    #[error("{text:?}: only sha256 digests are supported")]
    DigestAlgorithm {
        /// The reference as given.
        text: String,
    },
}

/// A parsed image reference.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageRef(Reference);

impl fmt::Debug for ImageRef {
    /// As written back (`oci://…`): the build log shows the base this way.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ImageRef").field(&self.to_string()).finish()
    }
}

impl ImageRef {
    /// The client's reference.
    pub fn reference(&self) -> &Reference {
        &self.0
    }

    /// The pinned digest (`@sha256:…`), if the reference names one.
    pub fn digest(&self) -> Option<&str> {
        self.0.digest()
    }

    /// The tag, `latest` when neither a tag nor a digest was given (as docker does).
    pub fn tag(&self) -> Option<&str> {
        match (self.0.tag(), self.0.digest()) {
            (Some(tag), _) => Some(tag),
            (None, None) => Some("latest"),
            (None, Some(_)) => None,
        }
    }

    /// The registry's host (and port) as the client dials it (`index.docker.io`
    /// for Docker Hub).
    pub fn host(&self) -> &str {
        self.0.resolve_registry()
    }

    /// The registry as written (`docker.io`), for credential look-ups.
    pub fn registry(&self) -> &str {
        self.0.registry()
    }

    /// The same repository at `digest`.
    pub fn at_digest(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.0.registry().to_owned(),
            self.0.repository().to_owned(),
            digest.to_owned(),
        )
    }

    /// `registry/repository:tag`, the key a tag's pin is stored under; `None` for a
    /// reference pinned by digest.
    pub fn tag_key(&self) -> Option<String> {
        if self.0.digest().is_some() {
            return None;
        }
        let tag = self.tag()?;
        Some(format!(
            "{}/{}:{tag}",
            self.0.registry(),
            self.0.repository()
        ))
    }

    /// The template a claim naming this reference gets: `oci-`, the reference's
    /// readable part (every character a template name may not hold becomes `-`, cut
    /// at [`TEMPLATE_NAME_READABLE_CHARS`]), and the first 12 hex digits of the
    /// SHA-256 of the fully qualified reference. The readable part alone is not
    /// one-to-one (`a/b-c` and `a-b/c` read alike), the hash makes it so; the same
    /// reference written any way docker accepts (`python:3.12` and
    /// `oci://docker.io/library/python:3.12`) gets the same name.
    pub fn template_name(&self) -> String {
        let canonical = self.to_string();
        let body = canonical.strip_prefix(SCHEME).unwrap_or(&canonical);
        let readable: String = body
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .take(TEMPLATE_NAME_READABLE_CHARS)
            .collect();
        let hash = super::store::sha256_digest(canonical.as_bytes());
        let short = hash
            .strip_prefix("sha256:")
            .and_then(|hex| hex.get(..12))
            .unwrap_or("");
        format!("oci-{readable}-{short}")
    }
}

/// How much of a reference [`ImageRef::template_name`] keeps readable.
pub const TEMPLATE_NAME_READABLE_CHARS: usize = 80;

impl FromStr for ImageRef {
    type Err = ReferenceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let body = text.strip_prefix(SCHEME).unwrap_or(text);
        if body.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let grammar = |reason: String| ReferenceError::Grammar {
            text: text.to_owned(),
            reason,
        };
        // `https://…` or another scheme: the grammar would read `https` as a host.
        if body.contains("://") {
            return Err(grammar(
                "a URL, not a reference (write oci://HOST/REPO:TAG)".into(),
            ));
        }
        let reference = Reference::try_from(body).map_err(|e| grammar(e.to_string()))?;
        if let Some(digest) = reference.digest() {
            if !digest.starts_with("sha256:") {
                return Err(ReferenceError::DigestAlgorithm {
                    text: text.to_owned(),
                });
            }
        }
        Ok(Self(reference))
    }
}

impl fmt::Display for ImageRef {
    /// `oci://registry/repository[:tag][@digest]`, fully qualified.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.0.registry(), self.0.repository())?;
        if let Some(tag) = self.tag() {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = self.0.digest() {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ImageRef {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn short_forms_resolve_as_docker_resolves_them() {
        assert_eq!(
            parse("python:3.12-slim").to_string(),
            "oci://docker.io/library/python:3.12-slim"
        );
        assert_eq!(
            parse("oci://alpine").to_string(),
            "oci://docker.io/library/alpine:latest"
        );
        assert_eq!(
            parse("ghcr.io/cocoonstack/sandbox/rt:24.04").to_string(),
            "oci://ghcr.io/cocoonstack/sandbox/rt:24.04"
        );
        let local = parse("oci://127.0.0.1:5000/test/bb:v1");
        assert_eq!(local.host(), "127.0.0.1:5000");
        assert_eq!(
            local.tag_key().as_deref(),
            Some("127.0.0.1:5000/test/bb:v1")
        );
        assert_eq!(parse("python").host(), "index.docker.io");
    }

    #[test]
    fn a_reference_names_one_valid_template_however_it_is_written() {
        let short = parse("python:3.12-slim").template_name();
        assert_eq!(
            short,
            parse("oci://docker.io/library/python:3.12-slim").template_name()
        );
        assert!(
            short.starts_with("oci-docker.io-library-python-3.12-slim-"),
            "{short}"
        );
        assert!(crate::build::valid_name(&short), "{short}");
        // Alike once made readable, told apart by the hash.
        assert_ne!(
            parse("oci://h/a/b-c:v").template_name(),
            parse("oci://h/a-b/c:v").template_name()
        );
        let digest = format!("oci://127.0.0.1:5000/x@sha256:{}", "ab".repeat(32));
        let pinned = parse(&digest).template_name();
        assert!(crate::build::valid_name(&pinned), "{pinned}");
        assert!(
            pinned.len() <= 4 + TEMPLATE_NAME_READABLE_CHARS + 13,
            "{pinned}"
        );
    }

    #[test]
    fn a_digest_pins_the_reference() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let image = parse(&format!("oci://localhost:5000/x@{digest}"));
        assert_eq!(image.digest(), Some(digest.as_str()));
        assert_eq!(image.tag(), None);
        assert_eq!(image.tag_key(), None);
        assert_eq!(
            image.to_string(),
            format!("oci://localhost:5000/x@{digest}")
        );
    }

    #[test]
    fn bad_references_are_typed_errors() {
        assert_eq!("oci://".parse::<ImageRef>(), Err(ReferenceError::Empty));
        for bad in [
            "oci://host/Upper:tag",
            "oci://host/repo:bad tag",
            "oci://host/repo@sha256:short",
            "oci://https://host/repo",
            "oci://host/repo:",
            "oci://host//repo",
        ] {
            assert!(
                matches!(bad.parse::<ImageRef>(), Err(ReferenceError::Grammar { .. })),
                "{bad}"
            );
        }
        let sha512 = format!("oci://host/repo@sha512:{}", "a".repeat(128));
        assert!(matches!(
            sha512.parse::<ImageRef>(),
            Err(ReferenceError::DigestAlgorithm { .. })
        ));
    }
}
