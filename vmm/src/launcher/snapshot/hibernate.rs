//! Hibernate and wake: a VM's state goes to disk and its QEMU ends, freeing its
//! memory; the same id comes back later with its files, processes and logs, its clock
//! corrected.
//!
//! The image is a checkpoint folder inside the VM's run folder
//! (`hibernation-<id>/`, see `manifest`), so it goes with the VM when it is stopped.
//! Waking copies the RAM image into the VM's own tmpfs RAM file (so the woken VM can
//! be checkpointed cheaply again), restores into the same run folder, id, token and
//! agent socket, and then removes the image folder: what the woken VM still uses (the
//! kernel and initramfs, the frozen disk its new overlay is based on) is hard-linked
//! into the run folder first.
//!
//! A VM is hibernated either by id, detached ([`Launcher::hibernate`] and
//! [`Launcher::wake`], what `sandboxctl` uses), or through the handle of a VM this
//! process owns ([`Launcher::hibernate_owned`] and [`Launcher::wake_owned`], what a
//! server that must not leave VMs behind uses). An owned VM stays owned while it
//! sleeps: its woken QEMU dies with this process again, and if this process dies
//! first, the next sweep removes the image (see `run_dir`'s `Hibernated`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::capture::{AfterCapture, CheckpointSpec};
use super::manifest::{read_manifest, RamImage, INITRAMFS_FILE, KERNEL_FILE, RAM_FILE};
use super::{BranchSpec, SnapshotError};
use crate::launcher::boot::{stop_foreign, Launcher};
use crate::launcher::run_dir::{self, qemu_name, RunDir, VmId, VmRecord, RAM_LINK};
use crate::launcher::start::{read_disk_top, IncomingRam};
use crate::launcher::vm::Vm;

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

/// An owned VM that [`Launcher::hibernate_owned`] did not hibernate.
#[derive(Debug)]
pub struct NotHibernated {
    /// Why.
    pub error: SnapshotError,
    /// The VM, running as before, when the capture failed; `None` when it was
    /// captured but its new state could not be recorded (it was stopped then).
    pub vm: Option<Vm>,
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

    /// Hibernates a VM through its handle: like [`Launcher::hibernate`], but the VM
    /// stays this process's. Its image waits in its run folder for
    /// [`Launcher::wake_owned`] (or `stop`); for a VM booted without `detached`, if
    /// this process dies first, the next sweep removes it, as it would have killed
    /// the running VM (a detached VM's image waits for anyone's wake, as it would
    /// have kept running). A failed capture hands the VM back, running.
    pub async fn hibernate_owned(&self, mut vm: Vm) -> Result<Hibernation, Box<NotHibernated>> {
        let started = Instant::now();
        let id = vm.id().clone();
        let run = vm.run_path.clone();
        let image_id = VmId::generate().to_string();
        let name = format!("hibernation-{image_id}");
        let folder = run.join(&name);
        let spec = CheckpointSpec::default();
        // The capture records the image as the checkpoint the VM's disk now backs
        // onto; the VM's own checkpoint (the one its chain ends in) is what it still
        // uses: kept, as `hibernate` keeps it.
        let checkpoint = run_dir::read_record(&run)
            .map_or_else(|| vm.record.checkpoint.clone(), |record| record.checkpoint);
        let captured = self
            .capture(
                &id,
                &folder,
                None,
                &image_id,
                &spec,
                AfterCapture::StayPaused,
            )
            .await;
        let captured = match captured {
            Ok(captured) => captured,
            Err(error) => {
                return Err(Box::new(NotHibernated {
                    error,
                    vm: Some(vm),
                }))
            }
        };
        // Recorded while this process still holds the folder's lock, so no sweep can
        // take the folder for a stale one in between.
        let mut record = run_dir::read_record(&run).unwrap_or_else(|| vm.record.clone());
        record.checkpoint = checkpoint;
        record.qemu_pid = None;
        record.daemon_pid = None;
        record.hibernation = Some(name);
        if let Err(error) = run_dir::write_record_file(&run, &record) {
            // The VM is paused with nowhere to go: dropping it kills it and removes
            // its folder, image and all.
            drop(vm);
            return Err(Box::new(NotHibernated {
                error: error.into(),
                vm: None,
            }));
        }
        // Paused, its state on disk: QEMU ends at once, then its relay; the folder
        // stays, unlocked.
        if let Some(mut qemu) = vm.qemu.take() {
            qemu.kill_and_reap();
        }
        if let Some(daemon) = vm.daemon.take() {
            daemon.stop().await;
        }
        if let Some(mut adopted) = vm.adopted.take() {
            // Not a child: signalled by pidfd; its relay ends as QEMU's chardev closes.
            adopted.stop(Duration::ZERO).await;
        }
        if let Some(dir) = vm.run_dir.take() {
            dir.keep();
        }
        drop(vm);
        if let Ok(ram) = std::fs::read_link(run.join(RAM_LINK)) {
            let _ = std::fs::remove_file(ram);
        }
        let _ = std::fs::remove_file(run.join(RAM_LINK));
        let manifest = &captured.manifest;
        tracing::info!(vm = %id, pause_ms = manifest.pause_ms, "hibernated (owned)");
        Ok(Hibernation {
            bytes_on_disk: manifest.state_bytes + manifest.ram_bytes + manifest.disk_bytes,
            path: folder,
            took: started.elapsed(),
        })
    }

