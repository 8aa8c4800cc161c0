//! [`Launcher`]: the boot sequence, and stop, list and sweep for VMs started by any
//! process. The steps are listed in the module docs of `launcher`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::accel::{self, AccelDecision, AccelProbe};
use super::config::{AgentTransport, LauncherConfig};
use super::process::{ChildProcess, Lifetime};
use super::qemu::{host_tsc_khz, kernel_cmdline, qemu_args, QemuSpec};
use super::ready::ReadyListener;
use super::relay_daemon::{self, ReadyLine, RelayPaths};
use super::run_dir::{self, qemu_name, RunDir, RunDirEntry, VmId};
use super::size::Size;
use super::start::{transport_params, MachineSpec, Start};
use super::sys::PidFd;
use super::template::{Template, TemplateRef};
use super::vm::{StopOutcome, Vm};
use super::vsock_daemon::{DaemonPaths, VsockDaemon};
use super::{
    BootLogs, LaunchError, AGENT_SOCKET, DEFAULT_READY_TIMEOUT_SECS, QEMU_IMG_LOG, QEMU_LOG,
    READY_PORT, RELAY_LOG, SERIAL_SOCKET, VHOST_LOG, VHOST_SOCKET, VSOCK_SOCKET,
};

/// How long a process stopped by [`Launcher::stop`] gets after `SIGKILL`.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How long a boot whose relay gave up waits for QEMU's exit, to report that instead.
pub(crate) const EXIT_AFTER_RELAY: Duration = Duration::from_secs(2);

/// How long `vhost-device-vsock` gets to exit on `SIGTERM` in [`Launcher::stop`].
const DAEMON_STOP_GRACE: Duration = Duration::from_millis(500);

/// What to boot.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// The template, by name or path.
    pub template: TemplateRef,
    /// vCPUs and memory; `None` takes the template's default, else `small`.
    pub size: Option<Size>,
    /// Appended to the template's kernel command line (after a `--`: to init).
    pub extra_cmdline: String,
    /// How long the agent may take to report ready, from QEMU's start.
    pub ready_timeout: Duration,
    /// Let the VM outlive this process (for `vm start`); see [`Vm::detach`]. Its
    /// processes get no death signal and a session of their own, so a caller killed
    /// during the boot leaves a running VM: `list` shows it and `stop` ends it. A
    /// front end should catch Ctrl-C and drop the boot future instead of dying.
    pub detached: bool,
    /// Where the template disk's copy-on-write overlay lives when it must outlive the
    /// VM: created there on first use, reused as it is by later boots (the guest's
    /// writes persist, as on a real disk), and never removed by the launcher. `None`:
    /// a fresh overlay in the run folder, gone with the VM. Ignored without a disk.
    pub persistent_disk: Option<PathBuf>,
    /// How the agent is reached; `None` takes the launcher's default
    /// ([`LauncherConfig::transport`]). Only serial VMs can be checkpointed.
    pub transport: Option<AgentTransport>,
    /// Boot the kernel even when the template has a ready snapshot to restore (see
    /// `snapshot::ready`). A promoted template always restores.
    pub cold: bool,
    /// No network (the default), or egress through the VM's relay (serial
    /// transport only). Forks and restores of its checkpoints inherit it.
    pub net: crate::egress::Net,
}

impl BootSpec {
    /// Boots `template` with its default size.
    pub fn new(template: impl Into<TemplateRef>) -> Self {
        Self {
            template: template.into(),
            size: None,
            extra_cmdline: String::new(),
            ready_timeout: Duration::from_secs(DEFAULT_READY_TIMEOUT_SECS),
            detached: false,
            persistent_disk: None,
            transport: None,
            cold: false,
            net: crate::egress::Net::None,
        }
    }
}

impl Default for BootSpec {
    fn default() -> Self {
        Self::new(TemplateRef::default())
    }
}

/// Boots templates into VMs. Cheap to create; share one per process so concurrent
/// first boots of a kernel run the KVM quick boot once.
#[derive(Debug)]
pub struct Launcher {
    pub(crate) config: LauncherConfig,
    tsc_khz: OnceLock<Option<u32>>,
    /// Serializes accelerator decisions (the quick boot, then the cache).
    accel_lock: tokio::sync::Mutex<()>,
    /// QEMU's version, asked once (restores check checkpoints against it).
    pub(crate) qemu_version: OnceLock<Option<String>>,
    /// Set once this launcher swept the checkpoint store (see [`Launcher::list`]).
    checkpoints_swept: OnceLock<()>,
}

