//! A checkpoint on disk, and the store of them.
//!
//! `SANDBOX_HOME/checkpoints/<id>/`:
//! - `manifest.json`: [`Manifest`];
//! - `state`: QEMU's migration stream (device state, and RAM for [`RamImage::InStream`]);
//! - `ram`: the sparse RAM image ([`RamImage::File`]), mapped copy-on-write by children;
//!   or the pages that differ from another checkpoint's ([`RamImage::Diff`], with
//!   `ram-pages`: see [`super::diff`]);
//! - `disk.qcow2`: the frozen disk overlay, when the machine has a disk;
//! - `kernel`, `initramfs`: links to (or copies of) what the machine booted, so a
//!   rebuilt template cannot change what a restore loads;
//! - `token` (0600): the agent token inside the snapshot, needed to reach a restored
//!   agent until it is given its own.
//!
//! A folder being written is `.tmp-<id>` and renamed when complete; listings skip
//! dot-folders and [`Store::sweep_temporary`] removes leftovers of crashed writers.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{users, SnapshotError};
use crate::launcher::run_dir;
use crate::launcher::start::MachineSpec;

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// QEMU's migration stream.
pub const STATE_FILE: &str = "state";
/// The RAM image.
pub const RAM_FILE: &str = "ram";
/// The frozen disk overlay.
pub const DISK_FILE: &str = "disk.qcow2";
/// The kernel.
pub const KERNEL_FILE: &str = "kernel";
/// The initramfs.
pub const INITRAMFS_FILE: &str = "initramfs";
/// The agent token in the snapshot.
pub const TOKEN_FILE: &str = "token";

/// The pid of the process that wrote the checkpoint (written first, into the
/// `.tmp-` folder): a sweep removes what a writer that is gone left, at once.
pub const MAKER_FILE: &str = "maker";

/// How long a fork's checkpoint is kept even with no VM mapping it: a fork started
/// in another process may still be starting its children.
pub const EPHEMERAL_GRACE_MS: u64 = 60 * 1000;

/// Where a checkpoint's RAM is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamImage {
    /// In [`RAM_FILE`]; the stream holds device state only.
    File,
    /// In the stream (the source's RAM was private: a child of a checkpoint).
    InStream,
    /// In [`RAM_FILE`] as the pages that differ from [`Manifest::ram_base`]'s RAM
    /// (see [`super::diff`]); flattened into a [`RamImage::File`] before a restore.
    Diff,
}

/// What a checkpoint is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Its id (the folder name).
    pub id: String,
    /// A name given at creation, unique among checkpoints.
    pub name: Option<String>,
    /// Made by a fork: removed once no VM maps it.
    pub ephemeral: bool,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// The VM it was taken from.
    pub source_vm: String,
    /// The checkpoint the source VM had been restored from, if any.
    pub parent: Option<String>,
    /// The machine: restores use exactly these device arguments (kernel and
    /// initramfs as file names inside the checkpoint folder).
    pub machine: MachineSpec,
    /// Where the RAM is.
    pub ram: RamImage,
    /// The checkpoint whose RAM a [`RamImage::Diff`] image is based on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_base: Option<String>,
    /// The base image `disk.qcow2` is an overlay of (a template disk or another
    /// checkpoint's `disk.qcow2`).
    pub disk_backing: Option<PathBuf>,
    /// QEMU's version (`major.minor.micro`): a restore under another QEMU is refused.
    pub qemu_version: String,
    /// The source's QEMU arguments when it was checkpointed, for the record.
    pub qemu_args: Vec<String>,
    /// How long the source was paused, in milliseconds.
    pub pause_ms: u64,
    /// Bytes of the migration stream.
    pub state_bytes: u64,
    /// Bytes the RAM image occupies on disk (it is sparse).
    pub ram_bytes: u64,
    /// Bytes of the frozen disk overlay.
    pub disk_bytes: u64,
}

/// A checkpoint and who still needs it.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its folder.
    pub path: PathBuf,
    /// Live VMs mapping it and checkpoints whose disks are based on it.
    pub users: Vec<String>,
}

/// The checkpoints under one folder.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    run_root: PathBuf,
}

