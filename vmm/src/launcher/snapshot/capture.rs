//! Taking a checkpoint of a running VM (see the module docs of `snapshot`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::diff::{self, Chain, PAGES_FILE};
use super::manifest::{
    check_name, Manifest, RamImage, Store, DISK_FILE, INITRAMFS_FILE, KERNEL_FILE, MANIFEST_FILE,
    RAM_FILE, STATE_FILE, TOKEN_FILE,
};
use super::{live, SnapshotError};
use crate::launcher::boot::Launcher;
use crate::launcher::config::AgentTransport;
use crate::launcher::qmp::{MigrationStatus, Qmp, RunState};
use crate::launcher::run_dir::{self, VmId, RAM_LINK};
use crate::launcher::start::{read_disk_top, write_disk_top, MachineSpec, MACHINE_FILE};
use crate::launcher::{AGENT_SOCKET, DISK_OVERLAY, QMP_SOCKET};

/// How long QEMU's monitor may take to answer the first connection.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long writing the migration stream may take (RAM in the stream is the slow case).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// QEMU's default migration bandwidth (128 MiB/s) would make the pause of a stream
/// checkpoint seconds long: the stream goes to a local file, so no limit.
const MAX_BANDWIDTH: u64 = 64 << 30;

/// From how much RAM in use (the RAM file's allocated bytes) `auto` captures live:
/// below it a paused copy stops the guest for ~60 ms or less under TCG, the call is
/// short and the source keeps its holes; above it a paused copy's pause grows by
/// ~0.5 ms a MiB while a live capture's stays near 15 ms.
const AUTO_LIVE_BYTES: u64 = 128 << 20;

/// How long the source's agent may take to have its clock set after a checkpoint.
const CLOCK_FIX_TIMEOUT: Duration = Duration::from_secs(10);

/// The device id of the root disk (see `qemu`).
const DISK_DEVICE: &str = "disk0";

/// What becomes of the VM once its state is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCapture {
    /// It goes on (a checkpoint), its clock corrected.
    Continue,
    /// It stays paused, for the caller to stop (hibernation). A failed capture
    /// resumes it all the same.
    StayPaused,
}

/// What to checkpoint a VM as.
#[derive(Debug, Clone, Default)]
pub struct CheckpointSpec {
    /// A unique name to find it by, besides its id.
    pub name: Option<String>,
    /// Remove it once no VM maps it (a fork's checkpoint).
    pub ephemeral: bool,
    /// How RAM is captured.
    pub method: CaptureMethod,
    /// Keep only the RAM pages that differ from the VM's newest kept checkpoint
    /// (see `diff`), when it has one whose chain is short enough; else a full image.
    /// Ignored for an ephemeral checkpoint and a capture that leaves the VM stopped
    /// (forks and hibernations restore at once, and want a full image to map).
    pub incremental: bool,
}

/// How a checkpoint captures the guest's RAM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CaptureMethod {
    /// [`CaptureMethod::Live`] once the guest uses 128 MiB of RAM or more (its RAM
    /// file's allocated bytes), [`CaptureMethod::Paused`] below, and paused where the
    /// host cannot write-protect the RAM file. A capture that leaves the VM stopped
    /// (hibernation) is always paused.
    #[default]
    Auto,
    /// Stop the VM, save its device state and copy its RAM file: the shortest call
    /// and the source keeps its holes, but the pause grows with the RAM in use
    /// (~0.5 ms per MiB under TCG).
    Paused,
    /// Write-protect RAM and copy it while the guest runs (QEMU's
    /// `background-snapshot` into a capture QEMU, see `live`): the pause is the
    /// device state and the protection, whatever the RAM in use; the call takes
    /// longer, and the source's RAM file is then allocated whole.
    Live,
}

/// A checkpoint just taken.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its folder.
    pub path: PathBuf,
    /// How long the VM was paused.
    pub pause: Duration,
    /// The whole call.
    pub total: Duration,
}