impl Launcher {
    /// A launcher with this configuration. Touches nothing until used.
    pub fn new(config: LauncherConfig) -> Self {
        Self {
            config,
            tsc_khz: OnceLock::new(),
            accel_lock: tokio::sync::Mutex::new(()),
            qemu_version: OnceLock::new(),
            checkpoints_swept: OnceLock::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &LauncherConfig {
        &self.config
    }

    /// Loads a template by name (under `SANDBOX_HOME/templates`) or path.
    pub fn template(&self, template: &TemplateRef) -> Result<Template, LaunchError> {
        Template::load(&template.dir(&self.config.templates_root())).map_err(|error| {
            LaunchError::LoadTemplate {
                template: template.clone(),
                error,
            }
        })
    }

    /// The accelerator a boot of `kernel` would use, and why (runs the cached quick
    /// boot in `auto` mode).
    pub async fn accel_for(&self, kernel: &Path) -> Result<AccelDecision, LaunchError> {
        let _serial = self.accel_lock.lock().await;
        let cache_file = self.config.accel_cache_file();
        let probe = AccelProbe {
            mode: self.config.accel,
            kvm_device: &self.config.kvm_device,
            qemu: &self.config.qemu_path,
            run_root: &self.config.run_root,
            cache_file: &cache_file,
            tsc_khz: self.tsc_khz(),
            timeout: self.config.kvm_probe_timeout,
        };
        Ok(accel::decide(&probe, kernel).await?)
    }

    /// Boots a VM and waits for its agent's `Ready`.
    pub async fn boot(&self, spec: BootSpec) -> Result<Vm, LaunchError> {
        if let Err(error) = self.sweep() {
            tracing::warn!(%error, "sweep of stale run folders failed");
        }
        let template = self.template(&spec.template)?;
        let size = spec.size.unwrap_or(template.default_size);
        size.validate()?;
        let transport = spec.transport.unwrap_or(self.config.transport);
        if transport != AgentTransport::Serial && spec.net != crate::egress::Net::None {
            return Err(LaunchError::EgressNeedsSerial);
        }
        if let Some(snapshot) = &template.snapshot {
            if transport != AgentTransport::Serial {
                return Err(LaunchError::Snapshot(Box::new(
                    super::snapshot::SnapshotError::NotCapable {
                        id: template.name.clone(),
                        why: "a promoted template restores a serial-transport VM".into(),
                    },
                )));
            }
            // Before the accelerator is chosen: the snapshot restores under the one
            // that made it, so deciding would only run the KVM quick boot of a kernel
            // this VM never boots (5 s on a host whose KVM cannot boot it, for every
            // new promoted template).
            return self.restore_promoted(snapshot, &spec).await;
        }
        let accel = self.accel_for(&template.kernel).await?;
        let (restored, ready_key) = self
            .try_restore(&template, size, accel.accel, transport, &spec)
            .await?;
        if let Some(vm) = restored {
            return Ok(vm);
        }
        // Every VM's agent requires its own random token: whoever can open the VM's
        // socket still needs the token file, which only the owner can read.
        let token = run_dir::generate_token().map_err(LaunchError::Token)?;
        // Kernel parameters first: an init part (after `--`) in the extras stays last.
        let extra = format!(
            "{} {}",
            transport_params(transport, &token),
            spec.extra_cmdline
        );
        let cmdline = kernel_cmdline(&template.cmdline, &extra, self.tsc_khz());
        let machine = MachineSpec {
            template: template.name.clone(),
            accel: accel.accel,
            size,
            transport,
            kernel: template.kernel.clone(),
            initramfs: template.initramfs.clone(),
            cmdline,
            disk: template.disk.is_some(),
        };
        let vm = self
            .start_machine(Start {
                machine,
                accel,
                disk_base: template.disk.clone(),
                persistent_disk: spec.persistent_disk,
                egress: spec.net.policy().cloned(),
                incoming: None,
                token,
                checkpoint: None,
                restored_from: None,
                reuse: None,
                detached: spec.detached,
                ready_timeout: spec.ready_timeout,
            })
            .await?;
        if let Some(key) = ready_key {
            self.take_ready_snapshot(&vm, &template, &key).await;
        }
        Ok(vm)
    }

    /// Every run folder and whether its VM is alive. The first call of a launcher
    /// also sweeps the checkpoint store (see [`Launcher::sweep_checkpoints_once`]).
    pub fn list(&self) -> Result<Vec<RunDirEntry>, LaunchError> {
        self.sweep_checkpoints_once();
        Ok(run_dir::list(&self.config.run_root)?)
    }

    /// Once per launcher, at the first look at the home: removes staging folders and
    /// unused fork checkpoints that a process killed outright left (a front end
    /// that starts and only lists or reads would otherwise never sweep). Run folders
    /// are not swept here: a dead VM's folder holds the report of how it ended.
    pub(crate) fn sweep_checkpoints_once(&self) {
        self.checkpoints_swept.get_or_init(|| {
            self.checkpoint_store().sweep();
        });
    }

    /// Removes the folders of VMs whose owner and QEMU are gone; returns their names.
    /// Then fork checkpoints that no VM maps any more go too (see
    /// `snapshot::manifest::Store::sweep`).
    pub fn sweep(&self) -> Result<Vec<String>, LaunchError> {
        let removed = run_dir::sweep(&self.config.run_root)?;
        self.checkpoint_store().sweep();
        Ok(removed)
    }

    /// Stops a VM by id from any process (a detached VM, or one whose owner is
    /// stuck): `SIGTERM` to QEMU, up to `grace`, then `SIGKILL`; then its daemon and
    /// its run folder. QEMU is recognised by its arguments, so a recycled pid is safe.
    pub async fn stop(&self, id: &VmId, grace: Duration) -> Result<StopOutcome, LaunchError> {
        let path = self.config.run_root.join(id.as_str());
        let record =
            run_dir::read_record(&path).ok_or_else(|| LaunchError::NotFound { id: id.clone() })?;
        let outcome = match record.qemu_pid {
            Some(pid) => stop_foreign(pid, &qemu_name(id), grace).await,
            None => StopOutcome::NotRunning,
        };
        if let Some(pid) = record.daemon_pid {
            stop_foreign(pid, &path.to_string_lossy(), DAEMON_STOP_GRACE).await;
        }
        let removed = run_dir::remove_run_folder(&path);
        // The VM may have been the last user of a fork's checkpoint.
        self.checkpoint_store().sweep();
        match removed {
            Ok(()) => Ok(outcome),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(outcome),
            Err(error) => Err(LaunchError::RemoveRunDir {
                id: id.clone(),
                error,
            }),
        }
    }

    /// The last `limit` records of VM `id`'s egress log, oldest first (empty for a VM
    /// that never had egress).
    pub fn egress_log(
        &self,
        id: &VmId,
        limit: usize,
    ) -> Result<Vec<crate::egress::EgressRecord>, LaunchError> {
        let path = self.config.run_root.join(id.as_str());
        if run_dir::read_record(&path).is_none() {
            return Err(LaunchError::NotFound { id: id.clone() });
        }
        crate::egress::log::read_log(&path.join(crate::egress::LOG_FILE), limit).map_err(|error| {
            LaunchError::Egress(Box::new(crate::egress::PolicyFileError::Io {
                path: path.join(crate::egress::LOG_FILE),
                error,
            }))
        })
    }

    /// The transport's host side, started before QEMU: the vsock daemon and the
    /// readiness listener, or the relay (and where the guest RAM goes).
    pub(crate) async fn attach_agent(
        &self,
        transport: AgentTransport,
        dir: &RunDir,
        lifetime: Lifetime,
    ) -> Result<AgentAttach, LaunchError> {
        match transport {
            AgentTransport::Vsock => {
                let ready = ReadyListener::bind(&dir.file(&format!("{VSOCK_SOCKET}_{READY_PORT}")))
                    .map_err(LaunchError::ListenReady)?;
                let daemon_paths = DaemonPaths {
                    vhost_socket: dir.file(VHOST_SOCKET),
                    uds_path: dir.file(VSOCK_SOCKET),
                    log: dir.file(VHOST_LOG),
                };
                let daemon = VsockDaemon::start(&self.config.vhost_path, &daemon_paths, lifetime)
                    .await
                    .map_err(|error| daemon_failed(error, dir))?;
                Ok(AgentAttach {
                    daemon,
                    ready: ReadyWait::Vsock(ready),
                    ram_file: None,
                })
            }
            AgentTransport::Serial => {
                let ram_file = self.ram_file(dir)?;
                let paths = RelayPaths {
                    chardev: dir.file(SERIAL_SOCKET),
                    listen: dir.file(AGENT_SOCKET),
                    log: dir.file(RELAY_LOG),
                    egress_policy: dir.file(crate::egress::POLICY_FILE),
                    egress_log: dir.file(crate::egress::LOG_FILE),
                    console: (
                        dir.file(super::CONSOLE_SOCKET),
                        dir.file(super::CONSOLE_LOG),
                    ),
                };
                let (daemon, line) = relay_daemon::start(&self.config.relay_path, &paths, lifetime)
                    .await
                    .map_err(|error| daemon_failed(error, dir))?;
                Ok(AgentAttach {
                    daemon,
                    ready: ReadyWait::Serial(line),
                    ram_file: Some(ram_file),
                })
            }
        }
    }

    /// A fresh RAM file path on the RAM tmpfs, linked from the run folder so that
    /// whoever removes the folder frees the memory too. Its name is new for every
    /// start of the VM (a wake starts it again): whoever cleans up after one QEMU
    /// (its exit watcher, a failed start) can never remove the next one's memory.
    fn ram_file(&self, dir: &RunDir) -> Result<PathBuf, LaunchError> {
        let path =
            self.config
                .ram_dir
                .join(format!("sandbox-{}-{}.ram", dir.id(), VmId::generate()));
        let link = dir.file(run_dir::RAM_LINK);
        // A woken VM's folder has the link of its previous life.
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).map_err(|error| {
            LaunchError::RunDir(run_dir::RunDirError::WriteRecord { path: link, error })
        })?;
        // Made here, owner-only: QEMU would create it world-readable (it is the
        // guest's memory, token included) and would use one someone else made.
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|error| {
                LaunchError::RunDir(run_dir::RunDirError::WriteRecord {
                    path: path.clone(),
                    error,
                })
            })?;
        Ok(path)
    }