impl Store {
    /// The store at `root`, whose users are the VMs under `run_root`.
    pub fn new(root: PathBuf, run_root: PathBuf) -> Self {
        Self { root, run_root }
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every complete checkpoint, oldest first, with its users.
    pub fn list(&self) -> Result<Vec<CheckpointInfo>, SnapshotError> {
        let mut found = Vec::new();
        for (path, manifest) in self.read_all()? {
            found.push(CheckpointInfo {
                manifest,
                path,
                users: Vec::new(),
            });
        }
        // What really holds each checkpoint (see `users`): VMs by their records,
        // mappings and disk chains, whatever their state; other checkpoints by
        // their disks' chains.
        let vms = users::holds(&self.run_root);
        let disks: Vec<(String, Vec<PathBuf>)> = found
            .iter()
            .map(|c| {
                let mut based_on = users::backing_chain(&c.path.join(DISK_FILE));
                based_on.extend(c.manifest.disk_backing.as_deref().map(users::canonical));
                (c.manifest.id.clone(), based_on)
            })
            .collect();
        for info in &mut found {
            let id = &info.manifest.id;
            let folder = users::canonical(&info.path);
            info.users.extend(
                vms.iter()
                    .filter(|vm| vm.uses(id, &folder))
                    .map(|vm| format!("VM {}", vm.vm)),
            );
            info.users.extend(
                disks
                    .iter()
                    .filter(|(other, based_on)| {
                        other != id && based_on.iter().any(|file| file.starts_with(&folder))
                    })
                    .map(|(other, _)| format!("checkpoint {other}")),
            );
        }
        found.sort_by_key(|c| c.manifest.created_at_unix_ms);
        Ok(found)
    }

    /// The checkpoint with this id or name.
    pub fn find(&self, key: &str) -> Result<CheckpointInfo, SnapshotError> {
        self.list()?
            .into_iter()
            .find(|c| c.manifest.id == key || c.manifest.name.as_deref() == Some(key))
            .ok_or_else(|| SnapshotError::NoCheckpoint(key.to_owned()))
    }

    /// Deletes a checkpoint nobody uses; one in use is refused, and so is one a
    /// capture is reading as the base of an incremental image, or being flattened.
    /// Incremental checkpoints based on it take in its pages first (see
    /// [`super::diff::absorb`]): they do not hold it.
    pub fn delete(&self, key: &str) -> Result<Manifest, SnapshotError> {
        let info = self.find(key)?;
        let busy = |id: &str| SnapshotError::InUse {
            id: id.to_owned(),
            users: "a checkpoint being written from it".into(),
        };
        let _locked = match super::diff::try_lock_for_delete(&info.path) {
            Ok(Some(lock)) => lock,
            Ok(None) => return Err(busy(&info.manifest.id)),
            Err(error) => {
                return Err(SnapshotError::Write {
                    path: info.path,
                    error,
                })
            }
        };
        // Read again under the lock: a delete of its base may have rebased it
        // meanwhile (see `diff::absorb`).
        let info = self.find(&info.manifest.id)?;
        if !info.users.is_empty() {
            return Err(SnapshotError::InUse {
                id: info.manifest.id,
                users: info.users.join(", "),
            });
        }
        // Listed under the lock: an incremental capture that finished while this
        // call looked has made it a base.
        let dependents: Vec<PathBuf> = self
            .read_all()?
            .into_iter()
            .filter(|(_, m)| {
                m.ram == RamImage::Diff && m.ram_base.as_deref() == Some(&info.manifest.id)
            })
            .map(|(path, _)| path)
            .collect();
        for dependent in dependents {
            if super::diff::absorb(&dependent, &info.path)?.is_none() {
                return Err(busy(&info.manifest.id));
            }
        }
        remove_folder(&info.path)?;
        Ok(info.manifest)
    }

    /// Removes ephemeral checkpoints no VM maps any more, and folders left by
    /// interrupted writers; returns the ids removed. A fork's checkpoint younger than
    /// [`EPHEMERAL_GRACE_MS`] is kept: its children may still be starting.
    pub fn sweep(&self) -> Vec<String> {
        let mut removed = Vec::new();
        let now = run_dir::now_unix_ms();
        if let Ok(all) = self.list() {
            for info in all {
                // The grace is for a fork still starting its children: once the
                // process that made the checkpoint is gone, nobody is.
                let young = now.saturating_sub(info.manifest.created_at_unix_ms)
                    < EPHEMERAL_GRACE_MS
                    && !maker_gone(&info.path);
                if info.manifest.ephemeral
                    && info.users.is_empty()
                    && !young
                    && remove_folder(&info.path).is_ok()
                {
                    tracing::info!(id = %info.manifest.id, "removed a fork's checkpoint no VM uses");
                    removed.push(info.manifest.id);
                }
            }
        }
        self.sweep_temporary();
        removed
    }

    /// Removes `.tmp-*` and `.promote-*` folders whose writer is gone: its `maker`
    /// process no longer runs, or (a folder without one) it is older than ten minutes
    /// (writing a checkpoint takes seconds, a large one whose RAM is in the stream
    /// under a minute).
    pub fn sweep_temporary(&self) {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 600);
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = stale || maker_gone(&entry.path());
            if (name.starts_with(".tmp-") || name.starts_with(".promote-")) && stale {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }

    /// True when a checkpoint has this name.
    pub fn name_taken(&self, name: &str) -> Result<bool, SnapshotError> {
        Ok(self
            .read_all()?
            .iter()
            .any(|(_, m)| m.name.as_deref() == Some(name)))
    }

    /// Every complete checkpoint's manifest, without working out its users (which
    /// reads every VM's run folder and disk chain).
    pub(crate) fn manifests(&self) -> Result<Vec<Manifest>, SnapshotError> {
        Ok(self.read_all()?.into_iter().map(|(_, m)| m).collect())
    }

    fn read_all(&self) -> Result<Vec<(PathBuf, Manifest)>, SnapshotError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(SnapshotError::Write {
                    path: self.root.clone(),
                    error,
                })
            }
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            match read_manifest(&path) {
                // A manifest names its own folder: ids are paths elsewhere (the base
                // of an incremental image), so one naming another is not listed.
                Ok(manifest) if *manifest.id != *entry.file_name().to_string_lossy() => {
                    tracing::warn!(path = %path.display(), id = %manifest.id, "skipping a checkpoint whose manifest names another folder")
                }
                Ok(manifest) => found.push((path, manifest)),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "skipping an unreadable checkpoint")
                }
            }
        }
        Ok(found)
    }
}

