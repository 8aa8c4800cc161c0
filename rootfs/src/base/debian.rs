//! A minimal Debian base from `mmdebstrap` (variant `minbase`).
//!
//! mmdebstrap needs no root (it uses user namespaces when unprivileged) and writes a
//! plain folder. The result is usually too large for an initramfs and goes to a disk.

use std::path::Path;
use std::process::Command;

use tracing::info;

use super::BaseError;
use crate::cmd;

/// Bootstraps Debian `suite` into `staging`.
pub fn install(suite: &str, staging: &Path) -> Result<(), BaseError> {
    info!(
        suite,
        "bootstrapping Debian with mmdebstrap (a few minutes)"
    );
    cmd::run_visible(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--quiet", suite])
            .arg(staging),
    )?;
    Ok(())
}
