//! Live capture: a checkpoint whose pause does not grow with the memory the guest
//! has used.
//!
//! The paused capture ([`super::capture`]) stops the VM, saves its device state and
//! copies the RAM file while it is stopped: about 0.5 ms per MiB in use under TCG, so
//! a guest with 4 GiB in use would stop for two seconds. Here QEMU's own pre-copy
//! migration moves RAM while the guest runs, with QEMU's dirty tracking (TCG's dirty
//! bitmap, KVM's dirty log), into a *sink*: a second QEMU of the same machine started
//! with `-S -incoming`, whose RAM is a shared file in the checkpoint folder. The sink
//! never runs a vCPU. The source stops only for the last dirty pages, the disk switch
//! (`pause-before-switchover` holds the migration there while the disk moves to its
//! new overlay) and its device state. Once the stream has arrived, the sink's RAM
//! file *is* the checkpoint's RAM image, and the sink saves its device state with
//! `x-ignore-shared` exactly as a paused capture saves the source's: children and
//! wakes restore from it unchanged, mapping the image copy-on-write.
//!
//! Why not the alternatives (measured on this kind of host, QEMU 7.2 under TCG):
//! - `background-snapshot` (userfaultfd write protection) writes RAM into the
//!   migration stream, which children could only load by copying, not map.
//! - The host kernel's soft-dirty bits (track writes to the RAM file ourselves and
//!   copy it while the guest runs) are not built into every kernel
//!   (`CONFIG_MEM_SOFT_DIRTY`), and miss writes made by other processes.
//! - A reflink copy of the RAM file needs a filesystem with reflinks; tmpfs has none.
//!
//! What it costs: a second QEMU for the length of the call; a call several times
//! longer than a paused capture's (the sink must start, and every page crosses a
//! socket once); and QEMU's first pass reads every page of the source's RAM file,
//! which on a tmpfs allocates its holes, so the source then holds its whole RAM
//! size. Under TCG the check of `stale_pages` keeps the pause near a paused
//! capture's. So it is opt-in ([`super::capture::CaptureMethod::Live`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use std::process::Command;

use super::manifest::RAM_FILE;
use super::SnapshotError;
use crate::launcher::process::{ChildProcess, Lifetime};
use crate::launcher::qemu::{qemu_args, QemuSpec};
use crate::launcher::qmp::{MigrationStatus, Qmp, QmpError, RunState};
use crate::launcher::start::MachineSpec;

/// The sink's files, in the source's run folder (short names: a Unix socket's path
/// has at most 107 bytes, and the run folder's path is already long).
const SINK_QMP: &str = "live-qmp.sock";
const SINK_INCOMING: &str = "live-in.sock";
const SINK_PORT: &str = "live-port.sock";
const SINK_DISK: &str = "live-disk.qcow2";
const SINK_LOG: &str = "live-qemu.log";
const SINK_CONSOLE: &str = "live-console.log";

/// How long the sink's monitor may take to answer (a QEMU start under TCG).
const SINK_QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest stop the pre-copy aims for: QEMU stops the source once what is left
/// to send fits in it.
const DOWNTIME_TARGET: Duration = Duration::from_millis(20);

/// A guest that dirties memory faster than the stream moves it never fits the
/// target: QEMU's `auto-converge` throttles its vCPUs, and after this many passes
/// over RAM the target is lifted, so the next pass is the last.
const MAX_PASSES: u64 = 16;

/// The lifted target (QEMU's parameter is in milliseconds, at most 2000 s).
const DOWNTIME_LIFTED: Duration = Duration::from_secs(60);

/// How long the whole pre-copy may take.
const PRECOPY_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the source's migration is polled for the pre-switchover stop.
const POLL: Duration = Duration::from_millis(2);

/// How long the sink may take to exit after `quit`.
const SINK_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// No bandwidth cap: the stream stays on this host.
const MAX_BANDWIDTH: u64 = 64 << 30;