    fn tsc_khz(&self) -> Option<u32> {
        self.config
            .tsc_khz
            .or_else(|| *self.tsc_khz.get_or_init(host_tsc_khz))
    }

    pub(crate) async fn spawn_qemu(
        &self,
        spec: &QemuSpec<'_>,
        dir: &RunDir,
        lifetime: Lifetime,
    ) -> Result<ChildProcess, LaunchError> {
        let program = &self.config.qemu_path;
        let start_error = |error| LaunchError::StartQemu {
            program: program.clone(),
            error,
        };
        let log = std::fs::File::create(dir.file(QEMU_LOG)).map_err(start_error)?;
        let log_err = log.try_clone().map_err(start_error)?;
        let mut command = Command::new(program);
        command
            .args(qemu_args(spec))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        tracing::debug!(?command, "starting QEMU");
        ChildProcess::spawn("qemu", command, lifetime)
            .await
            .map_err(start_error)
    }

    /// `qemu-img create -f qcow2 -F <fmt> -b DISK RUN/overlay.qcow2`.
    /// Creates a qcow2 overlay at `overlay` backed by the template's `disk`.
    pub(crate) async fn create_overlay(
        &self,
        disk: &Path,
        overlay: &Path,
        dir: &RunDir,
    ) -> Result<PathBuf, LaunchError> {
        let overlay = overlay.to_owned();
        let log_path = dir.file(QEMU_IMG_LOG);
        let failed = |detail: String| LaunchError::CreateOverlay {
            disk: disk.to_owned(),
            detail,
        };
        let log = std::fs::File::create(&log_path).map_err(|e| failed(e.to_string()))?;
        let backing_format = match disk.extension().and_then(|e| e.to_str()) {
            Some("qcow2") => "qcow2",
            _ => "raw",
        };
        let mut command = Command::new(&self.config.qemu_img_path);
        command
            .args(["create", "-q", "-f", "qcow2", "-F", backing_format, "-b"])
            .arg(disk)
            .arg(&overlay)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = ChildProcess::spawn("qemu-img", command, Lifetime::Owned)
            .await
            .map_err(|e| {
                failed(format!(
                    "cannot start {}: {e}",
                    self.config.qemu_img_path.display()
                ))
            })?;
        let status = child.wait().await.map_err(|e| failed(e.to_string()))?;
        if !status.success() {
            let output = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(failed(format!("qemu-img {status}: {}", output.trim())));
        }
        Ok(overlay)
    }
}

