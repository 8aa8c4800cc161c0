//! Starting a machine, the part a cold boot and a restore from a checkpoint share:
//! run folder, token, disk overlay, the transport's host side, QEMU, and the wait for
//! the agent. A boot gives QEMU a kernel to run; a restore gives it the same machine
//! with `-incoming defer` and feeds it a checkpoint's device state (see
//! `snapshot`).
//!
//! What was started is written to the run folder as [`MachineSpec`]
//! (`machine.json`): a checkpoint of this VM needs it to rebuild the exact device
//! arguments a restore must repeat.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::accel::{Accel, AccelDecision};
use super::boot::{fail, Launcher, Waited, EXIT_AFTER_RELAY};
use super::config::AgentTransport;
use super::process::Lifetime;
use super::qemu::{QemuSpec, SERIAL_PORT_NAME};
use super::qmp::Qmp;
use super::run_dir::{self, qemu_name, RunDir, VmId, VmRecord};
use super::size::Size;
use super::vm::Vm;
use super::{
    LaunchError, AGENT_PORT, AGENT_SOCKET, CONSOLE_LOG, DISK_OVERLAY, QMP_SOCKET, SERIAL_SOCKET,
    VHOST_SOCKET, VSOCK_SOCKET,
};

/// The run folder's record of what QEMU was started with.
pub const MACHINE_FILE: &str = "machine.json";

/// The run folder's note of the disk image the VM writes now (a checkpoint moves the
/// VM onto a new overlay, and QEMU then names the image by a `json:` pseudo-name).
pub const DISK_TOP_FILE: &str = "disk-top";

/// How long QEMU's monitor may take to come up after QEMU starts.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long loading a checkpoint's device state (and, for a stream checkpoint, its
/// RAM) may take.
const INCOMING_TIMEOUT: Duration = Duration::from_secs(120);

/// Everything that decides QEMU's device arguments: a restore must be started with
/// the same, or QEMU refuses the checkpoint's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSpec {
    /// The template it came from (by name, for listings).
    pub template: String,
    /// KVM or TCG: a checkpoint restores under the accelerator that made it.
    pub accel: Accel,
    /// vCPUs and memory.
    pub size: Size,
    /// How the agent is reached.
    pub transport: AgentTransport,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs, if any.
    pub initramfs: Option<PathBuf>,
    /// The whole kernel command line.
    pub cmdline: String,
    /// Whether a `disk0` virtio-blk device exists.
    pub disk: bool,
}

/// Where a restored machine's state comes from.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    /// The device state (and RAM, for [`IncomingRam::Stream`]).
    pub state: PathBuf,
    /// Where its RAM comes from.
    pub ram: IncomingRam,
}

/// Where a restored machine's RAM comes from.
#[derive(Debug, Clone)]
pub(crate) enum IncomingRam {
    /// This image, mapped copy-on-write (`share=off`): a branch's children share it.
    Map(PathBuf),
    /// A copy of this image in the VM's own shared RAM file (a woken VM: its image
    /// on disk goes, and it can be checkpointed cheaply again).
    CopyOf(PathBuf),
    /// The state stream holds RAM; it is loaded into the VM's own shared RAM file.
    Stream,
}

/// One machine to start.
#[derive(Debug, Clone)]
pub(crate) struct Start {
    pub machine: MachineSpec,
    pub accel: AccelDecision,
    /// The base image of the disk overlay (a template disk or a checkpoint's).
    pub disk_base: Option<PathBuf>,
    /// A kept overlay (see `BootSpec::persistent_disk`).
    pub persistent_disk: Option<PathBuf>,
    /// Egress under this policy (written to the run folder for the relay), or none.
    pub egress: Option<crate::egress::Policy>,
    /// `None`: boot. Some: restore.
    pub incoming: Option<Incoming>,
    /// The token of the agent in the machine (a restored agent still has its parent's
    /// until it is reidentified); `None`: a fresh one, also put on the kernel command
    /// line by the caller.
    pub token: String,
    /// The checkpoint whose files the machine maps, recorded so it is not deleted
    /// under the VM.
    pub checkpoint: Option<String>,
    /// The snapshot it is restored from, for the record.
    pub restored_from: Option<String>,
    /// Wake this hibernated VM: its own run folder, id and hibernation record (kept
    /// until the caller clears it after a successful wake).
    pub reuse: Option<(VmId, Option<String>)>,
    pub detached: bool,
    pub ready_timeout: Duration,
}

