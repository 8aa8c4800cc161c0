//! Hibernate and wake: a VM's state goes to disk and its QEMU ends, freeing its
//! memory; the same id comes back later with its files, processes and logs, its clock
//! corrected.
//!
//! The image is a checkpoint folder inside the VM's run folder
//! (`hibernation-<id>/`, see `manifest`), so it goes with the VM when it is stopped.
//! Waking copies the RAM image into the VM's own tmpfs RAM file (so the woken VM can
//! be checkpointed cheaply again), restores into the same run folder, id, token and
//! agent socket, and then drops the RAM image and the state stream; the disk image and
//! the kernel links stay, as the woken VM still uses them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::capture::{AfterCapture, CheckpointSpec};
use super::manifest::{read_manifest, RamImage, RAM_FILE, STATE_FILE};
use super::{BranchSpec, SnapshotError};
use crate::launcher::boot::{stop_foreign, Launcher};
use crate::launcher::run_dir::{self, qemu_name, VmId, VmRecord, RAM_LINK};
use crate::launcher::start::IncomingRam;

/// How long QEMU gets to exit after a hibernation captured its state.
const QEMU_EXIT_GRACE: Duration = Duration::from_secs(5);

/// What a hibernation did.
#[derive(Debug, Clone)]
pub struct Hibernation {
    /// The image folder.
    pub path: PathBuf,
    /// Bytes the image occupies on disk (state stream, RAM image, frozen disk).
    pub bytes_on_disk: u64,
    /// From the call until QEMU was gone.
    pub took: Duration,
}

/// What a wake did.
#[derive(Debug, Clone)]
pub struct Wake {
    /// The VM's record (running again, detached).
    pub record: VmRecord,
    /// From the call until the agent answered with its clock set.
    pub took: Duration,
}

impl Launcher {
    /// Hibernates the running VM `id`: its state goes to disk in its run folder, then
    /// its QEMU and relay end. A handle on the VM held by this process must be
    /// detached first ([`crate::launcher::Vm::detach`]): dropping it would remove the
    /// run folder, image and all.
    pub async fn hibernate(&self, id: &VmId) -> Result<Hibernation, SnapshotError> {
        let started = Instant::now();
        let run = self.config.run_root.join(id.as_str());
        let mut record =
            run_dir::read_record(&run).ok_or_else(|| SnapshotError::NoVm { id: id.to_string() })?;
        if !record.detached {
            return Err(SnapshotError::NotCapable {
                id: id.to_string(),
                why: "its owner holds it (only a detached VM can be hibernated: detach it first)"
                    .into(),
            });
        }
        if record.hibernation.is_some() {
            return Err(SnapshotError::NotRunning {
                id: id.to_string(),
                state: "hibernated".into(),
            });
        }
        let image_id = VmId::generate().to_string();
        let name = format!("hibernation-{image_id}");
        let folder = run.join(&name);
        let captured = self
            .capture(
                id,
                &folder,
                None,
                &image_id,
                &CheckpointSpec::default(),
                AfterCapture::StayPaused,
            )
            .await?;
        let (qemu_pid, daemon_pid) = (record.qemu_pid.take(), record.daemon_pid.take());
        record.hibernation = Some(name);
        run_dir::write_record_file(&run, &record)?;
        if let Some(pid) = qemu_pid {
            stop_foreign(pid, &qemu_name(id), QEMU_EXIT_GRACE).await;
        }
        if let Some(pid) = daemon_pid {
            // The relay ends by itself once QEMU's chardev closes.
            stop_foreign(pid, &run.to_string_lossy(), QEMU_EXIT_GRACE).await;
        }
        if let Ok(ram) = std::fs::read_link(run.join(RAM_LINK)) {
            let _ = std::fs::remove_file(ram);
        }
        let _ = std::fs::remove_file(run.join(RAM_LINK));
        let manifest = &captured.manifest;
        tracing::info!(vm = %id, pause_ms = manifest.pause_ms, "hibernated");
        Ok(Hibernation {
            bytes_on_disk: manifest.state_bytes + manifest.ram_bytes + manifest.disk_bytes,
            path: folder,
            took: started.elapsed(),
        })
    }

    /// Wakes the hibernated VM `id` (detached, like it was): the same id, token and
    /// agent URL; files, processes and logs as they were; the clock set from the host.
    pub async fn wake(&self, id: &VmId) -> Result<Wake, SnapshotError> {
        let started = Instant::now();
        let run = self.config.run_root.join(id.as_str());
        let record =
            run_dir::read_record(&run).ok_or_else(|| SnapshotError::NoVm { id: id.to_string() })?;
        let Some(name) = record.hibernation.clone() else {
            return Err(SnapshotError::NotHibernated { id: id.to_string() });
        };
        let folder = run.join(&name);
        let manifest = read_manifest(&folder).map_err(|error| SnapshotError::Damaged {
            id: name.clone(),
            why: format!("cannot read its manifest: {error}"),
        })?;
        let spec = BranchSpec {
            detached: true,
            ..BranchSpec::default()
        };
        let mut start = self.restore_start(&folder, &manifest, &spec)?;
        if let Some(incoming) = &mut start.incoming {
            incoming.ram = match manifest.ram {
                RamImage::File => IncomingRam::CopyOf(folder.join(RAM_FILE)),
                RamImage::InStream => IncomingRam::Stream,
            };
        }
        // Still the VM it was: its own checkpoint reference, token and folder.
        start.checkpoint = record.checkpoint.clone();
        start.token = run_dir::read_token(&run).unwrap_or(start.token);
        start.reuse = Some((id.clone(), Some(name)));
        let vm = self.start_machine(start).await.map_err(|error| {
            // The copy of its RAM made for the restore is not needed any more.
            if let Ok(ram) = std::fs::read_link(run.join(RAM_LINK)) {
                let _ = std::fs::remove_file(ram);
            }
            SnapshotError::Wake {
                id: id.to_string(),
                error: Box::new(error),
            }
        })?;
        if let Err(error) = super::restore::fix_clock_of(&vm).await {
            tracing::warn!(vm = %id, %error, "could not set the woken VM's clock");
        }
        let Ok(mut record) = vm.detach() else {
            return Err(SnapshotError::NotCapable {
                id: id.to_string(),
                why: "the woken VM could not be detached".into(),
            });
        };
        record.hibernation = None;
        run_dir::write_record_file(&run, &record)?;
        // The big parts of the image are spent; the disk and kernel links stay.
        for spent in [RAM_FILE, STATE_FILE] {
            let _ = std::fs::remove_file(folder.join(spent));
        }
        tracing::info!(vm = %id, took_ms = started.elapsed().as_millis(), "woken");
        Ok(Wake {
            record,
            took: started.elapsed(),
        })
    }
}
