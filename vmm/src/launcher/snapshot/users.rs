//! Who uses a checkpoint, found from what really holds its files rather than from a
//! VM's record alone: a record names the checkpoint a VM was restored from, but a
//! hibernation (and a wake after it) moves the VM onto new images whose disk chain
//! still ends in that checkpoint's `disk.qcow2`. A delete that trusted the record
//! alone succeeded under a woken branch, which then could never hibernate or wake
//! again (issue 22, item 1).
//!
//! A VM under the run root holds a checkpoint when, whatever its state (running,
//! booting or waking, hibernated):
//! - its record names it (`VmRecord::checkpoint`: restored from it, maybe not yet
//!   mapping anything);
//! - its QEMU maps a file of it (`/proc/PID/maps`: the RAM image a branch maps
//!   copy-on-write);
//! - a disk image in its run folder, or in a hibernation image there, has a file of
//!   it in its backing chain (read from the qcow2 headers: the overlay the VM writes,
//!   the frozen overlays hibernations and checkpoints left below it);
//! - a hibernation image's manifest names it as its parent's disk.
//!
//! Only folders [`run_dir::list`] calls stale are skipped: their VM is gone and the
//! next sweep removes them.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::manifest::read_manifest;
use crate::launcher::run_dir::{self, VmStatus};

/// The first bytes of a qcow2 image.
const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// The qcow2 header fields read: magic, version, backing file offset and size.
const QCOW2_HEADER_BYTES: usize = 20;

/// The longest backing file name qcow2 allows (its specification: 1023 bytes).
const QCOW2_MAX_BACKING_NAME_BYTES: u32 = 1023;

/// Most images followed down one chain: far more than checkpoints and hibernations
/// stack in practice, and a bound on a chain that loops.
const MAX_CHAIN_IMAGES: usize = 64;

/// The prefix of a hibernation image folder inside a run folder.
const HIBERNATION_PREFIX: &str = "hibernation-";

/// One VM's hold on the checkpoint store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmHolds {
    /// The VM's id.
    pub vm: String,
    /// The checkpoint its record names.
    pub recorded: Option<String>,
    /// Files it maps or its images are based on (canonical where they exist).
    pub files: BTreeSet<PathBuf>,
}

impl VmHolds {
    /// Whether this VM uses the checkpoint `id` in `folder` (canonical).
    pub fn uses(&self, id: &str, folder: &Path) -> bool {
        self.recorded.as_deref() == Some(id) || self.files.iter().any(|f| f.starts_with(folder))
    }
}

/// What every VM under `run_root` that is not stale holds.
pub fn holds(run_root: &Path) -> Vec<VmHolds> {
    run_dir::list(run_root)
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.status != VmStatus::Stale)
        .map(|entry| {
            let record = entry.record.as_ref();
            let mut files = disk_chains(&entry.path);
            if entry.status == VmStatus::Running {
                if let Some(pid) = record.and_then(|r| r.qemu_pid) {
                    files.extend(mapped_files(pid));
                }
            }
            VmHolds {
                vm: record.map_or_else(|| entry.name.clone(), |r| r.id.to_string()),
                recorded: record.and_then(|r| r.checkpoint.clone()),
                files,
            }
        })
        .collect()
}

/// Every image below the disks in `run` (and in its hibernation images), and the
/// disks their manifests say they are based on.
fn disk_chains(run: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut folders = vec![run.to_owned()];
    if let Ok(entries) = fs::read_dir(run) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_image = name.to_string_lossy().starts_with(HIBERNATION_PREFIX)
                && entry.file_type().is_ok_and(|t| t.is_dir());
            if is_image {
                let folder = entry.path();
                if let Some(backing) = read_manifest(&folder).ok().and_then(|m| m.disk_backing) {
                    found.insert(canonical(&backing));
                }
                folders.push(folder);
            }
        }
    }
    for folder in folders {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension() == Some(OsStr::new("qcow2")) {
                found.extend(backing_chain(&path));
            }
        }
    }
    found
}

/// The images `top` is based on, nearest first (canonical where they exist). Stops
/// at an image that is not qcow2 (a raw template disk), one that cannot be read, a
/// loop, or [`MAX_CHAIN_IMAGES`].
pub fn backing_chain(top: &Path) -> Vec<PathBuf> {
    let mut chain: Vec<PathBuf> = Vec::new();
    let mut image = top.to_owned();
    while chain.len() < MAX_CHAIN_IMAGES {
        let Some(backing) = backing_of(&image) else {
            break;
        };
        let backing = canonical(&backing);
        if backing == canonical(top) || chain.contains(&backing) {
            break;
        }
        chain.push(backing.clone());
        image = backing;
    }
    chain
}