    /// Wakes a VM hibernated by [`Launcher::hibernate_owned`] as a VM this process
    /// owns: the same id, token and agent URL, files, processes and logs, the clock
    /// set from the host. A failed wake keeps the image for another try. A wake of
    /// the same VM by another caller that wins the race leaves this one with
    /// [`SnapshotError::NotHibernated`] (that VM is not this process's).
    ///
    /// A VM hibernated detached (by a node daemon, whose VMs outlive it) wakes
    /// detached again, still through a handle.
    pub async fn wake_owned(&self, id: &VmId) -> Result<Vm, SnapshotError> {
        let started = Instant::now();
        let run = self.config.run_root.join(id.as_str());
        let detached = run_dir::read_record(&run).is_some_and(|record| record.detached);
        let mut vm = match self.restore_hibernated(id, detached).await? {
            Restored::Here(vm) => *vm,
            Restored::ByAnother(_) => {
                return Err(SnapshotError::NotHibernated { id: id.to_string() })
            }
        };
        // Adopted for the wake and kept while it could fail; owned again from here.
        if let Some(dir) = vm.run_dir.as_mut() {
            dir.remove_on_drop();
        }
        tracing::info!(vm = %id, took_ms = started.elapsed().as_millis(), "woken (owned)");
        Ok(vm)
    }

    /// Wakes the hibernated VM `id` (detached, like it was): the same id, token and
    /// agent URL; files, processes and logs as they were; the clock set from the host.
    /// Wakes of one VM run one at a time: a wake that finds another under way waits
    /// for it and returns its result (the VM it woke), so concurrent callers all get
    /// the same VM.
    pub async fn wake(&self, id: &VmId) -> Result<Wake, SnapshotError> {
        let started = Instant::now();
        let vm = match self.restore_hibernated(id, true).await? {
            Restored::Here(vm) => *vm,
            Restored::ByAnother(record) => {
                tracing::info!(vm = %id, "woken by another caller meanwhile");
                return Ok(Wake {
                    record,
                    took: started.elapsed(),
                });
            }
        };
        let Ok(record) = vm.detach() else {
            return Err(SnapshotError::NotCapable {
                id: id.to_string(),
                why: "the woken VM could not be detached".into(),
            });
        };
        tracing::info!(vm = %id, took_ms = started.elapsed().as_millis(), "woken");
        Ok(Wake {
            record,
            took: started.elapsed(),
        })
    }