/// A QEMU waiting for a checkpoint's RAM, and its files.
pub(crate) struct Sink {
    qemu: ChildProcess,
    qmp: Qmp,
    incoming: PathBuf,
    /// The sink's files in the run folder, removed when the sink goes (its QEMU,
    /// owned, is killed by its own drop).
    _files: SinkFiles,
}

impl Sink {
    /// Starts the sink for the VM in `run` (its machine `machine`), its RAM a shared
    /// file at `ram_file`, and makes it listen for the stream. `disk_size`: the
    /// virtual size of the VM's disk, if it has one (the sink gets a blank image of
    /// that size: migration carries no disk contents, and the source's images are
    /// locked by the source).
    pub(crate) async fn start(
        qemu_path: &Path,
        qemu_img_path: &Path,
        machine: &MachineSpec,
        run: &Path,
        ram_file: &Path,
        disk_size: Option<u64>,
    ) -> Result<Self, SnapshotError> {
        let file = |name: &str| run.join(name);
        let mut scratch = vec![
            file(SINK_QMP),
            file(SINK_INCOMING),
            file(SINK_PORT),
            file(SINK_LOG),
            file(SINK_CONSOLE),
        ];
        for stale in &scratch {
            let _ = fs::remove_file(stale);
        }
        let disk = match disk_size {
            Some(size) => {
                let disk = file(SINK_DISK);
                let _ = fs::remove_file(&disk);
                blank_disk(qemu_img_path, &disk, size).await?;
                scratch.push(disk.clone());
                Some(disk)
            }
            None => None,
        };
        let qmp_socket = file(SINK_QMP);
        let port_socket = file(SINK_PORT);
        let console = file(SINK_CONSOLE);
        let spec = QemuSpec {
            name: "sandbox-capture",
            accel: machine.accel,
            size: machine.size,
            kernel: &machine.kernel,
            initramfs: machine.initramfs.as_deref(),
            cmdline: &machine.cmdline,
            vhost_socket: None,
            serial_socket: Some(&port_socket),
            ram_file: Some((ram_file, true)),
            incoming: true,
            qmp_socket: Some(&qmp_socket),
            disk: disk.as_deref(),
            console_log: &console,
            console_socket: None,
        };
        let log = fs::File::create(file(SINK_LOG)).map_err(|e| write_error(run, e))?;
        let log_err = log.try_clone().map_err(|e| write_error(run, e))?;
        let mut command = Command::new(qemu_path);
        // `-S`: the sink ends `paused` whatever the source was, and never runs.
        command
            .args(qemu_args(&spec))
            .arg("-S")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let qemu = ChildProcess::spawn("qemu", command, Lifetime::Owned)
            .await
            .map_err(|error| write_error(qemu_path, error))?;
        let files = SinkFiles(scratch);
        // A failed connect drops the QEMU (killed) and the files with it.
        let qmp = Qmp::connect(&qmp_socket, SINK_QMP_TIMEOUT)
            .await
            .map_err(qemu_error("start the capture QEMU"))?;
        let mut sink = Self {
            qemu,
            qmp,
            incoming: file(SINK_INCOMING),
            _files: files,
        };
        sink.listen().await?;
        Ok(sink)
    }

    async fn listen(&mut self) -> Result<(), SnapshotError> {
        self.qmp
            .set_migration_capabilities(&[("x-ignore-shared", false)])
            .await
            .map_err(qemu_error("set the capture QEMU's capabilities"))?;
        let uri = format!("unix:{}", self.incoming.display());
        self.qmp
            .migrate_incoming(&uri)
            .await
            .map_err(qemu_error("make the capture QEMU listen"))
    }

    /// Where the source sends its stream.
    pub(crate) fn uri(&self) -> String {
        format!("unix:{}", self.incoming.display())
    }

    /// Once the source's migration has completed: waits until the sink has loaded
    /// all of it (the sink then is `paused`, its RAM file the whole image).
    pub(crate) async fn wait_loaded(&mut self) -> Result<(), SnapshotError> {
        let loaded = self
            .qmp
            .wait_incoming(PRECOPY_TIMEOUT)
            .await
            .map_err(qemu_error("load the stream into the capture QEMU"))?;
        if matches!(loaded, RunState::Paused | RunState::Prelaunch) {
            Ok(())
        } else {
            Err(SnapshotError::Qemu {
                step: "load the stream into the capture QEMU",
                error: QmpError::MigrationFailed {
                    desc: format!("the capture QEMU ended the stream {loaded}, not paused"),
                },
            })
        }
    }