/// Stops a VM process this handle does not own (`SIGTERM`, up to `grace`, `SIGKILL`),
/// identified by `needle` in its arguments, and reaps it if it is a child of this
/// process (a VM detached here and stopped here).
pub(crate) async fn stop_foreign(pid: u32, needle: &str, grace: Duration) -> StopOutcome {
    let outcome = signal_foreign(pid, needle, grace).await;
    // A child of this process (a VM detached here) cannot have had its pid reused, as
    // nobody reaped it: it is that VM's process, whatever its command line says now.
    // It may be exiting on its own (a detached VM's daemon, stopped by its exit
    // watcher as QEMU went, has no command line left mid-exit): wait for it and reap
    // it, so no zombie is left behind.
    if is_unreaped_child(pid) {
        if let Ok(fd) = PidFd::open(pid).and_then(PidFd::into_async) {
            if tokio::time::timeout(grace + KILL_WAIT, fd.readable())
                .await
                .is_err()
            {
                let _ = fd.get_ref().send_signal(Signal::SIGKILL);
                let _ = tokio::time::timeout(KILL_WAIT, fd.readable()).await;
            }
        }
        reap_if_child(pid);
    }
    outcome
}

/// True when `pid` is a child of this process not yet reaped (running or exited).
fn is_unreaped_child(pid: u32) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // WNOWAIT: look without reaping; ECHILD: not a child of ours.
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    waitid(Id::Pid(nix::unistd::Pid::from_raw(raw)), flags).is_ok()
}

