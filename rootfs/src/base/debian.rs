//! A minimal Debian base from `mmdebstrap` (variant `minbase`).
//!
//! mmdebstrap needs no root (it uses user namespaces when unprivileged) and writes a
//! plain folder. The result is usually too large for an initramfs and goes to a disk.

use std::path::Path;
use std::process::Command;

use tracing::info;

use super::BaseError;
use crate::cmd;

/// The suite used when none is named, on a host that is not Debian.
pub const FALLBACK_SUITE: &str = "stable";

/// Where a Debian host names its release.
const OS_RELEASE_PATH: &str = "/etc/os-release";

/// Bootstraps Debian `suite` (by default the host's release) into `staging`.
pub fn install(suite: Option<&str>, staging: &Path) -> Result<(), BaseError> {
    let host = std::fs::read_to_string(OS_RELEASE_PATH)
        .ok()
        .and_then(|text| host_debian_release(&text));
    let suite = suite.or(host.as_deref()).unwrap_or(FALLBACK_SUITE);
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

/// `VERSION_CODENAME` from an os-release file, when it describes Debian.
fn host_debian_release(os_release: &str) -> Option<String> {
    let field = |name: &str| {
        os_release.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix('=')?;
            Some(value.trim_matches('"').to_owned())
        })
    };
    (field("ID").as_deref() == Some("debian"))
        .then(|| field("VERSION_CODENAME"))
        .flatten()
        .filter(|codename| !codename.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_release_comes_from_os_release_on_debian_only() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n";
        assert_eq!(host_debian_release(debian).as_deref(), Some("bookworm"));
        let ubuntu = "ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n";
        assert_eq!(host_debian_release(ubuntu), None);
    }
}