impl Launcher {
    /// The checkpoint store (`LauncherConfig::checkpoint_root`).
    pub fn checkpoint_store(&self) -> Store {
        Store::new(
            self.config.checkpoint_root.clone(),
            self.config.run_root.clone(),
        )
    }

    /// Checkpoints the running VM `id` (any process may: it goes through the VM's
    /// QMP socket). The VM is paused briefly and goes on.
    pub async fn checkpoint(
        &self,
        id: &VmId,
        spec: CheckpointSpec,
    ) -> Result<Checkpoint, SnapshotError> {
        let store = self.checkpoint_store();
        if let Some(name) = &spec.name {
            check_name(name)?;
            if store.name_taken(name)? {
                return Err(SnapshotError::NameTaken(name.clone()));
            }
        }
        let ckpt_id = VmId::generate().to_string();
        let folder = store.root().join(&ckpt_id);
        self.capture(id, &folder, None, &ckpt_id, &spec, AfterCapture::Continue)
            .await
    }

    /// Captures VM `id` into `folder` (written as a `.tmp-` sibling, then renamed):
    /// then the VM goes on, or stays paused for the caller to end it (hibernation).
    ///
    /// `backing_folder`: where the checkpoint will finally live when the caller moves
    /// `folder` afterwards (a promoted template's staging folder): the VM's new disk
    /// overlay is based on the disk there.
    pub(crate) async fn capture(
        &self,
        id: &VmId,
        folder: &Path,
        backing_folder: Option<&Path>,
        ckpt_id: &str,
        spec: &CheckpointSpec,
        after: AfterCapture,
    ) -> Result<Checkpoint, SnapshotError> {
        let started = Instant::now();
        let run = self.config.run_root.join(id.as_str());
        let record =
            run_dir::read_record(&run).ok_or_else(|| SnapshotError::NoVm { id: id.to_string() })?;
        let not_capable = |why: &str| SnapshotError::NotCapable {
            id: id.to_string(),
            why: why.to_owned(),
        };
        if record.transport != AgentTransport::Serial {
            return Err(not_capable(
                "it uses the vsock transport (vhost-user-vsock cannot be migrated); start it with the serial transport",
            ));
        }
        // Held to the end: one capture of a VM at a time.
        let _capturing = lock_captures(&run)
            .map_err(|error| write_error(&run.join(CAPTURE_LOCK), error))?
            .ok_or_else(|| SnapshotError::Busy { id: id.to_string() })?;
        let machine: MachineSpec = fs::read(run.join(MACHINE_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| not_capable("its run folder has no machine.json"))?;
        let token = run_dir::read_token(&run).ok_or_else(|| not_capable("it has no token"))?;
        let mut qmp = Qmp::connect(&run.join(QMP_SOCKET), QMP_CONNECT_TIMEOUT)
            .await
            .map_err(|error| SnapshotError::NotRunning {
                id: id.to_string(),
                state: crate::error_chain(&error),
            })?;
        let state = qmp
            .query_status()
            .await
            .map_err(qemu("ask for the run state"))?;
        if state != RunState::Running {
            return Err(SnapshotError::NotRunning {
                id: id.to_string(),
                state: state.as_str().to_owned(),
            });
        }
        // A shared RAM file (the run folder links it) stays out of the stream.
        let shared_ram = fs::read_link(run.join(RAM_LINK))
            .ok()
            .filter(|p| p.is_file());
        let mut method = match (spec.method, after) {
            (_, AfterCapture::StayPaused) => CaptureMethod::Paused,
            (CaptureMethod::Auto, _) => auto_method(shared_ram.as_deref()),
            (method, _) => method,
        };
        if method == CaptureMethod::Live {
            let Some(ram) = shared_ram.as_deref() else {
                return Err(not_capable(
                    "its RAM is not a file of its own (a restored child maps its checkpoint's): capture it paused",
                ));
            };
            match live::prepare(&mut qmp, ram).await {
                Ok(()) => {}
                Err(error) if spec.method == CaptureMethod::Auto => {
                    tracing::info!(vm = %id, error = %crate::error_chain(&error), "no live capture here: the checkpoint is paused");
                    method = CaptureMethod::Paused;
                }
                Err(error) => {
                    live::reset_capabilities(&mut qmp).await;
                    return Err(error);
                }
            }
        }

        let root = folder.parent().unwrap_or(folder).to_owned();
        // The temporary folder doubles as a lock: a second writer of the same
        // checkpoint (two first boots racing for a template's ready snapshot) fails
        // here, and one that comes after the first has finished finds the folder.
        let temp = TempFolder::create(&root.join(format!(".tmp-{ckpt_id}")))?;
        if folder.exists() {
            return Err(write_error(
                folder,
                io::Error::new(io::ErrorKind::AlreadyExists, "the checkpoint exists"),
            ));
        }
        // Everything that can fail without the VM goes first, so a failure never
        // leaves it paused.
        link_or_copy(&machine.kernel, &temp.path().join(KERNEL_FILE))?;
        if let Some(initramfs) = &machine.initramfs {
            link_or_copy(initramfs, &temp.path().join(INITRAMFS_FILE))?;
        }
        write_private(&temp.path().join(TOKEN_FILE), token.as_bytes())?;
        // Its network goes with it: forks and restores get the same policy.
        if let Ok(policy) = fs::read(run.join(crate::egress::POLICY_FILE)) {
            write_private(&temp.path().join(crate::egress::POLICY_FILE), &policy)?;
        }
        let disk = match machine.disk {
            true => Some(
                self.prepare_disk_switch(&run, backing_folder.unwrap_or(folder))
                    .await?,
            ),
            false => None,
        };

        // The base of an incremental image, its folders locked against a delete
        // until this checkpoint is committed (and names it).
        let base = match (&shared_ram, spec.incremental && !spec.ephemeral, after) {
            (Some(ram), true, AfterCapture::Continue) => self.choose_ram_base(id, ram).await,
            _ => None,
        };
        let mut sink = None;
        if method == CaptureMethod::Live {
            match self
                .start_sink(&machine, &run, ckpt_id, disk.as_ref())
                .await
            {
                Ok(started) => sink = Some(started),
                Err(error) if spec.method == CaptureMethod::Auto => {
                    tracing::warn!(vm = %id, error = %crate::error_chain(&error), "no capture QEMU: the checkpoint is paused");
                }
                Err(error) => {
                    live::reset_capabilities(&mut qmp).await;
                    return Err(error);
                }
            }
        }
        let live = sink.is_some();
        if !live {
            qmp.set_migration_capabilities(&[
                ("x-ignore-shared", shared_ram.is_some()),
                ("pause-before-switchover", false),
                ("background-snapshot", false),
            ])
            .await
            .map_err(qemu("set the migration capabilities"))?;
            qmp.set_max_bandwidth(MAX_BANDWIDTH)
                .await
                .map_err(qemu("raise the migration bandwidth"))?;
        }

        let (pause_started, captured, sink) = if let Some(mut sink) = sink {
            // QEMU stops the guest itself, after it has read every page (which maps
            // them) and resumes it once RAM is protected. A disk must switch in the
            // same stop, so a VM with one is stopped first: then that reading is in
            // the pause (~70 ms for 200 MiB of pages QEMU never mapped, the first time).
            let pause_started = Instant::now();
            if disk.is_some() {
                if let Err(error) = qmp.stop().await {
                    let _ = qmp.cont().await;
                    return Err(qemu("pause the VM")(error));
                }
            }
            let captured = capture_live(&mut qmp, &mut sink, temp.path(), disk.as_ref())
                .await
                .map(|backing| (0, backing));
            (pause_started, captured, Some(sink))
        } else {
            // The pause: nothing in here may return early without `cont`, unless the
            // VM is to stay stopped.
            let pause_started = Instant::now();
            if let Err(error) = qmp.stop().await {
                // It may have stopped all the same (a slow answer): resume it.
                let _ = qmp.cont().await;
                return Err(qemu("pause the VM")(error));
            }
            let captured = capture_paused(
                &mut qmp,
                temp.path(),
                disk.as_ref(),
                shared_ram.as_deref(),
                base.as_ref().map(|(_, chain)| chain),
            )
            .await;
            (pause_started, captured, None)
        };
        if captured.is_err() {
            // A migration still running would leave the VM `postmigrate` (paused)
            // when it ends; and a disk already switched must find its backing again.
            let _ = qmp.execute("migrate_cancel", serde_json::Value::Null).await;
            if let Some(disk) = &disk {
                undo_disk_switch(&mut qmp, disk).await;
            }
        }
        let resumed = match (&captured, after) {
            (Ok(_), AfterCapture::StayPaused) => Ok(()),
            _ => qmp.cont().await.map_err(qemu("resume the VM")),
        };
        let pause = pause_of(&mut qmp, after)
            .await
            .unwrap_or_else(|| pause_started.elapsed());
        if live {
            live::reset_capabilities(&mut qmp).await;
        }
        let (stream_bytes, disk_backing) = captured?;
        resumed?;
        let parent = record.checkpoint.clone();
        let qemu_version = qmp.greeting().version.to_string();
        let qemu_args = qemu_args_of(record.qemu_pid);
        let ram = match (live, shared_ram, &base) {
            (_, Some(_), Some(_)) => RamImage::Diff,
            (true, _, _) | (false, Some(_), None) => RamImage::File,
            (false, None, _) => RamImage::InStream,
        };
        let ram_base = base.as_ref().map(|(id, _)| id.clone());
        let finished = async move {
            // A live capture's device state and RAM image come from the sink, now
            // that the guest runs again.
            let stream_bytes = match sink {
                Some(sink) => {
                    let (bytes, image) = sink.save(&temp.path().join(STATE_FILE)).await?;
                    // The image, on the tmpfs, goes into the checkpoint now that the
                    // sink's QEMU is gone: whole, or the pages that differ from the base.
                    let ram = temp.path().join(RAM_FILE);
                    match &base {
                        Some((_, chain)) => {
                            write_diff(image.path().to_owned(), Arc::clone(chain), ram, temp.path())
                                .await?
                        }
                        None => copy_sparse(image.path(), &ram).await?,
                    }
                    bytes
                }
                None => stream_bytes,
            };
            if ram == RamImage::Diff {
                let temp = temp.path().to_owned();
                tokio::task::spawn_blocking(move || {
                    diff::sync(&temp.join(RAM_FILE), &temp.join(PAGES_FILE))
                })
                .await
                .map_err(|error| write_error(&folder.join(RAM_FILE), io::Error::other(error)))??;
            }
            let manifest = Manifest {
                id: ckpt_id.to_owned(),
                name: spec.name.clone(),
                ephemeral: spec.ephemeral,
                created_at_unix_ms: run_dir::now_unix_ms(),
                source_vm: id.to_string(),
                parent,
                machine,
                ram,
                ram_base,
                disk_backing,
                qemu_version,
                qemu_args,
                pause_ms: u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                state_bytes: stream_bytes,
                ram_bytes: allocated_bytes(&temp.path().join(RAM_FILE)),
                disk_bytes: allocated_bytes(&temp.path().join(DISK_FILE)),
            };
            let text = serde_json::to_vec_pretty(&manifest)
                .map_err(|e| write_error(temp.path(), io::Error::other(e)))?;
            write_private(&temp.path().join(MANIFEST_FILE), &text)?;
            temp.commit(folder)?;
            // The base stays locked until this checkpoint names it.
            drop(base);
            Ok::<_, SnapshotError>(manifest)
        }
        .await;
        let manifest = match finished {
            Ok(manifest) => manifest,
            Err(error) => {
                // The checkpoint will not exist: the VM's new overlay must not name
                // its disk, and a VM that was to stay stopped goes on after all.
                if let Some(disk) = &disk {
                    undo_disk_switch(&mut qmp, disk).await;
                }
                if after == AfterCapture::StayPaused {
                    let _ = qmp.cont().await;
                }
                return Err(error);
            }
        };
        tracing::info!(vm = %id, checkpoint = %ckpt_id, pause_ms = pause.as_millis(), "checkpoint captured");
        if disk.is_some() {
            // The VM's disk is now an overlay on the checkpoint's: the checkpoint is
            // in use while the VM lives.
            let mut record = record;
            record.checkpoint = Some(ckpt_id.to_owned());
            if let Err(error) = run_dir::write_record_file(&run, &record) {
                tracing::warn!(vm = %id, %error, "cannot record the VM's use of its checkpoint");
            }
        }
        // The source lost the pause from its wall clock: set it again (best effort:
        // the checkpoint is good either way; a guest that does not answer is given up).
        if after == AfterCapture::Continue {
            let fixed = tokio::time::timeout(
                CLOCK_FIX_TIMEOUT,
                super::restore::fix_clock(&run.join(AGENT_SOCKET), &token),
            )
            .await;
            if !matches!(fixed, Ok(Ok(()))) {
                tracing::warn!(vm = %id, "could not correct the source's clock after the checkpoint");
            }
        }
        Ok(Checkpoint {
            manifest,
            path: folder.to_owned(),
            pause,
            total: started.elapsed(),
        })
    }

    /// The base an incremental capture of VM `id` (its RAM file `ram`) compares
    /// against (see [`diff::choose_base`]), or `None` for a full image.
    async fn choose_ram_base(&self, id: &VmId, ram: &Path) -> Option<(String, Arc<Chain>)> {
        let store = self.checkpoint_store();
        let root = store.root().to_owned();
        let ram_len = fs::metadata(ram).ok()?.len();
        let source_vm = id.to_string();
        tokio::task::spawn_blocking(move || {
            let manifests = store.manifests().ok()?;
            diff::choose_base(&root, &manifests, &source_vm, ram_len)
                .map(|(id, chain)| (id, Arc::new(chain)))
        })
        .await
        .ok()
        .flatten()
    }

    /// Starts the capture QEMU of a live capture of checkpoint `ckpt_id`, its RAM a
    /// new file on the RAM tmpfs (written there at memory speed, then copied or
    /// compared into the checkpoint once the guest runs again).
    async fn start_sink(
        &self,
        machine: &MachineSpec,
        run: &Path,
        ckpt_id: &str,
        disk: Option<&DiskSwitch>,
    ) -> Result<live::Sink, SnapshotError> {
        let image = live::SinkImage::create(
            self.config
                .ram_dir
                .join(format!("sandbox-capture-{ckpt_id}.ram")),
        )?;
        live::Sink::start(
            &self.config.qemu_path,
            &self.config.qemu_img_path,
            machine,
            run,
            image,
            disk.map(|d| d.size),
        )
        .await
    }

    /// Before the pause: the overlay the disk will switch to, created with its final
    /// backing path (the checkpoint folder's `disk.qcow2`, not there yet: QEMU opens
    /// it with `mode: existing` and links the current image underneath in memory).
    async fn prepare_disk_switch(
        &self,
        run: &Path,
        folder: &Path,
    ) -> Result<DiskSwitch, SnapshotError> {
        let current = read_disk_top(run).ok_or_else(|| SnapshotError::Damaged {
            id: run.display().to_string(),
            why: format!("its run folder does not say which image {DISK_DEVICE} writes to"),
        })?;
        let (size, backing) = image_info(&self.config.qemu_img_path, &current).await?;
        let next = run.join(format!(
            "{}-{}.qcow2",
            DISK_OVERLAY.trim_end_matches(".qcow2"),
            folder
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        let final_disk = folder.join(DISK_FILE);
        let mut command = std::process::Command::new(&self.config.qemu_img_path);
        command
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b"])
            .arg(&final_disk)
            .arg(&next)
            .arg(size.to_string());
        let output = output_of(command)
            .await
            .map_err(|error| write_error(&next, error))?;
        if !output.status.success() {
            return Err(write_error(
                &next,
                io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
            ));
        }
        Ok(DiskSwitch {
            current,
            next,
            backing,
            size,
        })
    }
}

/// The file in a VM's run folder whose `flock` a capture holds.
const CAPTURE_LOCK: &str = "capture.lock";

/// Takes the VM's capture lock, or `None` while another capture (in any process)
/// holds it.
fn lock_captures(run: &Path) -> io::Result<Option<fs::File>> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(run.join(CAPTURE_LOCK))?;
    Ok(crate::launcher::sys::try_lock_exclusive(&file)?.then_some(file))
}

/// What `auto` captures a VM as (see [`CaptureMethod::Auto`]).
fn auto_method(shared_ram: Option<&Path>) -> CaptureMethod {
    match shared_ram {
        Some(ram) if allocated_bytes(ram) >= AUTO_LIVE_BYTES => CaptureMethod::Live,
        _ => CaptureMethod::Paused,
    }
}

/// How long the guest was stopped, from QEMU's own `STOP` and `RESUME` events: the
/// same measure for both methods (a live capture's stop happens inside QEMU's
/// background snapshot). `None` for a VM that stays stopped, or without timestamps.
async fn pause_of(qmp: &mut Qmp, after: AfterCapture) -> Option<Duration> {
    if after == AfterCapture::StayPaused {
        return None;
    }
    let resume = qmp
        .wait_event("RESUME", Duration::from_secs(1))
        .await
        .ok()?
        .timestamp?;
    let stop = qmp
        .take_events()
        .into_iter()
        .rev()
        .find(|event| event.name == "STOP")?
        .timestamp?;
    let micros = |t: crate::launcher::qmp::EventTimestamp| {
        (t.seconds >= 0 && t.microseconds >= 0).then(|| t.seconds * 1_000_000 + t.microseconds)
    };
    let stopped_for = micros(resume)?.checked_sub(micros(stop)?)?;
    Some(Duration::from_micros(u64::try_from(stopped_for).ok()?))
}

/// The disk's images around a checkpoint.
#[derive(Debug)]
struct DiskSwitch {
    /// The image the VM writes now: frozen by the checkpoint, it becomes its disk.
    current: PathBuf,
    /// The overlay the VM writes afterwards.
    next: PathBuf,
    /// `current`'s backing file.
    backing: Option<PathBuf>,
    /// The disk's virtual size.
    size: u64,
}

/// The paused part: disk switch, device state, RAM copy (or the pages that differ
/// from `base`). Returns the stream's size and the frozen disk's backing.
async fn capture_paused(
    qmp: &mut Qmp,
    temp: &Path,
    disk: Option<&DiskSwitch>,
    shared_ram: Option<&Path>,
    base: Option<&Arc<Chain>>,
) -> Result<(u64, Option<PathBuf>), SnapshotError> {
    let backing = switch_disk(qmp, temp, disk).await?;
    let state = temp.join(STATE_FILE);
    let file = fs::File::create(&state).map_err(|error| write_error(&state, error))?;
    qmp.migrate_to_file(&file)
        .await
        .map_err(qemu("start saving the device state"))?;
    drop(file);
    let stats = qmp
        .wait_migration(MIGRATION_TIMEOUT)
        .await
        .map_err(qemu("save the device state"))?;
    if stats.status != MigrationStatus::Completed {
        return Err(write_error(
            &state,
            io::Error::other(format!(
                "migration ended {:?}: {}",
                stats.status,
                stats.error_desc.unwrap_or_default()
            )),
        ));
    }
    match (shared_ram, base) {
        (Some(ram), Some(base)) => {
            write_diff(ram.to_owned(), Arc::clone(base), temp.join(RAM_FILE), temp).await?;
        }
        (Some(ram), None) => copy_sparse(ram, &temp.join(RAM_FILE)).await?,
        (None, _) => {}
    }
    let bytes = fs::metadata(&state).map(|m| m.len()).unwrap_or(0);
    Ok((bytes, backing))
}

/// A live capture: the disk switch (the VM stopped for it), then QEMU's
/// background snapshot into the sink (it stops the guest if it runs, saves the device
/// state, protects RAM and resumes the guest itself), until the sink has loaded all
/// of it. Returns the frozen disk's backing.
async fn capture_live(
    qmp: &mut Qmp,
    sink: &mut live::Sink,
    temp: &Path,
    disk: Option<&DiskSwitch>,
) -> Result<Option<PathBuf>, SnapshotError> {
    let backing = switch_disk(qmp, temp, disk).await?;
    live::begin(qmp, sink).await?;
    let stats = qmp
        .wait_migration(MIGRATION_TIMEOUT)
        .await
        .map_err(qemu("copy RAM while the guest runs"))?;
    if stats.status != MigrationStatus::Completed {
        return Err(SnapshotError::Qemu {
            step: "copy RAM while the guest runs",
            error: crate::launcher::qmp::QmpError::MigrationFailed {
                desc: stats.error_desc.unwrap_or_else(|| stats.status.to_string()),
            },
        });
    }
    sink.wait_loaded().await?;
    Ok(backing)
}

/// Writes the pages of `source` that differ from `base` to `ram_out`, and their
/// bitmap into `temp`, off the runtime's threads.
async fn write_diff(
    source: PathBuf,
    base: Arc<Chain>,
    ram_out: PathBuf,
    temp: &Path,
) -> Result<(), SnapshotError> {
    let pages = temp.join(PAGES_FILE);
    let stats = tokio::task::spawn_blocking(move || diff::write(&source, &base, &ram_out, &pages))
        .await
        .map_err(|error| write_error(temp, io::Error::other(error)))??;
    tracing::debug!(
        changed = stats.changed_pages,
        written = stats.written_pages,
        "incremental RAM image"
    );
    Ok(())
}

/// Moves a stopped VM's disk to its new overlay and links the frozen image into the
/// checkpoint. Returns the frozen image's backing.
async fn switch_disk(
    qmp: &mut Qmp,
    temp: &Path,
    disk: Option<&DiskSwitch>,
) -> Result<Option<PathBuf>, SnapshotError> {
    let mut backing = None;
    if let Some(disk) = disk {
        let arguments = json!({
            "device": DISK_DEVICE,
            "snapshot-file": disk.next.to_string_lossy(),
            "format": "qcow2",
            "mode": "existing",
        });
        qmp.execute("blockdev-snapshot-sync", arguments)
            .await
            .map_err(qemu("switch the disk to a new overlay"))?;
        // From here on the VM writes to the new overlay, whatever happens next.
        if let Some(run) = disk.next.parent() {
            write_disk_top(run, &disk.next)
                .map_err(|e| write_error(&disk.next, io::Error::other(e)))?;
        }
        link_or_copy(&disk.current, &temp.join(DISK_FILE))?;
        backing.clone_from(&disk.backing);
    }
    Ok(backing)
}

/// After a failed capture that had switched the disk already: the new overlay's
/// header names a checkpoint that will not exist, so point it at the image it is
/// really based on (QEMU keeps using the chain it has open either way).
async fn undo_disk_switch(qmp: &mut Qmp, disk: &DiskSwitch) {
    let (node, file) = top_image_of(qmp).await;
    if file != disk.next.to_string_lossy() {
        // The switch never happened (`blockdev-snapshot-sync` failed): the top is
        // still `current`, whose header must not be pointed at itself.
        return;
    }
    let arguments = json!({
        "device": DISK_DEVICE,
        "image-node-name": node,
        "backing-file": disk.current.to_string_lossy(),
    });
    if let Err(error) = qmp.execute("change-backing-file", arguments).await {
        tracing::warn!(%error, image = %disk.next.display(), "cannot repoint the disk overlay after a failed checkpoint");
    }
}

/// The node name and file of `disk0`'s active image (empty when QEMU does not say).
async fn top_image_of(qmp: &mut Qmp) -> (String, String) {
    let Ok(blocks) = qmp.execute("query-block", serde_json::Value::Null).await else {
        return (String::new(), String::new());
    };
    let inserted = blocks
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["device"] == DISK_DEVICE)
        .map(|b| &b["inserted"]);
    let field = |name: &str| {
        inserted
            .and_then(|i| i[name].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    (field("node-name"), field("file"))
}

/// `qemu-img info`: virtual size and backing file of an image in use (`-U`).
async fn image_info(
    qemu_img: &Path,
    image: &Path,
) -> Result<(u64, Option<PathBuf>), SnapshotError> {
    let mut command = std::process::Command::new(qemu_img);
    command.args(["info", "-U", "--output=json"]).arg(image);
    let output = output_of(command)
        .await
        .map_err(|error| write_error(image, error))?;
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|_| {
        write_error(
            image,
            io::Error::other(format!(
                "qemu-img info failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        )
    })?;
    let size = info["virtual-size"].as_u64().ok_or_else(|| {
        write_error(
            image,
            io::Error::other("qemu-img info gave no virtual size"),
        )
    })?;
    let backing = info["full-backing-filename"]
        .as_str()
        .or_else(|| info["backing-filename"].as_str())
        .map(PathBuf::from);
    Ok((size, backing))
}

/// Copies `from` to `to` keeping holes (a RAM image is mostly zeros).
async fn copy_sparse(from: &Path, to: &Path) -> Result<(), SnapshotError> {
    crate::launcher::start::copy_sparse(from, to)
        .await
        .map_err(|error| write_error(to, error))
}

/// Runs a short helper command (`qemu-img`, `cp`) to completion off the runtime.
async fn output_of(mut command: std::process::Command) -> io::Result<std::process::Output> {
    command.stdin(Stdio::null());
    tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(io::Error::other)?
}

/// A hard link when `from` and `to` share a filesystem, else a copy.
fn link_or_copy(from: &Path, to: &Path) -> Result<(), SnapshotError> {
    if fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    fs::copy(from, to)
        .map(drop)
        .map_err(|error| write_error(to, error))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|error| write_error(path, error))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|error| write_error(path, error))
}

/// Bytes a file occupies on disk (0 when absent).
pub(super) fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// The QEMU command line from `/proc`, for the manifest's record.
fn qemu_args_of(pid: Option<u32>) -> Vec<String> {
    pid.and_then(|pid| fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|bytes| {
            bytes
                .split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn write_error(path: &Path, error: io::Error) -> SnapshotError {
    SnapshotError::Write {
        path: path.to_owned(),
        error,
    }
}

fn qemu(step: &'static str) -> impl Fn(crate::launcher::qmp::QmpError) -> SnapshotError {
    move |error| SnapshotError::Qemu { step, error }
}

/// A checkpoint folder being written: removed on drop unless committed.
struct TempFolder {
    path: PathBuf,
    committed: bool,
}

impl TempFolder {
    fn create(path: &Path) -> Result<Self, SnapshotError> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|error| write_error(parent, error))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(path)
            .map_err(|error| write_error(path, error))?;
        let folder = Self {
            path: path.to_owned(),
            committed: false,
        };
        // First, so a sweep can tell a writer that died (SIGKILL) from one writing.
        super::manifest::write_maker(path)?;
        Ok(folder)
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the folder into place.
    fn commit(mut self, to: &Path) -> Result<(), SnapshotError> {
        fs::rename(&self.path, to).map_err(|error| write_error(to, error))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}