async fn signal_foreign(pid: u32, needle: &str, grace: Duration) -> StopOutcome {
    let Ok(pidfd) = PidFd::open(pid) else {
        return StopOutcome::NotRunning;
    };
    if !run_dir::process_mentions(pid, needle) {
        return StopOutcome::NotRunning;
    }
    if pidfd.send_signal(Signal::SIGTERM).is_err() {
        return StopOutcome::NotRunning;
    }
    let Ok(fd) = pidfd.into_async() else {
        return StopOutcome::NotRunning;
    };
    if tokio::time::timeout(grace, fd.readable()).await.is_ok() {
        return StopOutcome::Terminated;
    }
    if let Err(error) = fd.get_ref().send_signal(Signal::SIGKILL) {
        tracing::warn!(pid, %error, "kill failed");
    }
    if tokio::time::timeout(KILL_WAIT, fd.readable())
        .await
        .is_err()
    {
        tracing::warn!(pid, "process survived SIGKILL for {KILL_WAIT:?}");
    }
    StopOutcome::Killed
}

/// Reaps `pid` if it is an exited child of this process. It can only be a VM
/// process released by `Vm::detach` (nobody else waits for those), and a zombie's
/// pid cannot be reused, so this never takes another waiter's status.
fn reap_if_child(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    let flags = nix::sys::wait::WaitPidFlag::WNOHANG;
    // ECHILD: not our child (the usual case: another process started it).
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(raw), Some(flags));
}

/// What ended the wait for `Ready`.
pub(crate) enum Waited {
    Ready(ReadyResult),
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
}

/// A VM's daemon did not start: the error, with the logs so far.
fn daemon_failed(error: super::vsock_daemon::DaemonError, dir: &RunDir) -> LaunchError {
    LaunchError::StartDaemon {
        error,
        logs: BootLogs::collect(dir.path()),
    }
}

/// The host side of the agent's transport, before QEMU starts.
pub(crate) struct AgentAttach {
    pub(crate) daemon: VsockDaemon,
    pub(crate) ready: ReadyWait,
    pub(crate) ram_file: Option<PathBuf>,
}

/// Where the agent's readiness arrives.
pub(crate) enum ReadyWait {
    /// A frame on the host's vsock readiness port.
    Vsock(ReadyListener),
    /// The relay's line once the agent attached to the link.
    Serial(ReadyLine),
}

pub(crate) type ReadyResult =
    Result<sandbox_protocol::Ready, Box<dyn FnOnce(BootLogs) -> LaunchError + Send>>;

impl ReadyWait {
    pub(crate) async fn receive(self) -> ReadyResult {
        match self {
            Self::Vsock(listener) => listener.receive().await.map_err(|error| {
                Box::new(move |logs| LaunchError::Ready { error, logs }) as Box<_>
            }),
            Self::Serial(line) => line.receive().await.map_err(|error| {
                Box::new(move |logs| LaunchError::RelayReady { error, logs }) as Box<_>
            }),
        }
    }
}

/// A failed boot: stops QEMU first so the console is complete, then quotes the logs.
/// The daemon and the run folder go when the caller returns.
pub(crate) fn fail(
    qemu: &mut ChildProcess,
    dir: &RunDir,
    make: impl FnOnce(BootLogs) -> LaunchError,
) -> LaunchError {
    qemu.kill_and_reap();
    make(BootLogs::collect(dir.path()))
}