    /// Saves the loaded sink's device state (RAM stays in its file) to `state`, and
    /// ends the sink. Returns the state's size in bytes.
    pub(crate) async fn save(mut self, state: &Path) -> Result<u64, SnapshotError> {
        self.qmp
            .set_migration_capabilities(&[("x-ignore-shared", true)])
            .await
            .map_err(qemu_error("set the capture QEMU's capabilities"))?;
        self.qmp
            .set_max_bandwidth(MAX_BANDWIDTH)
            .await
            .map_err(qemu_error("raise the capture QEMU's bandwidth"))?;
        self.qmp
            .migrate(&format!(
                "exec:cat > {}",
                crate::launcher::start::shell_quote(state)
            ))
            .await
            .map_err(qemu_error("start saving the device state"))?;
        let stats = self
            .qmp
            .wait_migration(PRECOPY_TIMEOUT)
            .await
            .map_err(qemu_error("save the device state"))?;
        if stats.status != MigrationStatus::Completed {
            return Err(write_error(
                state,
                std::io::Error::other(format!("the save ended {}", stats.status)),
            ));
        }
        let Self {
            mut qemu,
            qmp,
            _files,
            ..
        } = self;
        let _ = qmp.quit().await;
        match tokio::time::timeout(SINK_EXIT_TIMEOUT, qemu.wait()).await {
            Ok(Ok(_)) => {}
            _ => qemu.kill_and_reap(),
        }
        Ok(fs::metadata(state).map(|m| m.len()).unwrap_or(0))
    }
}

/// Removes the sink's files once the sink is gone.
struct SinkFiles(Vec<PathBuf>);

impl Drop for SinkFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

/// Sets the source up for a pre-copy to the sink and starts it. The guest runs on.
pub(crate) async fn start_precopy(source: &mut Qmp, sink: &Sink) -> Result<(), SnapshotError> {
    source
        .set_migration_capabilities(&[
            ("x-ignore-shared", false),
            ("pause-before-switchover", true),
            ("auto-converge", true),
        ])
        .await
        .map_err(qemu_error("set the migration capabilities"))?;
    set_downtime(source, DOWNTIME_TARGET).await?;
    source
        .set_max_bandwidth(MAX_BANDWIDTH)
        .await
        .map_err(qemu_error("raise the migration bandwidth"))?;
    source
        .migrate(&sink.uri())
        .await
        .map_err(qemu_error("start the pre-copy"))
}