    /// Restores the hibernated VM `id` in place (its run folder, id and token), its
    /// clock set, its record no longer hibernated and its spent image gone.
    ///
    /// One wake at a time per VM: the VM's folder lock is taken before the record
    /// is trusted, and held until the record says it is awake. A caller that finds
    /// the lock held (another wake, or a sweep looking) waits for it; when the record
    /// then says the VM is awake, another wake won and its VM is the result. Without
    /// this, three `vm wake` at once started three QEMUs on one folder, and a loser's
    /// clean-up deleted the RAM file the winner was restoring into (its QEMU then
    /// failed: "VQ 2 size 0x400 Guest index 0x0 inconsistent").
    async fn restore_hibernated(
        &self,
        id: &VmId,
        detached: bool,
    ) -> Result<Restored, SnapshotError> {
        let run = self.config.run_root.join(id.as_str());
        let no_vm = || SnapshotError::NoVm { id: id.to_string() };
        let deadline = Instant::now() + WAKE_WAIT;
        let mut waited = false;
        let dir = loop {
            let record = run_dir::read_record(&run).ok_or_else(no_vm)?;
            if record.hibernation.is_none() {
                if waited {
                    return Ok(Restored::ByAnother(record));
                }
                return Err(SnapshotError::NotHibernated { id: id.to_string() });
            }
            if let Some(dir) = RunDir::try_adopt(&self.config.run_root, id)? {
                break dir;
            }
            if Instant::now() >= deadline {
                let error = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("another wake of this VM held it for {WAKE_WAIT:?}"),
                );
                let error = run_dir::RunDirError::Lock { path: run, error };
                return Err(SnapshotError::Wake {
                    id: id.to_string(),
                    error: Box::new(error.into()),
                });
            }
            waited = true;
            // flock(2) has no timeout, and a thread blocked in it cannot be
            // cancelled: look again shortly instead.
            tokio::time::sleep(WAKE_POLL).await;
        };
        // Under the lock: the record as the last holder left it.
        let record = run_dir::read_record(&run).ok_or_else(no_vm)?;
        let Some(name) = record.hibernation.clone() else {
            return Ok(Restored::ByAnother(record));
        };
        let folder = run.join(&name);
        let manifest = read_manifest(&folder).map_err(|error| SnapshotError::Damaged {
            id: name.clone(),
            why: format!("cannot read its manifest: {error}"),
        })?;
        let spec = BranchSpec {
            detached,
            ..BranchSpec::default()
        };
        let mut start = self.restore_start(&folder, &manifest, &spec)?;
        if let Some(incoming) = &mut start.incoming {
            incoming.ram = match manifest.ram {
                // `restore_start` refused an image that is not flattened.
                RamImage::File | RamImage::Diff => IncomingRam::CopyOf(folder.join(RAM_FILE)),
                RamImage::InStream => IncomingRam::Stream,
            };
        }
        // What the woken VM goes on using moves out of the image folder, which then
        // goes whole (each cycle left a `hibernation-*` folder behind).
        let disk_top_before = read_disk_top(&run);
        keep_outside_image(&run, &name, &mut start)?;
        // Still the VM it was: its own checkpoint reference, token and folder.
        start.checkpoint = record.checkpoint.clone();
        start.token = run_dir::read_token(&run).unwrap_or(start.token);
        start.reuse = Some((id.clone(), Some(name)));
        // A failed start removes the RAM copy it made itself, before it lets go of
        // the lock (see `start_machine_in`).
        let mut vm = self
            .start_machine_in(start, Some(dir))
            .await
            .map_err(|error| SnapshotError::Wake {
                id: id.to_string(),
                error: Box::new(error),
            })?;
        if let Err(error) = super::restore::fix_clock_of(&vm).await {
            tracing::warn!(vm = %id, %error, "could not set the woken VM's clock");
        }
        // Awake in the record before the lock can go (a detach or a drop releases it),
        // so a wake waiting for it sees the VM awake rather than an image to restore.
        vm.record.hibernation = None;
        if let Err(error) = run_dir::write_record_file(&vm.run_path, &vm.record) {
            // Dropping the VM kills it; the image stays for another wake (its record
            // still names it).
            drop(vm);
            return Err(error.into());
        }
        if let Err(error) = std::fs::remove_dir_all(&folder) {
            tracing::warn!(vm = %id, %error, "cannot remove the spent hibernation image");
        }
        // The overlay the hibernation switched the disk to is unused: the woken VM
        // writes a fresh one.
        if let Some(unused) =
            disk_top_before.filter(|top| Some(top) != read_disk_top(&run).as_ref())
        {
            let _ = std::fs::remove_file(unused);
        }
        Ok(Restored::Here(Box::new(vm)))
    }
}

/// How long a wake waits for another wake of the same VM to finish: longer than a
/// wake can take (loading its state, up to 120 s, then its agent, up to 60 s).
const WAKE_WAIT: Duration = Duration::from_secs(240);

/// How often a waiting wake looks at the VM again.
const WAKE_POLL: Duration = Duration::from_millis(20);

/// What [`Launcher::restore_hibernated`] found once it held the VM.
enum Restored {
    /// This call woke it.
    Here(Box<Vm>),
    /// Another wake woke it while this one waited: the record it left.
    ByAnother(VmRecord),
}

/// Points a wake's `start` at hard links, in the run folder, to the image's files the
/// woken VM keeps using: the kernel and initramfs (its `machine.json` names them for
/// later checkpoints) and the frozen disk (the base of its new overlay). Hard links
/// within the run folder: the image folder can then go whole, and nothing is copied.
fn keep_outside_image(
    run: &Path,
    image: &str,
    start: &mut crate::launcher::start::Start,
) -> Result<(), SnapshotError> {
    let relink = |from: &Path, name: &str| -> Result<PathBuf, SnapshotError> {
        let to = run.join(name);
        let temp = run.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&temp);
        std::fs::hard_link(from, &temp)
            .and_then(|()| std::fs::rename(&temp, &to))
            .map_err(|error| SnapshotError::Write {
                path: to.clone(),
                error,
            })?;
        Ok(to)
    };
    start.machine.kernel = relink(&start.machine.kernel, KERNEL_FILE)?;
    if let Some(initramfs) = &start.machine.initramfs {
        start.machine.initramfs = Some(relink(initramfs, INITRAMFS_FILE)?);
    }
    if let Some(disk) = &start.disk_base {
        let image_id = image.trim_start_matches("hibernation-");
        start.disk_base = Some(relink(disk, &format!("disk-{image_id}.qcow2"))?);
    }
    Ok(())
}
