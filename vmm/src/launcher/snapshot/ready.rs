//! Starting from a snapshot instead of booting: templates' *ready* snapshots, and
//! promoted templates.
//!
//! - **Ready snapshots.** The first serial boot of a template (at a size, under an
//!   accelerator) is checkpointed right after its agent is ready, into
//!   `SANDBOX_HOME/cache/ready/<template>-<size>-<fingerprint>/`; later boots of the
//!   same template restore it (copy-on-write RAM, a new identity each) instead of
//!   booting. The fingerprint covers the template's manifest and the size and mtime of
//!   its kernel, initramfs and disk, and QEMU's binary, so a rebuilt template or an
//!   upgraded QEMU gets a new snapshot; older ones of the template are removed once no
//!   VM maps them. A snapshot that fails to restore is dropped and the boot goes cold.
//!   A boot with extra kernel parameters, a persistent disk or `cold` always boots.
//! - **Promote** ([`Launcher::promote`]): a running VM's state becomes a template
//!   whose `template.json` names its snapshot; VMs of it always restore.

use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use sandbox_rootfs::TemplateManifest;

use super::capture::{AfterCapture, Checkpoint, CheckpointSpec};
use super::manifest::{check_name, read_manifest, Store, DISK_FILE, INITRAMFS_FILE, KERNEL_FILE};
use super::restore::BranchSpec;
use super::SnapshotError;
use crate::launcher::boot::{BootSpec, Launcher};
use crate::launcher::config::AgentTransport;
use crate::launcher::run_dir::VmId;
use crate::launcher::size::Size;
use crate::launcher::start::{IncomingRam, MachineSpec, MACHINE_FILE};
use crate::launcher::template::{Template, TemplateRef, TEMPLATE_FILE};
use crate::launcher::vm::Vm;
use crate::launcher::{Accel, LaunchError};

/// The folder under `SANDBOX_HOME/cache` that holds ready snapshots.
pub const READY_DIR: &str = "ready";

/// The file in a ready snapshot naming its template's folder.
const TEMPLATE_DIR_FILE: &str = "template-dir";

/// The snapshot folder inside a promoted template.
pub const PROMOTED_SNAPSHOT_DIR: &str = "snapshot";

/// What a promotion made.
#[derive(Debug, Clone)]
pub struct Promotion {
    /// The new template's folder.
    pub dir: PathBuf,
    /// The capture.
    pub checkpoint: Checkpoint,
    /// True when a template of that name was replaced.
    pub replaced: bool,
}

impl Launcher {
    /// The store of ready snapshots.
    fn ready_store(&self) -> Store {
        Store::new(
            self.config.home.cache().join(READY_DIR),
            self.config.run_root.clone(),
        )
    }

    /// A VM of a promoted template: its snapshot restored, with a new identity.
    pub(crate) async fn restore_promoted(
        &self,
        snapshot: &Path,
        spec: &BootSpec,
    ) -> Result<Vm, LaunchError> {
        let branch = BranchSpec {
            detached: spec.detached,
            ready_timeout: spec.ready_timeout,
        };
        self.restore_one(snapshot, &branch, &spec.net)
            .await
            .map_err(|error| LaunchError::Snapshot(Box::new(error)))
    }

    /// A boot that may restore the template's ready snapshot instead (a promoted
    /// template's never gets here: see [`Launcher::restore_promoted`]). `Ok(None)`:
    /// boot cold (and `Some(key)` in the second place: take the ready snapshot after
    /// the boot).
    pub(crate) async fn try_restore(
        &self,
        template: &Template,
        size: Size,
        accel: Accel,
        transport: AgentTransport,
        spec: &BootSpec,
    ) -> Result<(Option<Vm>, Option<String>), LaunchError> {
        let branch = BranchSpec {
            detached: spec.detached,
            ready_timeout: spec.ready_timeout,
        };
        let eligible = transport == AgentTransport::Serial
            && !spec.cold
            && spec.extra_cmdline.trim().is_empty()
            && spec.persistent_disk.is_none();
        if !eligible {
            return Ok((None, None));
        }
        let key = ready_key(template, size, accel, &self.config.qemu_path);
        let store = self.ready_store();
        let folder = store.root().join(&key);
        if !folder.is_dir() {
            return Ok((None, Some(key)));
        }
        match self.restore_one(&folder, &branch, &spec.net).await {
            Ok(vm) => Ok((Some(vm), None)),
            Err(error) => {
                tracing::warn!(template = %template.name, error = %crate::error_chain(&error), "the ready snapshot did not restore: dropping it and booting");
                let _ = store.delete(&key);
                Ok((None, Some(key)))
            }
        }
    }