/// Waits until the pre-copy has stopped the source before its switchover: the guest
/// is paused from here until `cont`. Returns when that happened.
pub(crate) async fn await_switchover(source: &mut Qmp) -> Result<Instant, SnapshotError> {
    let started = Instant::now();
    let mut lifted = false;
    let mut polls = 0u32;
    loop {
        // One `query-migrate` a poll, read raw: the typed stats lack the pass count.
        let raw = source
            .execute("query-migrate", serde_json::Value::Null)
            .await
            .map_err(qemu_error("follow the pre-copy"))?;
        let status = MigrationStatus::from(raw["status"].as_str().unwrap_or("none").to_owned());
        let passes = raw["ram"]["dirty-sync-count"].as_u64().unwrap_or(0);
        polls += 1;
        if polls.is_multiple_of(64) {
            tracing::debug!(%status, passes, sent = raw["ram"]["transferred"].as_u64(), remaining = raw["ram"]["remaining"].as_u64(), mbps = raw["ram"]["mbps"].as_f64(), elapsed_ms = started.elapsed().as_millis(), "pre-copy");
        }
        match status {
            MigrationStatus::PreSwitchover => return Ok(Instant::now()),
            MigrationStatus::Failed | MigrationStatus::Cancelled => {
                let desc = raw["error-desc"]
                    .as_str()
                    .map_or_else(|| status.to_string(), str::to_owned);
                return Err(SnapshotError::Qemu {
                    step: "copy RAM while the guest runs",
                    error: QmpError::MigrationFailed { desc },
                });
            }
            _ => {}
        }
        let waited = started.elapsed();
        if !lifted && passes > MAX_PASSES {
            // The guest dirties faster than the stream drains: stop it at the next pass.
            set_downtime(source, DOWNTIME_LIFTED).await?;
            lifted = true;
        }
        if waited > PRECOPY_TIMEOUT {
            return Err(SnapshotError::Qemu {
                step: "copy RAM while the guest runs",
                error: QmpError::MigrationFailed {
                    desc: format!("not done after {PRECOPY_TIMEOUT:?}"),
                },
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Lets the held migration send the device state and end (the source is then
/// `postmigrate`, still paused).
pub(crate) async fn finish_switchover(source: &mut Qmp) -> Result<(), SnapshotError> {
    source
        .execute("migrate-continue", json!({ "state": "pre-switchover" }))
        .await
        .map_err(qemu_error("let the migration switch over"))?;
    let stats = source
        .wait_migration(PRECOPY_TIMEOUT)
        .await
        .map_err(qemu_error("send the device state"))?;
    if stats.status == MigrationStatus::Completed {
        Ok(())
    } else {
        Err(SnapshotError::Qemu {
            step: "send the device state",
            error: QmpError::MigrationFailed {
                desc: stats.status.to_string(),
            },
        })
    }
}

/// Puts the source's capabilities back for a later paused capture (whose migration
/// must not wait at a switchover nobody continues).
pub(crate) async fn reset_capabilities(source: &mut Qmp) {
    if let Err(error) = source
        .set_migration_capabilities(&[("pause-before-switchover", false)])
        .await
    {
        tracing::warn!(%error, "cannot reset the migration capabilities after a live capture");
    }
}

async fn set_downtime(source: &mut Qmp, limit: Duration) -> Result<(), SnapshotError> {
    let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    source
        .execute(
            "migrate-set-parameters",
            json!({ "downtime-limit": millis }),
        )
        .await
        .map(drop)
        .map_err(qemu_error("set the migration's downtime target"))
}

/// Brings the sink's image up to the stopped source's RAM file (see `stale_pages`).
pub(crate) async fn patch_stale_pages(
    source_ram: &Path,
    image: &Path,
) -> Result<(), SnapshotError> {
    let (source, target) = (source_ram.to_owned(), image.to_owned());
    let started = Instant::now();
    let patched = tokio::task::spawn_blocking(move || super::stale_pages::patch(&source, &target))
        .await
        .map_err(std::io::Error::other)
        .and_then(|patched| patched)
        .map_err(|error| write_error(image, error))?;
    tracing::debug!(
        compared_mib = patched.compared_bytes >> 20,
        stale_pages = patched.pages,
        ms = started.elapsed().as_millis(),
        "live capture: image checked against the stopped source"
    );
    Ok(())
}

/// The RAM file the sink fills: the checkpoint's image, in the folder being written.
pub(crate) fn sink_ram_file(temp: &Path) -> PathBuf {
    temp.join(RAM_FILE)
}

async fn blank_disk(qemu_img: &Path, disk: &Path, size: u64) -> Result<(), SnapshotError> {
    let mut command = Command::new(qemu_img);
    command
        .args(["create", "-q", "-f", "qcow2"])
        .arg(disk)
        .arg(size.to_string())
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(std::io::Error::other)
        .and_then(|output| output)
        .map_err(|error| write_error(disk, error))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(write_error(
            disk,
            std::io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        ))
    }
}

fn write_error(path: &Path, error: std::io::Error) -> SnapshotError {
    SnapshotError::Write {
        path: path.to_owned(),
        error,
    }
}

fn qemu_error(step: &'static str) -> impl Fn(QmpError) -> SnapshotError {
    move |error| SnapshotError::Qemu { step, error }
}
