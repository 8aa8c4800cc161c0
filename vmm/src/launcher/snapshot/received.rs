//! A hibernated VM that comes from another host: its run folder made here, under
//! the id it had there, and filled by the caller (a node taking a sandbox parked
//! in the fleet's object store) with its hibernation image; then recorded as a
//! detached, hibernated VM of this host, which the next wake restores like any
//! other ([`Launcher::wake_owned`]).
//!
//! Nothing of the other host's record is trusted: the VM record is rebuilt from
//! the image's own manifest (template, size, accelerator, transport) and this
//! host's paths, so a record naming the other host's sockets or pids cannot point
//! this one anywhere.

use std::path::{Path, PathBuf};

use super::manifest::read_manifest;
use super::SnapshotError;
use crate::launcher::boot::Launcher;
use crate::launcher::run_dir::{self, RunDir, VmId, VmRecord};
use crate::launcher::start::agent_url_in;

/// The prefix of a hibernation image's folder name inside a run folder.
pub const HIBERNATION_PREFIX: &str = "hibernation-";

/// A run folder being filled with a VM hibernated elsewhere: locked while it is
/// filled (a sweep leaves it alone), removed when dropped before
/// [`Received::commit`] (the run folder handle's own drop).
#[derive(Debug)]
pub struct Received {
    dir: Option<RunDir>,
    path: PathBuf,
}

impl Launcher {
    /// Makes the run folder of VM `id`, arriving hibernated from another host;
    /// refused when a VM of that id is here.
    pub fn receive_hibernated(&self, id: &VmId) -> Result<Received, SnapshotError> {
        let dir = RunDir::create_named(&self.config.run_root, id)?;
        Ok(Received {
            path: dir.path().to_owned(),
            dir: Some(dir),
        })
    }
}

impl Received {
    /// The run folder: the image goes in `path()/hibernation-<image id>/`, files
    /// its disk chain needs beside it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the VM as hibernated in its image folder `image` (a name inside the
    /// run folder, `hibernation-...`), its agent's token `vm_token`, detached, and
    /// lets the folder go: from here it is a hibernated VM of this host.
    pub fn commit(mut self, image: &str, vm_token: &str) -> Result<VmRecord, SnapshotError> {
        let damaged = |why: String| SnapshotError::Damaged {
            id: image.to_owned(),
            why,
        };
        if !image.starts_with(HIBERNATION_PREFIX) || image.contains('/') {
            return Err(damaged("not a hibernation image's folder name".to_owned()));
        }
        let dir = self
            .dir
            .take()
            .ok_or_else(|| damaged("committed twice".to_owned()))?;
        let manifest = read_manifest(&self.path.join(image))
            .map_err(|error| damaged(format!("cannot read its manifest: {error}")))?;
        let machine = &manifest.machine;
        let record = VmRecord {
            id: dir.id().clone(),
            owner_pid: std::process::id(),
            detached: true,
            qemu_pid: None,
            daemon_pid: None,
            agent_url: agent_url_in(&self.path, machine.transport),
            template: machine.template.clone(),
            accel: machine.accel,
            size: machine.size,
            created_at_unix_ms: run_dir::now_unix_ms(),
            transport: machine.transport,
            // Its disk chain is in this folder: it maps no checkpoint of this host.
            checkpoint: None,
            hibernation: Some(image.to_owned()),
            restored_from: Some(manifest.id.clone()),
            qemu_started_ticks: None,
        };
        dir.write_token(vm_token)?;
        dir.write_record(&record)?;
        dir.keep();
        Ok(record)
    }
}
