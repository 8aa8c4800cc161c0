//! The ext4 root disk for bases too large for an initramfs.
//!
//! `mkfs.ext4 -d DIR` fills the new filesystem from a folder in user space: no root,
//! no loop device, no mount. The image is sparse, so free space costs nothing on the
//! host until the guest writes; VMs boot it copy-on-write and never change it.
//!
//! Ownership comes from the staging folder: built as root, files keep the owners the
//! base gave them; built unprivileged, they belong to the builder's uid (the root
//! folder itself is forced to `0:0`).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::info;

use crate::cmd::{self, CmdError};

/// Smallest disk made.
const MIN_DISK_BYTES: u64 = 64 << 20;

/// The filesystem label.
pub const DISK_LABEL: &str = "sandbox-root";

/// Making the disk failed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The image file could not be created.
    #[error("Cannot create disk image {}", path.display())]
    Create {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// mkfs.ext4 failed.
    #[error(transparent)]
    Mkfs(#[from] CmdError),
}

/// The disk size for `used_bytes` of files plus `free_bytes` of room, with 10 %
/// for filesystem metadata, rounded up to a MiB.
pub fn disk_bytes(used_bytes: u64, free_bytes: u64) -> u64 {
    let raw = used_bytes + used_bytes / 10 + free_bytes;
    raw.max(MIN_DISK_BYTES).div_ceil(1 << 20) * (1 << 20)
}

/// Makes `image` (`size_bytes`, sparse) an ext4 filesystem holding `tree`.
pub fn make_ext4(tree: &Path, image: &Path, size_bytes: u64) -> Result<(), DiskError> {
    let create_error = |error| DiskError::Create {
        path: image.to_owned(),
        error,
    };
    let file = File::create(image).map_err(create_error)?;
    file.set_len(size_bytes).map_err(create_error)?;
    drop(file);
    info!(size_mib = size_bytes >> 20, "making the ext4 root disk");
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", DISK_LABEL])
            .args(["-E", "root_owner=0:0"])
            .arg("-d")
            .arg(tree)
            .arg(image),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_size_has_room_and_a_floor() {
        assert_eq!(disk_bytes(0, 0), 64 << 20);
        assert_eq!(disk_bytes(100 << 20, 1 << 30), (110 << 20) + (1 << 30));
        assert_eq!(disk_bytes(1, 64 << 20) % (1 << 20), 0);
    }
}