/// Where the agent of a VM whose run folder is `run` is reached over `transport`.
pub(crate) fn agent_url_in(run: &Path, transport: AgentTransport) -> String {
    match transport {
        AgentTransport::Vsock => {
            format!("hvsock://{}:{AGENT_PORT}", run.join(VSOCK_SOCKET).display())
        }
        AgentTransport::Serial => format!("unix://{}", run.join(AGENT_SOCKET).display()),
    }
}

impl Launcher {
    /// Starts `start` and waits for its agent: the boot sequence of the module docs
    /// of `launcher`, plus the incoming migration of a restore.
    pub(crate) async fn start_machine(&self, start: Start) -> Result<Vm, LaunchError> {
        self.start_machine_in(start, None).await
    }

    /// [`Launcher::start_machine`] in a run folder the caller adopted already (a
    /// wake, which takes the VM's lock before it looks at the record, so that two
    /// wakes of one VM never run at once).
    pub(crate) async fn start_machine_in(
        &self,
        start: Start,
        adopted: Option<RunDir>,
    ) -> Result<Vm, LaunchError> {
        let lifetime = if start.detached {
            Lifetime::Detached
        } else {
            Lifetime::Owned
        };
        let machine = &start.machine;
        let transport = machine.transport;
        let dir = match (adopted, &start.reuse) {
            (Some(dir), _) => dir,
            (None, Some((id, _))) => RunDir::adopt(&self.config.run_root, id)?,
            (None, None) => RunDir::create(&self.config.run_root)?,
        };
        let agent_url = agent_url_in(dir.path(), transport);
        let mut record = VmRecord {
            id: dir.id().clone(),
            owner_pid: std::process::id(),
            detached: start.detached,
            qemu_pid: None,
            daemon_pid: None,
            agent_url,
            template: machine.template.clone(),
            accel: machine.accel,
            size: machine.size,
            created_at_unix_ms: run_dir::now_unix_ms(),
            transport,
            checkpoint: start.checkpoint.clone(),
            restored_from: start.restored_from.clone(),
            hibernation: start.reuse.as_ref().and_then(|(_, h)| h.clone()),
            qemu_started_ticks: None,
        };
        dir.write_record(&record)?;
        dir.write_token(&start.token)?;
        dir.write_json(MACHINE_FILE, machine)?;

        let overlay = match (&start.disk_base, &start.persistent_disk) {
            (Some(_), Some(kept)) if kept.is_file() => Some(kept.clone()),
            (Some(disk), Some(kept)) => Some(self.create_overlay(disk, kept, &dir).await?),
            (Some(disk), None) => Some(
                self.create_overlay(disk, &fresh_overlay_path(&dir), &dir)
                    .await?,
            ),
            (None, _) => None,
        };
        if let Some(overlay) = &overlay {
            write_disk_top(dir.path(), overlay)?;
        }
        let policy_file = dir.file(crate::egress::POLICY_FILE);
        match &start.egress {
            Some(policy) => crate::egress::write_policy(&policy_file, policy)
                .map_err(|error| LaunchError::Egress(Box::new(error)))?,
            None => {
                let _ = std::fs::remove_file(&policy_file);
            }
        }
        let attach = self.attach_agent(transport, &dir, lifetime).await?;
        // Declared after `dir`, so dropped before it: a failed start removes the RAM
        // file it made while this process still holds the folder's lock. (An adopted
        // folder is kept on failure; the RAM file must not be, and removing it later,
        // by the link, could hit the next waker's file.)
        let mut ram_guard = RemoveOnDrop(attach.ram_file.clone());
        let name = qemu_name(dir.id());
        let console = dir.file(CONSOLE_LOG);
        let console_socket = dir.file(super::CONSOLE_SOCKET);
        let vhost_socket = dir.file(VHOST_SOCKET);
        let serial_socket = dir.file(SERIAL_SOCKET);
        let qmp_socket = dir.file(QMP_SOCKET);
        let ram_file = match start.incoming.as_ref().map(|i| &i.ram) {
            Some(IncomingRam::Map(image)) => {
                // RAM is the checkpoint's image, private: no shared RAM file, so the
                // one made for it goes, and the run folder must not claim one (a
                // checkpoint of this VM then puts its RAM into the stream).
                if let Some(unused) = &attach.ram_file {
                    let _ = std::fs::remove_file(unused);
                }
                let _ = std::fs::remove_file(dir.file(run_dir::RAM_LINK));
                Some((image.as_path(), false))
            }
            Some(IncomingRam::CopyOf(image)) => {
                let own = attach.ram_file.as_deref().ok_or(LaunchError::Restore {
                    detail: "no RAM file for the restored VM".into(),
                    logs: super::BootLogs::default(),
                })?;
                copy_sparse(image, own)
                    .await
                    .map_err(|error| LaunchError::Restore {
                        detail: format!("cannot copy the RAM image: {error}"),
                        logs: super::BootLogs::default(),
                    })?;
                Some((own, true))
            }
            Some(IncomingRam::Stream) | None => attach.ram_file.as_deref().map(|path| (path, true)),
        };
        let qemu_spec = QemuSpec {
            name: &name,
            accel: machine.accel,
            size: machine.size,
            kernel: &machine.kernel,
            initramfs: machine.initramfs.as_deref(),
            cmdline: &machine.cmdline,
            vhost_socket: (transport == AgentTransport::Vsock).then_some(vhost_socket.as_path()),
            serial_socket: (transport == AgentTransport::Serial).then_some(serial_socket.as_path()),
            ram_file,
            incoming: start.incoming.is_some(),
            qmp_socket: (transport == AgentTransport::Serial).then_some(qmp_socket.as_path()),
            disk: overlay.as_deref(),
            console_log: &console,
            console_socket: (transport == AgentTransport::Serial)
                .then_some(console_socket.as_path()),
        };
        let started = Instant::now();
        let mut qemu = self.spawn_qemu(&qemu_spec, &dir, lifetime).await?;
        // The RAM file is the VM's own when shared (a mapped checkpoint image is not).
        let own_ram = ram_file.and_then(|(path, shared)| shared.then_some(path));
        super::vm::watch_exit(&qemu, start.detached.then_some(&attach.daemon), own_ram);
        record.qemu_pid = Some(qemu.pid());
        record.qemu_started_ticks = run_dir::process_start_ticks(qemu.pid());
        record.daemon_pid = Some(attach.daemon.pid());
        dir.write_record(&record)?;
        tracing::info!(id = %record.id, template = %machine.template, size = %machine.size, accel = %machine.accel, %transport, restore = start.incoming.is_some(), qemu_pid = qemu.pid(), "starting");

        if let Some(incoming) = &start.incoming {
            let loaded = tokio::select! {
                loaded = load_incoming(&qmp_socket, incoming) => loaded,
                status = qemu.wait() => Err(format!("QEMU exited ({}) while loading the checkpoint", status.map_or_else(|e| e.to_string(), |s| s.to_string()))),
            };
            if let Err(detail) = loaded {
                return Err(fail(&mut qemu, &dir, |logs| LaunchError::Restore {
                    detail,
                    logs,
                }));
            }
        }

        let daemon = attach.daemon;
        let waited = tokio::select! {
            ready = attach.ready.receive() => Waited::Ready(ready),
            status = qemu.wait() => Waited::Exited(status),
            () = tokio::time::sleep(start.ready_timeout) => Waited::TimedOut,
        };
        let boot_duration = started.elapsed();
        let ready = match waited {
            Waited::Ready(Ok(ready)) => ready,
            Waited::Ready(Err(make)) => {
                // A relay ends when QEMU closes its chardev, often a moment before
                // QEMU's exit is seen: report the exit, the real cause, if it comes.
                if let Ok(Ok(status)) = tokio::time::timeout(EXIT_AFTER_RELAY, qemu.wait()).await {
                    return Err(fail(&mut qemu, &dir, |logs| LaunchError::QemuExited {
                        status,
                        logs,
                    }));
                }
                return Err(fail(&mut qemu, &dir, make));
            }
            Waited::Exited(Ok(status)) => {
                return Err(fail(&mut qemu, &dir, |logs| LaunchError::QemuExited {
                    status,
                    logs,
                }))
            }
            Waited::Exited(Err(error)) => {
                return Err(fail(&mut qemu, &dir, |_| LaunchError::Wait {
                    what: "QEMU",
                    error,
                }))
            }
            Waited::TimedOut => {
                return Err(fail(&mut qemu, &dir, |logs| LaunchError::ReadyTimeout {
                    timeout: start.ready_timeout,
                    logs,
                }))
            }
        };
        tracing::info!(
            id = %record.id,
            ready_ms = u64::try_from(boot_duration.as_millis()).unwrap_or(u64::MAX),
            agent_version = %ready.agent_version,
            guest_uptime_ms = ready.uptime_ms,
            "vm ready"
        );
        let run_path = dir.path().to_owned();
        ram_guard.0 = None;
        Ok(Vm {
            record,
            ready,
            boot_duration,
            accel: start.accel,
            token: start.token,
            qemu: Some(qemu),
            daemon: Some(daemon),
            run_dir: Some(dir),
            run_path,
            adopted: None,
        })
    }
}