/// Writes `dir/maker`: this process's pid.
pub(crate) fn write_maker(dir: &Path) -> Result<(), SnapshotError> {
    let path = dir.join(MAKER_FILE);
    fs::write(&path, std::process::id().to_string())
        .map_err(|error| SnapshotError::Write { path, error })
}

/// True when `dir/maker` names a process that no longer exists (false without one,
/// or when it cannot be read: then only age decides; a recycled pid reads as alive,
/// so a folder may wait longer, never go early).
fn maker_gone(dir: &Path) -> bool {
    fs::read_to_string(dir.join(MAKER_FILE))
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .is_some_and(|pid| !run_dir::process_alive(pid))
}

/// Reads and parses `dir/manifest.json`.
pub fn read_manifest(dir: &Path) -> io::Result<Manifest> {
    let text = fs::read(dir.join(MANIFEST_FILE))?;
    serde_json::from_slice(&text).map_err(io::Error::other)
}

/// Checks a checkpoint name: what a file name and a command line take without quoting.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SnapshotError::BadName(name.to_owned()))
    }
}

fn remove_folder(path: &Path) -> Result<(), SnapshotError> {
    fs::remove_dir_all(path).map_err(|error| SnapshotError::Write {
        path: path.to_owned(),
        error,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// A fork's checkpoint `id` as a manifest says it (the other tests' fixture).
    pub(crate) fn ephemeral(id: &str) -> Manifest {
        Manifest {
            id: id.into(),
            name: None,
            ephemeral: true,
            created_at_unix_ms: run_dir::now_unix_ms(),
            source_vm: "vm".into(),
            parent: None,
            machine: MachineSpec {
                template: "default".into(),
                accel: crate::launcher::Accel::Tcg,
                size: crate::launcher::Size::SMALL,
                transport: crate::launcher::AgentTransport::Serial,
                kernel: KERNEL_FILE.into(),
                initramfs: None,
                cmdline: String::new(),
                disk: false,
            },
            ram: RamImage::File,
            ram_base: None,
            disk_backing: None,
            qemu_version: "7.2.0".into(),
            qemu_args: Vec::new(),
            pause_ms: 0,
            state_bytes: 0,
            ram_bytes: 0,
            disk_bytes: 0,
        }
    }

    /// Regression (issue 22, item 12): `sandbox-mcp` killed during a fork left a
    /// partial `.tmp-ID` checkpoint (131 MiB) for ten minutes, and a fork checkpoint
    /// no VM used for its 60 s grace and past the sweep within it. What a writer that
    /// is gone left goes at the next sweep; a live writer's work stays.
    #[test]
    fn a_sweep_removes_what_a_dead_maker_left_and_keeps_a_live_ones() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::new(root.path().join("checkpoints"), root.path().join("run"));
        let folder = |name: &str, maker: Option<u32>, manifest: Option<Manifest>| {
            let dir = store.root().join(name);
            fs::create_dir_all(&dir).unwrap();
            if let Some(pid) = maker {
                fs::write(dir.join(MAKER_FILE), pid.to_string()).unwrap();
            }
            if let Some(manifest) = manifest {
                fs::write(
                    dir.join(MANIFEST_FILE),
                    serde_json::to_vec(&manifest).unwrap(),
                )
                .unwrap();
            }
            dir
        };
        let dead = dead_pid();
        let staged_dead = folder(".tmp-a", Some(dead), None);
        let staged_live = folder(".tmp-b", Some(std::process::id()), None);
        let staged_unknown = folder(".tmp-c", None, None);
        let fork_dead = folder("fork-a", Some(dead), Some(ephemeral("fork-a")));
        let fork_live = folder(
            "fork-b",
            Some(std::process::id()),
            Some(ephemeral("fork-b")),
        );
        assert_eq!(store.sweep(), vec!["fork-a".to_owned()]);
        assert!(
            !staged_dead.exists(),
            "a dead writer's staging folder was kept"
        );
        assert!(!fork_dead.exists());
        for kept in [staged_live, staged_unknown, fork_live] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }

    /// Regression (issue 22, item 1): a woken branch's record named its spent
    /// hibernation image instead of the checkpoint, and the checkpoint was deleted
    /// under it. Its disk chain (the overlay it writes → the frozen hibernation disk →
    /// the checkpoint's disk) keeps the checkpoint in use, and so does a hibernation
    /// image based on it, whatever the record says.
    #[test]
    fn a_vm_whose_disk_chain_ends_in_a_checkpoint_uses_it() {
        use crate::launcher::run_dir::{VmId, VmRecord};
        let root = tempfile::tempdir().unwrap();
        let store = Store::new(root.path().join("checkpoints"), root.path().join("run"));
        let checkpoint = store.root().join("c1");
        fs::create_dir_all(&checkpoint).unwrap();
        let mut manifest = ephemeral("c1");
        manifest.ephemeral = false;
        fs::write(
            checkpoint.join(MANIFEST_FILE),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        let base = checkpoint.join(DISK_FILE);
        qcow2(&base, None);

        let id = VmId::generate();
        let run = root.path().join("run").join(id.as_str());
        fs::create_dir_all(&run).unwrap();
        // Every run folder is made with its lock file (`RunDir::create`).
        fs::write(run.join(run_dir::LOCK_FILE), b"").unwrap();
        let record = |hibernation: Option<&str>| VmRecord {
            id: id.clone(),
            owner_pid: std::process::id(),
            detached: true,
            qemu_pid: None,
            qemu_started_ticks: None,
            daemon_pid: None,
            agent_url: "unix:///x".into(),
            template: "python".into(),
            accel: crate::launcher::Accel::Tcg,
            size: crate::launcher::Size::SMALL,
            created_at_unix_ms: run_dir::now_unix_ms(),
            transport: crate::launcher::AgentTransport::Serial,
            // What the hibernation left: its own image's id, not c1.
            checkpoint: Some("spent-image".into()),
            hibernation: hibernation.map(str::to_owned),
            restored_from: None,
        };
        let write_record = |record: &VmRecord| {
            fs::write(run.join("vm.json"), serde_json::to_vec(record).unwrap()).unwrap();
        };
        let users = || store.find("c1").unwrap().users;
        assert!(users().is_empty());

        // Asleep: the image's frozen disk backs onto c1.
        let image = run.join("hibernation-x");
        fs::create_dir_all(&image).unwrap();
        qcow2(&image.join(DISK_FILE), Some(&base));
        write_record(&record(Some("hibernation-x")));
        assert_eq!(users(), vec![format!("VM {id}")]);
        assert!(matches!(
            store.delete("c1"),
            Err(SnapshotError::InUse { .. })
        ));

        // Woken: the image is gone, the frozen disk linked into the run folder under
        // the overlay the VM writes.
        fs::remove_dir_all(&image).unwrap();
        let frozen = run.join("disk-x.qcow2");
        qcow2(&frozen, Some(&base));
        qcow2(&run.join("overlay-next.qcow2"), Some(&frozen));
        write_record(&record(None));
        // Its owner holds the folder's lock, as a woken VM's does.
        let owner = run_dir::RunDir::try_adopt(&root.path().join("run"), &id)
            .unwrap()
            .unwrap();
        assert_eq!(users(), vec![format!("VM {id}")]);
        assert!(matches!(
            store.delete("c1"),
            Err(SnapshotError::InUse { .. })
        ));

        // Stopped: its folder goes, and c1 is free.
        drop(owner);
        fs::remove_dir_all(&run).unwrap();
        assert!(users().is_empty());
        store.delete("c1").unwrap();
    }

    /// A qcow2 header naming `backing` (see `users`' tests).
    fn qcow2(path: &Path, backing: Option<&Path>) {
        let mut bytes = vec![0u8; 104];
        bytes[..4].copy_from_slice(b"QFI\xfb");
        bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
        if let Some(backing) = backing {
            use std::os::unix::ffi::OsStrExt;
            let name = backing.as_os_str().as_bytes();
            bytes[8..16].copy_from_slice(&104u64.to_be_bytes());
            bytes[16..20].copy_from_slice(&u32::try_from(name.len()).unwrap().to_be_bytes());
            bytes.extend_from_slice(name);
        }
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "base-1", "v1.2_x"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
