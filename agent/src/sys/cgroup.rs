//! cgroup v2 and `/proc`: recognising, mounting and re-mounting the filesystems the
//! confinement needs. (Files inside them are read and written with plain `std::fs`;
//! joining a cgroup before `exec` is in [`super::proc`].)

use std::io;
use std::path::Path;

use nix::mount::{mount, MsFlags};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, PROC_SUPER_MAGIC};
use nix::sys::statvfs::{statvfs, FsFlags};

/// The flags the agent mounts its pseudo filesystems with, as systemd does.
const NOSUID_NODEV_NOEXEC: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Whether `path` is the root of (or lies in) a cgroup2 filesystem.
pub fn is_cgroup2(path: &Path) -> io::Result<bool> {
    Ok(statfs(path)?.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Whether `path` lies in a procfs.
pub fn is_procfs(path: &Path) -> io::Result<bool> {
    Ok(statfs(path)?.filesystem_type() == PROC_SUPER_MAGIC)
}

/// Whether the filesystem at `path` is mounted read-only (the mount or its
/// superblock).
pub fn is_read_only(path: &Path) -> io::Result<bool> {
    Ok(statvfs(path)?.flags().contains(FsFlags::ST_RDONLY))
}

/// Mounts cgroup2 on `target` (which must exist), `nosuid,nodev,noexec` as systemd
/// does. `nsdelegate` is left out: it only matters for cgroup namespaces, which the
/// agent does not create. cgroup2 has one hierarchy per machine, so a second mount
/// (over whatever a workload put at `target`) shows the same tree.
pub fn mount_cgroup2(target: &Path) -> io::Result<()> {
    mount(
        Some("cgroup2"),
        target,
        Some("cgroup2"),
        NOSUID_NODEV_NOEXEC,
        None::<&str>,
    )?;
    Ok(())
}

/// Mounts a procfs on `target`, as the agent mounted `/proc` at boot.
pub fn mount_proc(target: &Path) -> io::Result<()> {
    mount(
        Some("proc"),
        target,
        Some("proc"),
        NOSUID_NODEV_NOEXEC,
        None::<&str>,
    )?;
    Ok(())
}

/// Makes the mount at `target` writable again after a `mount -o remount,ro`: the
/// superblock and the mount (`MS_REMOUNT`), else the mount alone (`MS_REMOUNT |
/// MS_BIND`, for a read-only bind mount over it).
pub fn remount_read_write(target: &Path) -> io::Result<()> {
    let remount = |extra: MsFlags| {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_REMOUNT | NOSUID_NODEV_NOEXEC | extra,
            None::<&str>,
        )
    };
    remount(MsFlags::empty())
        .or_else(|_| remount(MsFlags::MS_BIND))
        .map_err(io::Error::from)
}