/// The backing file a qcow2 image names in its header, relative names resolved
/// against the image's folder as QEMU does; `None` for no backing file or anything
/// that is not a well-formed qcow2 header.
fn backing_of(image: &Path) -> Option<PathBuf> {
    let mut file = File::open(image).ok()?;
    let mut header = [0u8; QCOW2_HEADER_BYTES];
    file.read_exact(&mut header).ok()?;
    if header[..4] != QCOW2_MAGIC {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let size = u32::from_be_bytes(header[16..20].try_into().ok()?);
    if offset == 0 || size == 0 || size > QCOW2_MAX_BACKING_NAME_BYTES {
        return None;
    }
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut name = vec![0u8; usize::try_from(size).ok()?];
    file.read_exact(&mut name).ok()?;
    let name = Path::new(OsStr::from_bytes(&name));
    Some(match image.parent() {
        Some(folder) if name.is_relative() => folder.join(name),
        _ => name.to_owned(),
    })
}

/// The files process `pid` maps (from `/proc/PID/maps`; none when it cannot be read).
fn mapped_files(pid: u32) -> BTreeSet<PathBuf> {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return BTreeSet::new();
    };
    text.lines()
        .filter_map(mapped_path)
        .map(|path| canonical(Path::new(path)))
        .collect()
}

/// The path of one `maps` line (`addr perms offset dev inode path`), when it maps a
/// file; a removed file's ` (deleted)` mark is dropped.
fn mapped_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start().split_once(char::is_whitespace)?.1;
    }
    let path = rest.trim_start();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    path.starts_with('/').then_some(path)
}

/// `path` with its links resolved, or as it is when it does not exist.
pub fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A qcow2 header naming `backing`, as `qemu-img create -b` writes one (the name
    /// right after the 104-byte version 3 header).
    fn qcow2(path: &Path, backing: Option<&Path>) {
        let mut bytes = vec![0u8; 104];
        bytes[..4].copy_from_slice(&QCOW2_MAGIC);
        bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
        if let Some(backing) = backing {
            let name = backing.as_os_str().as_bytes();
            bytes[8..16].copy_from_slice(&104u64.to_be_bytes());
            bytes[16..20].copy_from_slice(&u32::try_from(name.len()).unwrap().to_be_bytes());
            bytes.extend_from_slice(name);
        }
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_chain_is_followed_through_relative_and_absolute_names() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.qcow2");
        let mid = dir.path().join("mid.qcow2");
        let top = dir.path().join("sub/top.qcow2");
        fs::create_dir_all(top.parent().unwrap()).unwrap();
        qcow2(&base, None);
        qcow2(&mid, Some(Path::new("base.qcow2")));
        qcow2(&top, Some(&mid));
        assert_eq!(backing_chain(&top), vec![canonical(&mid), canonical(&base)]);
        assert!(backing_chain(&base).is_empty());
    }

    #[test]
    fn a_loop_a_raw_image_and_a_garbled_header_end_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.qcow2");
        let b = dir.path().join("b.qcow2");
        qcow2(&a, Some(&b));
        qcow2(&b, Some(&a));
        assert_eq!(backing_chain(&a), vec![canonical(&b)]);

        let raw = dir.path().join("raw.img");
        fs::write(&raw, vec![0u8; 4096]).unwrap();
        let on_raw = dir.path().join("on-raw.qcow2");
        qcow2(&on_raw, Some(&raw));
        assert_eq!(backing_chain(&on_raw), vec![canonical(&raw)]);

        // A size past qcow2's limit, an offset past the end, a short file.
        let bad = dir.path().join("bad.qcow2");
        let mut bytes = vec![0u8; 104];
        bytes[..4].copy_from_slice(&QCOW2_MAGIC);
        bytes[8..16].copy_from_slice(&104u64.to_be_bytes());
        bytes[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        fs::write(&bad, &bytes).unwrap();
        assert!(backing_chain(&bad).is_empty());
        bytes[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        bytes[16..20].copy_from_slice(&8u32.to_be_bytes());
        fs::write(&bad, &bytes).unwrap();
        assert!(backing_chain(&bad).is_empty());
        fs::write(&bad, QCOW2_MAGIC).unwrap();
        assert!(backing_chain(&bad).is_empty());
    }

    #[test]
    fn maps_lines_give_their_file() {
        let line = "7f00-7f10 rw-p 00000000 00:2a 1234       /home/u/checkpoints/c1/ram";
        assert_eq!(mapped_path(line), Some("/home/u/checkpoints/c1/ram"));
        let spaced = "7f00-7f10 r--p 0 08:01 99 /a dir/ram (deleted)";
        assert_eq!(mapped_path(spaced), Some("/a dir/ram"));
        assert_eq!(mapped_path("7f00-7f10 rw-p 00000000 00:00 0"), None);
        assert_eq!(
            mapped_path("7f00-7f10 rw-p 00000000 00:00 0    [heap]"),
            None
        );
        assert_eq!(mapped_path("garbage"), None);
    }

    #[test]
    fn a_vm_uses_what_its_record_names_or_what_its_files_reach() {
        let holds = VmHolds {
            vm: "v".into(),
            recorded: Some("c1".into()),
            files: [PathBuf::from("/s/checkpoints/c2/disk.qcow2")].into(),
        };
        assert!(holds.uses("c1", Path::new("/s/checkpoints/c1")));
        assert!(holds.uses("c2", Path::new("/s/checkpoints/c2")));
        assert!(!holds.uses("c3", Path::new("/s/checkpoints/c3")));
        // A folder whose name extends another's is not inside it.
        assert!(!holds.uses("c", Path::new("/s/checkpoints/c")));
    }
}
