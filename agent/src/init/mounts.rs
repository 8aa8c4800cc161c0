//! The pseudo filesystems every Linux userland expects, mounted when missing.
//!
//! Mounting is idempotent: a target already listed in `/proc/self/mountinfo` is left
//! alone, so the same code serves a fresh initramfs, a root disk after `switch_root`
//! (where stage one moved `/dev`, `/proc`, `/sys` and `/run` in) and a container
//! runtime that prepared some of them.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use tracing::{debug, info, warn};

use super::InitError;

/// The mount table of this process's mount namespace.
pub const MOUNTINFO_PATH: &str = "/proc/self/mountinfo";

/// One filesystem PID 1 provides.
#[derive(Debug, Clone, Copy)]
pub struct MountSpec {
    /// Where it goes.
    pub target: &'static str,
    /// Filesystem type (also used as the source name).
    pub fstype: &'static str,
    /// Mount flags.
    pub flags: MsFlags,
    /// Filesystem-specific options.
    pub data: &'static str,
}

const NOSUID_NODEV_NOEXEC: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// `/proc`: needed first, to read the mount table and the kernel command line.
pub const PROC: MountSpec = MountSpec {
    target: "/proc",
    fstype: "proc",
    flags: NOSUID_NODEV_NOEXEC,
    data: "",
};

/// `/dev`: needed early, for `/dev/console`.
pub const DEV: MountSpec = MountSpec {
    target: "/dev",
    fstype: "devtmpfs",
    flags: MsFlags::MS_NOSUID,
    data: "mode=0755",
};

/// Everything, in mount order (parents before children).
pub const ALL: [MountSpec; 7] = [
    PROC,
    MountSpec {
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
    },
    DEV,
    MountSpec {
        target: "/dev/pts",
        fstype: "devpts",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NOEXEC),
        data: "newinstance,ptmxmode=0666,mode=0620",
    },
    MountSpec {
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: "mode=1777",
    },
    MountSpec {
        target: "/run",
        fstype: "tmpfs",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: "mode=0755",
    },
    MountSpec {
        target: "/tmp",
        fstype: "tmpfs",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: "mode=1777",
    },
];

/// Symlinks in `/dev` that shells and libcs expect; devtmpfs does not make them.
const DEV_LINKS: [(&str, &str); 4] = [
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// What [`mount_all`] did.
#[derive(Debug, Default)]
pub struct MountReport {
    /// Targets this call mounted.
    pub mounted: Vec<PathBuf>,
    /// Targets that were mounted already.
    pub present: Vec<PathBuf>,
    /// Failures that did not stop the others.
    pub failed: Vec<InitError>,
}

/// Mounts `/proc` and `/dev` only: enough to read the command line and open the
/// console before logging is set up.
pub fn mount_early() -> MountReport {
    mount_specs(&[PROC, DEV])
}

/// Mounts every filesystem in [`ALL`] that is missing, then fixes `/dev/ptmx` and the
/// `/dev` symlinks. Failures are collected, not fatal.
pub fn mount_all() -> MountReport {
    let mut report = mount_specs(&ALL);
    if let Err(error) = link_ptmx() {
        report.failed.push(error);
    }
    for (link, target) in DEV_LINKS {
        if let Err(error) = symlink_if_missing(Path::new(link), Path::new(target)) {
            report.failed.push(error);
        }
    }
    report
}

fn mount_specs(specs: &[MountSpec]) -> MountReport {
    let mut report = MountReport::default();
    for spec in specs {
        // Re-read each time: an earlier step may have mounted /proc.
        let mounted = mounted_targets();
        let target = PathBuf::from(spec.target);
        if is_mounted(spec, &mounted) {
            debug!(target = spec.target, "already mounted");
            report.present.push(target);
            continue;
        }
        match mount_one(spec) {
            Ok(true) => {
                info!(target = spec.target, fstype = spec.fstype, "mounted");
                report.mounted.push(target);
            }
            Ok(false) => report.present.push(target),
            Err(error) => {
                warn!(target = spec.target, %error, "mount failed");
                report.failed.push(error);
            }
        }
    }
    report
}

/// Whether `spec` is mounted. Without a readable mount table `/proc` is not mounted,
/// and then nothing else can be known: assume the rest is missing and let `EBUSY` tell.
fn is_mounted(spec: &MountSpec, mounted: &Option<HashSet<PathBuf>>) -> bool {
    match mounted {
        Some(targets) => targets.contains(Path::new(spec.target)),
        None => false,
    }
}

/// Mounts one filesystem; `Ok(false)` when the kernel says it is there already.
fn mount_one(spec: &MountSpec) -> Result<bool, InitError> {
    let target = Path::new(spec.target);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(target)
        .map_err(|error| InitError::CreateDir {
            path: target.to_owned(),
            error,
        })?;
    let data = (!spec.data.is_empty()).then_some(spec.data);
    match mount(
        Some(spec.fstype),
        target,
        Some(spec.fstype),
        spec.flags,
        data,
    ) {
        Ok(()) => Ok(true),
        Err(Errno::EBUSY) => Ok(false),
        Err(errno) => Err(InitError::Mount {
            target: target.to_owned(),
            fstype: spec.fstype,
            error: io::Error::from(errno),
        }),
    }
}

/// Points `/dev/ptmx` at the new devpts instance, as `newinstance` requires. A device
/// node from devtmpfs is replaced; an existing symlink is kept.
fn link_ptmx() -> Result<(), InitError> {
    let ptmx = Path::new("/dev/ptmx");
    let target = Path::new("pts/ptmx");
    match fs::symlink_metadata(ptmx) {
        Ok(meta) if meta.file_type().is_symlink() => return Ok(()),
        Ok(meta) if meta.file_type().is_char_device() => {
            fs::remove_file(ptmx).map_err(|error| InitError::Symlink {
                link: ptmx.to_owned(),
                error,
            })?;
        }
        Ok(_) => return Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(InitError::Symlink {
                link: ptmx.to_owned(),
                error,
            })
        }
    }
    std::os::unix::fs::symlink(target, ptmx).map_err(|error| InitError::Symlink {
        link: ptmx.to_owned(),
        error,
    })
}