/// A file removed when dropped, unless its path was taken back first.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Records the image a VM's disk writes to now (see [`DISK_TOP_FILE`]).
pub(crate) fn write_disk_top(run: &Path, image: &Path) -> Result<(), run_dir::RunDirError> {
    let path = run.join(DISK_TOP_FILE);
    std::fs::write(&path, image.as_os_str().as_encoded_bytes())
        .map_err(|error| run_dir::RunDirError::WriteRecord { path, error })
}

/// The image a VM's disk writes to now, if recorded.
pub(crate) fn read_disk_top(run: &Path) -> Option<PathBuf> {
    let bytes = std::fs::read(run.join(DISK_TOP_FILE)).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// Feeds a restoring QEMU its checkpoint and lets it run.
async fn load_incoming(qmp_socket: &Path, incoming: &Incoming) -> Result<(), String> {
    let text = |error: super::qmp::QmpError| crate::error_chain(&error);
    let mut qmp = Qmp::connect(qmp_socket, QMP_CONNECT_TIMEOUT)
        .await
        .map_err(text)?;
    // RAM in a file stays out of the stream, as it did when the checkpoint was
    // written; RAM in the stream is loaded into fresh shared RAM.
    let ignore_shared = !matches!(incoming.ram, IncomingRam::Stream);
    qmp.set_migration_capabilities(&[("x-ignore-shared", ignore_shared)])
        .await
        .map_err(text)?;
    let state = std::fs::File::open(&incoming.state)
        .map_err(|error| format!("cannot open {}: {error}", incoming.state.display()))?;
    qmp.migrate_incoming_from_file(&state).await.map_err(text)?;
    // QEMU holds its own descriptor of the file now.
    drop(state);
    let state = qmp.wait_incoming(INCOMING_TIMEOUT).await.map_err(text)?;
    if state != super::qmp::RunState::Running {
        // The source was stopped for the checkpoint, so the copy arrives paused.
        qmp.cont().await.map_err(text)?;
    }
    Ok(())
}

/// The disk overlay of a new start: `overlay.qcow2`, or a fresh name when the folder
/// has one already (a woken VM: that image is part of its disk's chain).
fn fresh_overlay_path(dir: &RunDir) -> PathBuf {
    let first = dir.file(DISK_OVERLAY);
    if !first.exists() {
        return first;
    }
    let stem = DISK_OVERLAY.trim_end_matches(".qcow2");
    dir.file(&format!("{stem}-{}.qcow2", VmId::generate()))
}

/// Copies `from` to `to` keeping holes (a RAM image is mostly zeros).
pub(crate) async fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut command = std::process::Command::new("cp");
    command
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .stdin(std::process::Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(std::io::Error::other)??;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ))
    }
}

/// The kernel parameters the launcher adds for a transport and token.
pub(crate) fn transport_params(transport: AgentTransport, token: &str) -> String {
    match transport {
        AgentTransport::Serial => {
            format!("sandbox.token={token} sandbox.serial={SERIAL_PORT_NAME}")
        }
        AgentTransport::Vsock => format!("sandbox.token={token}"),
    }
}