    /// Takes a just-booted VM's ready snapshot under `key` (another process may have
    /// taken it first: then this one is dropped).
    pub(crate) async fn take_ready_snapshot(&self, vm: &Vm, template: &Template, key: &str) {
        let store = self.ready_store();
        // Only here, when a new snapshot is taken, not on every restore: outdated
        // ones (a rebuilt or deleted template) and writers' leftovers go.
        store.sweep_temporary();
        remove_outdated(&store, &template.dir, key);
        let folder = store.root().join(key);
        let spec = CheckpointSpec::default();
        match self
            .capture(vm.id(), &folder, None, key, &spec, AfterCapture::Continue)
            .await
        {
            Ok(taken) => {
                // Which template it belongs to, so it goes when the template does.
                let _ = fs::write(
                    folder.join(TEMPLATE_DIR_FILE),
                    template.dir.as_os_str().as_encoded_bytes(),
                );
                tracing::info!(
                    key,
                    pause_ms = taken.pause.as_millis(),
                    "ready snapshot taken"
                );
            }
            Err(error) => {
                tracing::debug!(key, error = %crate::error_chain(&error), "no ready snapshot taken")
            }
        }
    }

    /// One VM restored from the snapshot folder `folder`, with its own identity.
    async fn restore_one(
        &self,
        folder: &Path,
        spec: &BranchSpec,
        net: &crate::egress::Net,
    ) -> Result<Vm, SnapshotError> {
        let manifest = read_manifest(folder).map_err(|error| SnapshotError::Damaged {
            id: folder.display().to_string(),
            why: format!("cannot read its manifest: {error}"),
        })?;
        let mut start = self.restore_start(folder, &manifest, spec)?;
        // A VM started from a template is an ordinary VM: its RAM is a copy in its own
        // shared file (a ~70 MiB sparse copy on the tmpfs), not a copy-on-write map of
        // the snapshot, so checkpointing it later pauses it ~50 ms (a private map
        // would put all of its RAM into the stream: ~1 s). Branch and fork children,
        // made many at a time, map the snapshot instead.
        if let Some(incoming) = &mut start.incoming {
            if let IncomingRam::Map(image) = &incoming.ram {
                incoming.ram = IncomingRam::CopyOf(image.clone());
            }
        }
        // It does not map the snapshot's RAM; only a disk keeps the snapshot in use.
        if !manifest.machine.disk {
            start.checkpoint = None;
        }
        start.restored_from = Some(manifest.id.clone());
        // A template's snapshot carries no network of its own: the boot's is used.
        start.egress = net.policy().cloned();
        self.start_child(start)
            .await
            .map_err(|error| error.into_snapshot_error(1, 1))
    }

    /// Makes the running VM `id`'s current state the template `name` (replacing one
    /// of that name; VMs running from the old one keep running). VMs of the template
    /// restore this state, each with a new identity.
    pub async fn promote(&self, id: &VmId, name: &str) -> Result<Promotion, SnapshotError> {
        check_name(name)?;
        let run = self.config.run_root.join(id.as_str());
        let machine: MachineSpec = fs::read(run.join(MACHINE_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| SnapshotError::NoVm { id: id.to_string() })?;
        if machine.disk && self.config.templates_root().join(name).exists() {
            // Its disk chain may run through the template it would replace (a VM of
            // that template), and the replaced files go: refuse rather than break it.
            return Err(SnapshotError::NameTaken(format!(
                "{name} (a VM with a disk cannot replace a template; promote it under a new name)"
            )));
        }
        let source = self
            .template(&TemplateRef::Name(machine.template.clone()))
            .ok();
        let root = self.config.templates_root();
        fs::create_dir_all(&root).map_err(|error| write_error(&root, error))?;
        Store::new(root.clone(), self.config.run_root.clone()).sweep_temporary();
        let staging = root.join(format!(".promote-{}", VmId::generate()));
        fs::create_dir(&staging).map_err(|error| write_error(&staging, error))?;
        let result = self
            .promote_into(id, name, &machine, source.as_ref(), &staging)
            .await;
        let checkpoint = match result {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                let _ = fs::remove_dir_all(&staging);
                return Err(error);
            }
        };
        let dir = root.join(name);
        let old = root.join(format!(".replaced-{}", VmId::generate()));
        let replaced = fs::rename(&dir, &old).is_ok();
        if let Err(error) = fs::rename(&staging, &dir) {
            if replaced {
                let _ = fs::rename(&old, &dir);
            }
            let _ = fs::remove_dir_all(&staging);
            return Err(write_error(&dir, error));
        }
        if replaced {
            // Running VMs of the old template keep the files they have open.
            let _ = fs::remove_dir_all(&old);
        }
        Ok(Promotion {
            dir,
            checkpoint,
            replaced,
        })
    }

    /// Deletes the promoted template `name` and answers the bytes it held. A built
    /// template (one without a promoted snapshot) is refused: only what promote
    /// made is removed here. The folder is renamed away first, so a claim racing the
    /// delete sees the template whole or not at all.
    pub fn delete_promoted(&self, name: &str) -> Result<u64, SnapshotError> {
        // A name no template can have is no template (quoted short: it is the caller's).
        if check_name(name).is_err() {
            let shown: String = name.chars().take(64).collect();
            return Err(SnapshotError::NoTemplate(shown));
        }
        let template = self
            .template(&TemplateRef::Name(name.to_owned()))
            .map_err(|_| SnapshotError::NoTemplate(name.to_owned()))?;
        if template.snapshot.is_none() {
            return Err(SnapshotError::NotPromoted(name.to_owned()));
        }
        let root = self.config.templates_root();
        let dir = root.join(name);
        let bytes = folder_bytes(&dir);
        let gone = root.join(format!(".deleted-{}", VmId::generate()));
        fs::rename(&dir, &gone).map_err(|error| write_error(&dir, error))?;
        // Running VMs of it keep the files they have open.
        fs::remove_dir_all(&gone).map_err(|error| write_error(&gone, error))?;
        Ok(bytes)
    }