fn symlink_if_missing(link: &Path, target: &Path) -> Result<(), InitError> {
    match std::os::unix::fs::symlink(target, link) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(InitError::Symlink {
            link: link.to_owned(),
            error,
        }),
    }
}

/// Mount points of this namespace, or `None` when `/proc` is not mounted.
pub fn mounted_targets() -> Option<HashSet<PathBuf>> {
    let text = fs::read_to_string(MOUNTINFO_PATH).ok()?;
    Some(
        parse_mountinfo(&text)
            .into_iter()
            .map(|entry| entry.mount_point)
            .collect(),
    )
}

/// The filesystem type mounted at `/`, if the mount table says.
pub fn root_fstype() -> Option<String> {
    let text = fs::read_to_string(MOUNTINFO_PATH).ok()?;
    parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|entry| entry.mount_point == Path::new("/"))
        .map(|entry| entry.fstype)
}

/// One line of `/proc/self/mountinfo`, the fields this crate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfoEntry {
    /// Where it is mounted (octal escapes decoded).
    pub mount_point: PathBuf,
    /// Filesystem type.
    pub fstype: String,
    /// Mount source (octal escapes decoded).
    pub source: String,
}

/// Parses mountinfo text; malformed lines are skipped.
///
/// Format (proc(5)): `id parent major:minor root mount-point options [optional...] -
/// fstype source super-options`.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfoEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let mount_point = fields.nth(4)?;
            // Skip the mount options and the optional fields up to the separator.
            let mut rest = fields.skip_while(|field| *field != "-");
            rest.next()?;
            let fstype = rest.next()?;
            let source = rest.next()?;
            Some(MountInfoEntry {
                mount_point: PathBuf::from(unescape_octal(mount_point)),
                fstype: unescape_octal(fstype),
                source: unescape_octal(source),
            })
        })
        .collect()
}

/// Decodes the `\040`-style escapes the kernel uses for space, tab, newline and `\`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:5 / / rw - rootfs rootfs rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 master:1 - sysfs sysfs rw
25 22 0:6 / /dev rw,nosuid,relatime - devtmpfs devtmpfs rw,size=10k,mode=755
40 22 8:1 / /mnt/my\\040disk rw - ext4 /dev/vd\\134a rw
garbage line
";

    #[test]
    fn mountinfo_lines_parse_with_optional_fields() {
        let entries = parse_mountinfo(SAMPLE);
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0].mount_point, PathBuf::from("/"));
        assert_eq!(entries[0].fstype, "rootfs");
        assert_eq!(entries[1].fstype, "proc");
        assert_eq!(entries[2].fstype, "sysfs");
        assert_eq!(entries[3].source, "devtmpfs");
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        let entries = parse_mountinfo(SAMPLE);
        assert_eq!(entries[4].mount_point, PathBuf::from("/mnt/my disk"));
        assert_eq!(entries[4].source, "/dev/vd\\a");
    }

    #[test]
    fn truncated_escapes_are_kept_verbatim() {
        assert_eq!(unescape_octal("a\\04"), "a\\04");
        assert_eq!(unescape_octal("a\\"), "a\\");
        assert_eq!(unescape_octal("\\999"), "\\999");
    }

    #[test]
    fn mount_targets_are_ordered_parent_first() {
        for (i, spec) in ALL.iter().enumerate() {
            for later in &ALL[i + 1..] {
                assert!(
                    !Path::new(spec.target).starts_with(later.target),
                    "{} must come after {}",
                    spec.target,
                    later.target
                );
            }
        }
    }
}
