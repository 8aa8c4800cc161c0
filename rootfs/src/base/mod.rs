//! The base userland a template starts from, assembled into a staging folder.
//!
//! - [`busybox`]: the host's static busybox with its applet links (the default),
//! - [`dir`]: a folder copied as is,
//! - [`image`]: an OCI layout or `docker save` tarball, layers applied in order, and
//!   its config's `Env`, `WorkingDir` and `User` ([`oci_config`]),
//! - [`debian`]: a minimal Debian from `mmdebstrap`, with extra packages, cached.

pub mod busybox;
pub mod debian;
pub mod dir;
pub mod image;
pub mod oci_config;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sandbox_protocol::ImageConfig;

use crate::cmd::CmdError;
use crate::tree::TreeError;

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
            _ => Err(format!(
                "unknown base {text:?}: expected busybox, dir:PATH, image:PATH.tar or debian[:SUITE]"
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

/// Fills `staging` (an empty folder) with `base` (a Debian base as `debian` says);
/// returns the defaults the base asks for (an image's config; none for the others).
pub fn populate(
    base: &Base,
    tools: &BaseTools,
    debian: &debian::DebianOptions,
    staging: &Path,
) -> Result<ImageConfig, BaseError> {
    check(base, debian)?;
    match base {
        Base::Busybox => busybox::install(&tools.busybox, staging)?,
        Base::Dir(path) => dir::install(path, staging)?,
        Base::Image(path) => return Ok(image::apply(path, staging)?),
        Base::Debian(suite) => debian::install(suite.as_deref(), debian, staging)?,
    }
    Ok(ImageConfig::default())
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
    }
}
