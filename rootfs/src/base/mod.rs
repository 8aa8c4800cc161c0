//! The base userland a template starts from, assembled into a staging folder.
//!
//! - [`busybox`]: the host's static busybox with its applet links (the default),
//! - [`dir`]: a folder copied as is,
//! - [`image`]: an OCI layout or `docker save` tarball, layers applied in order, and
//!   its config's `Env`, `WorkingDir` and `User` ([`oci_config`]),
//! - [`debian`]: a minimal Debian from `mmdebstrap`, with extra packages, cached,
//! - [`registry`]: an image pulled from an OCI registry through a layer cache,
//!   applied as [`image`] applies tarballs but refusing entries that leave the root.

pub mod busybox;
pub mod debian;
pub mod dir;
pub mod image;
pub mod oci_config;
pub mod registry;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sandbox_protocol::ImageConfig;

use crate::cmd::CmdError;
use crate::manifest::ImageSource;
use crate::tree::TreeError;
use registry::reference::ImageRef;
use registry::{RegistryError, RegistryOptions};

/// Which base to build from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// Static busybox from the host (`busybox`).
    Busybox,
    /// A folder (`dir:PATH`).
    Dir(PathBuf),
    /// An image tarball (`image:PATH`).
    Image(PathBuf),
    /// Debian via mmdebstrap (`debian:SUITE`, or `debian` for the host's own release,
    /// whose mirrors the host can evidently reach; `stable` on a host that is not Debian).
    Debian(Option<String>),
    /// An image in an OCI registry (`oci://REGISTRY/REPO[:TAG|@DIGEST]`, or a short
    /// form with a tag, digest or registry, as docker reads it: `python:3.12-slim`).
    /// `debian:SUITE` stays the mmdebstrap base; Docker Hub's image is
    /// `oci://debian:SUITE`.
    Registry(ImageRef),
}

impl FromStr for Base {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            None if text == "busybox" => Ok(Self::Busybox),
            None if text == "debian" => Ok(Self::Debian(None)),
            Some(("dir", path)) if !path.is_empty() => Ok(Self::Dir(path.into())),
            Some(("image", path)) if !path.is_empty() => Ok(Self::Image(path.into())),
            Some(("debian", suite)) if !suite.is_empty() => {
                Ok(Self::Debian(Some(suite.to_owned())))
            }
            _ if text.starts_with(registry::reference::SCHEME) => text
                .parse()
                .map(Self::Registry)
                .map_err(|e: registry::reference::ReferenceError| e.to_string()),
            // A short form names a tag, a digest or a registry path; a bare word
            // would be ambiguous with the bases above.
            _ if text.contains([':', '/', '@']) => text
                .parse()
                .map(Self::Registry)
                .map_err(|e: registry::reference::ReferenceError| e.to_string()),
            _ => Err(format!(
                "unknown base {text:?}: expected busybox, dir:PATH, image:PATH.tar, debian[:SUITE] \
                 or an image reference (oci://REGISTRY/REPO:TAG, or NAME:TAG)"
            )),
        }
    }
}

/// Assembling the base failed.
#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    /// A host tool failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// A file operation failed.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The image tarball could not be applied.
    #[error(transparent)]
    Image(#[from] image::ImageError),
    /// The registry image could not be pulled or applied.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The busybox binary is unusable.
    #[error("{} is not a static busybox: {reason}", path.display())]
    Busybox {
        /// The binary.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The base folder does not exist.
    #[error("Base folder {} does not exist", path.display())]
    MissingDir {
        /// The folder.
        path: PathBuf,
    },
    /// Packages were asked for a base that is not Debian.
    #[error("--packages needs the debian base (--base debian[:SUITE])")]
    PackagesNeedDebian,
    /// A package name is not one Debian allows.
    #[error("{name:?} is not a Debian package name")]
    PackageName {
        /// The name.
        name: String,
    },
    /// A bootstrapped Debian tarball could not be unpacked.
    #[error("Cannot unpack the Debian base {}", path.display())]
    Unpack {
        /// The tarball.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
}

/// Host tools a base may need.
#[derive(Debug, Clone)]
pub struct BaseTools {
    /// The static busybox binary for [`Base::Busybox`].
    pub busybox: PathBuf,
}

impl Default for BaseTools {
    fn default() -> Self {
        Self {
            busybox: PathBuf::from(busybox::DEFAULT_BUSYBOX),
        }
    }
}

/// Checks what can be checked before anything slow runs: packages only for a
/// Debian base, and names Debian allows.
pub fn check(base: &Base, debian: &debian::DebianOptions) -> Result<(), BaseError> {
    if !debian.packages.is_empty() && !matches!(base, Base::Debian(_)) {
        return Err(BaseError::PackagesNeedDebian);
    }
    debian::check_packages(&debian.packages)
}

/// What a base brings besides its files.
#[derive(Debug, Clone, Default)]
pub struct Populated {
    /// The defaults the base asks for (an image's config; none for the others).
    pub config: ImageConfig,
    /// Where a registry image came from.
    pub source: Option<ImageSource>,
}

/// Fills `staging` (an empty folder) with `base` (a Debian base as `debian` says, a
/// registry image as `registry` says, cached under `cache_dir`).
pub fn populate(
    base: &Base,
    tools: &BaseTools,
    debian: &debian::DebianOptions,
    registry: &RegistryOptions,
    cache_dir: &Path,
    staging: &Path,
) -> Result<Populated, BaseError> {
    check(base, debian)?;
    match base {
        Base::Busybox => busybox::install(&tools.busybox, staging)?,
        Base::Dir(path) => dir::install(path, staging)?,
        Base::Image(path) => {
            return Ok(Populated {
                config: image::apply(path, staging)?,
                source: None,
            })
        }
        Base::Debian(suite) => debian::install(suite.as_deref(), debian, staging)?,
        Base::Registry(image) => {
            let pulled = registry::pull(image, registry, cache_dir, staging)?;
            return Ok(Populated {
                config: pulled.config,
                source: Some(pulled.source),
            });
        }
    }
    Ok(Populated::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_specs_parse() {
        assert_eq!("busybox".parse::<Base>(), Ok(Base::Busybox));
        assert_eq!("dir:/x".parse::<Base>(), Ok(Base::Dir("/x".into())));
        assert_eq!(
            "image:a.tar".parse::<Base>(),
            Ok(Base::Image("a.tar".into()))
        );
        assert_eq!("debian".parse::<Base>(), Ok(Base::Debian(None)));
        assert_eq!(
            "debian:bookworm".parse::<Base>(),
            Ok(Base::Debian(Some("bookworm".into())))
        );
        assert!("dir:".parse::<Base>().is_err());
        assert!("alpine".parse::<Base>().is_err());
        for (text, reference) in [
            (
                "python:3.12-slim",
                "oci://docker.io/library/python:3.12-slim",
            ),
            ("oci://alpine", "oci://docker.io/library/alpine:latest"),
            (
                "oci://debian:bookworm",
                "oci://docker.io/library/debian:bookworm",
            ),
            ("127.0.0.1:5000/t/bb:v1", "oci://127.0.0.1:5000/t/bb:v1"),
        ] {
            match text.parse::<Base>() {
                Ok(Base::Registry(image)) => assert_eq!(image.to_string(), reference),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!("oci://Bad/Name".parse::<Base>().is_err());
        assert!("oci://".parse::<Base>().is_err());
    }
}
