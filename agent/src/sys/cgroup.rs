//! cgroup v2: recognising and mounting the filesystem. (Files inside it are read and
//! written with plain `std::fs`; joining a cgroup before `exec` is in [`super::proc`].)

use std::io;
use std::path::Path;

use nix::mount::{mount, MsFlags};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};

/// Whether `path` is the root of (or lies in) a cgroup2 filesystem.
pub fn is_cgroup2(path: &Path) -> io::Result<bool> {
    Ok(statfs(path)?.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Mounts cgroup2 on `target` (which must exist), `nosuid,nodev,noexec` as systemd
/// does. `nsdelegate` is left out: it only matters for cgroup namespaces, which the
/// agent does not create.
pub fn mount_cgroup2(target: &Path) -> io::Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("cgroup2"),
        target,
        Some("cgroup2"),
        flags,
        None::<&str>,
    )?;
    Ok(())
}
