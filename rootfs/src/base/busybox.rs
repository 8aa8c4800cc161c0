//! The default base: a static busybox and a link for each of its applets, so
//! `/bin/sh -c`, `ls`, `cat` and friends work in the guest.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use tracing::info;

use super::BaseError;
use crate::agent::check_static;
use crate::cmd;
use crate::tree::{install_file, make_dir, TreeError};

/// Debian's busybox-static binary.
pub const DEFAULT_BUSYBOX: &str = "/bin/busybox";

/// Where busybox goes inside the guest.
const GUEST_BUSYBOX: &str = "bin/busybox";

/// Installs `busybox` and its applet links into `staging`.
pub fn install(busybox: &Path, staging: &Path) -> Result<(), BaseError> {
    check_static(busybox).map_err(|error| BaseError::Busybox {
        path: busybox.to_owned(),
        reason: error.to_string(),
    })?;
    let listing = cmd::stdout_of(Command::new(busybox).arg("--list-full"))?;
    for dir in ["bin", "sbin", "usr/bin", "usr/sbin"] {
        make_dir(&staging.join(dir), 0o755)?;
    }
    install_file(busybox, &staging.join(GUEST_BUSYBOX), 0o755)?;
    let applets = applet_paths(&listing);
    for applet in &applets {
        let link = staging.join(applet);
        if link.exists() || link.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = link.parent() {
            make_dir(parent, 0o755)?;
        }
        symlink(Path::new("/").join(GUEST_BUSYBOX), &link).map_err(|error| TreeError {
            op: "create link",
            path: link.clone(),
            error,
        })?;
    }
    info!(applets = applets.len(), "busybox base installed");
    Ok(())
}

/// The relative applet paths in `busybox --list-full` output, without busybox itself
/// and without anything that would escape the root.
fn applet_paths(listing: &str) -> Vec<String> {
    listing
        .lines()
        .map(|line| line.trim().trim_start_matches('/'))
        .filter(|line| !line.is_empty() && *line != GUEST_BUSYBOX)
        .filter(|line| {
            line.split('/')
                .all(|part| !part.is_empty() && part != ".." && part != ".")
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applet_listing_is_sanitized() {
        let listing = "bin/sh\nusr/bin/awk\nbin/busybox\n../etc/evil\n\nsbin/init\n";
        assert_eq!(
            applet_paths(listing),
            ["bin/sh", "usr/bin/awk", "sbin/init"]
        );
    }
}