    async fn promote_into(
        &self,
        id: &VmId,
        name: &str,
        machine: &MachineSpec,
        source: Option<&Template>,
        staging: &Path,
    ) -> Result<Checkpoint, SnapshotError> {
        let snapshot = staging.join(PROMOTED_SNAPSHOT_DIR);
        let ckpt_id = VmId::generate().to_string();
        // The VM's new disk overlay is based on the disk where the template will be.
        let final_snapshot = self
            .config
            .templates_root()
            .join(name)
            .join(PROMOTED_SNAPSHOT_DIR);
        let checkpoint = self
            .capture(
                id,
                &snapshot,
                Some(&final_snapshot),
                &ckpt_id,
                &CheckpointSpec::default(),
                AfterCapture::Continue,
            )
            .await?;
        let rel = |file: &str| Path::new(PROMOTED_SNAPSHOT_DIR).join(file);
        let manifest = TemplateManifest {
            name: name.to_owned(),
            kernel: rel(KERNEL_FILE),
            initramfs: rel(INITRAMFS_FILE),
            disk: machine.disk.then(|| rel(DISK_FILE)),
            cmdline: source.map_or_else(String::new, |t| t.cmdline.clone()),
            kernel_version: source
                .and_then(|t| t.kernel_version.clone())
                .unwrap_or_default(),
            agent_version: source
                .and_then(|t| t.agent_version.clone())
                .unwrap_or_default(),
            default_size: machine.size,
            created_at: sandbox_rootfs::manifest::now_rfc3339(),
            snapshot: Some(PathBuf::from(PROMOTED_SNAPSHOT_DIR)),
            // The VM's agent and disk still hold its template's defaults.
            image_config: source.map(|t| t.image_config.clone()).unwrap_or_default(),
            // A promoted VM has drifted from any registry image it began as.
            image_source: None,
        };
        manifest.save(staging).map_err(|error| {
            write_error(&staging.join(TEMPLATE_FILE), std::io::Error::other(error))
        })?;
        Ok(checkpoint)
    }
}

/// `<template>-<size>-<hash>`: what decides whether a ready snapshot still fits.
fn ready_key(template: &Template, size: Size, accel: Accel, qemu: &Path) -> String {
    let mut hash = Fnv::new();
    hash.write(template.dir.as_os_str().as_encoded_bytes());
    hash.write(&fs::read(template.dir.join(TEMPLATE_FILE)).unwrap_or_default());
    for file in [
        Some(&template.kernel),
        template.initramfs.as_ref(),
        template.disk.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        hash.write_file_identity(file);
    }
    let qemu = crate::launcher::accel::find_program(qemu).unwrap_or_else(|| qemu.to_owned());
    hash.write_file_identity(&qemu);
    hash.write(accel.to_string().as_bytes());
    // A guest kernel picks its copy routines from the CPU's flags at boot.
    hash.write(crate::launcher::qemu::cpu_model(accel).as_bytes());
    format!("{}-{size}-{:016x}", template.name, hash.0)
}

/// Removes ready snapshots that no VM maps and that are outdated: another one of
/// this template (`template_dir`), or one whose template folder is gone.
fn remove_outdated(store: &Store, template_dir: &Path, current: &str) {
    let Ok(all) = store.list() else {
        return;
    };
    for info in all {
        let id = &info.manifest.id;
        let of = fs::read(info.path.join(TEMPLATE_DIR_FILE))
            .ok()
            .map(|bytes| PathBuf::from(std::ffi::OsString::from_vec(bytes)));
        let outdated = match &of {
            Some(dir) if dir == template_dir => id != current,
            Some(dir) => !dir.join(TEMPLATE_FILE).is_file(),
            None => false,
        };
        if outdated && info.users.is_empty() {
            tracing::debug!(id, "removing an outdated ready snapshot");
            let _ = store.delete(id);
        }
    }
}

/// FNV-1a: a cache key stable across runs and builds (std's hashers are not).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 ^= 0xff;
    }

    fn write_file_identity(&mut self, path: &Path) {
        use std::os::unix::fs::MetadataExt;
        self.write(path.as_os_str().as_encoded_bytes());
        if let Ok(meta) = fs::metadata(path) {
            self.write(&meta.len().to_le_bytes());
            self.write(&meta.mtime().to_le_bytes());
            self.write(&meta.mtime_nsec().to_le_bytes());
        }
    }
}

fn write_error(path: &Path, error: std::io::Error) -> SnapshotError {
    SnapshotError::Write {
        path: path.to_owned(),
        error,
    }
}

/// Bytes the files under `dir` occupy on disk (what a delete frees).
fn folder_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => folder_bytes(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |m| m.blocks() * 512),
            Err(_) => 0,
        })
        .sum()
}
