//! [`Launcher`]: the boot sequence, and stop, list and sweep for VMs started by any
//! process. The steps are listed in the module docs of `launcher`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::accel::{self, AccelDecision, AccelProbe};
use super::config::{AgentTransport, LauncherConfig};
use super::process::{ChildProcess, Lifetime};
use super::qemu::{host_tsc_khz, kernel_cmdline, qemu_args, QemuSpec};
use super::ready::ReadyListener;
use super::relay_daemon::{self, ReadyLine, RelayPaths};
use super::run_dir::{self, qemu_name, RunDir, RunDirEntry, VmId, VmRecord};
use super::size::Size;
use super::sys::PidFd;
use super::template::{Template, TemplateRef};
use super::vm::{StopOutcome, Vm};
use super::vsock_daemon::{DaemonPaths, VsockDaemon};
use super::{
    BootLogs, LaunchError, AGENT_PORT, AGENT_SOCKET, CONSOLE_LOG, DEFAULT_READY_TIMEOUT_SECS,
    DISK_OVERLAY, QEMU_IMG_LOG, QEMU_LOG, READY_PORT, RELAY_LOG, SERIAL_SOCKET, VHOST_LOG,
    VHOST_SOCKET, VSOCK_SOCKET,
};

/// How long a process stopped by [`Launcher::stop`] gets after `SIGKILL`.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How long a boot whose relay gave up waits for QEMU's exit, to report that instead.
const EXIT_AFTER_RELAY: Duration = Duration::from_secs(2);

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
    config: LauncherConfig,
    tsc_khz: OnceLock<Option<u32>>,
    /// Serializes accelerator decisions (the quick boot, then the cache).
    accel_lock: tokio::sync::Mutex<()>,
}

impl Launcher {
    /// A launcher with this configuration. Touches nothing until used.
    pub fn new(config: LauncherConfig) -> Self {
        Self {
            config,
            tsc_khz: OnceLock::new(),
            accel_lock: tokio::sync::Mutex::new(()),
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
        let accel = self.accel_for(&template.kernel).await?;
        let lifetime = if spec.detached {
            Lifetime::Detached
        } else {
            Lifetime::Owned
        };

        let transport = spec.transport.unwrap_or(self.config.transport);
        let dir = RunDir::create(&self.config.run_root)?;
        let agent_url = match transport {
            AgentTransport::Vsock => {
                format!("hvsock://{}:{AGENT_PORT}", dir.file(VSOCK_SOCKET).display())
            }
            AgentTransport::Serial => format!("unix://{}", dir.file(AGENT_SOCKET).display()),
        };
        let mut record = VmRecord {
            id: dir.id().clone(),
            owner_pid: std::process::id(),
            detached: spec.detached,
            qemu_pid: None,
            daemon_pid: None,
            agent_url,
            template: template.name.clone(),
            accel: accel.accel,
            size,
            created_at_unix_ms: run_dir::now_unix_ms(),
            transport,
        };
        dir.write_record(&record)?;
        // Every VM's agent requires its own random token: whoever can open the VM's
        // socket still needs the token file, which only the owner can read.
        let token = run_dir::generate_token().map_err(|error| {
            LaunchError::RunDir(run_dir::RunDirError::WriteRecord {
                path: dir.file(run_dir::TOKEN_FILE),
                error,
            })
        })?;
        dir.write_token(&token)?;

        let overlay = match (&template.disk, &spec.persistent_disk) {
            (Some(_), Some(kept)) if kept.is_file() => Some(kept.clone()),
            (Some(disk), Some(kept)) => Some(self.create_overlay(disk, kept, &dir).await?),
            (Some(disk), None) => Some(
                self.create_overlay(disk, &dir.file(DISK_OVERLAY), &dir)
                    .await?,
            ),
            (None, _) => None,
        };
        let attach = self.attach_agent(transport, &dir, lifetime).await?;

        // Kernel parameters first: an init part (after `--`) in the extras stays last.
        let serial = match transport {
            AgentTransport::Serial => format!("sandbox.serial={} ", super::qemu::SERIAL_PORT_NAME),
            AgentTransport::Vsock => String::new(),
        };
        let extra = format!("sandbox.token={token} {serial}{}", spec.extra_cmdline);
        let cmdline = kernel_cmdline(&template.cmdline, &extra, self.tsc_khz());
        let name = qemu_name(dir.id());
        let console = dir.file(CONSOLE_LOG);
        let vhost_socket = dir.file(VHOST_SOCKET);
        let serial_socket = dir.file(SERIAL_SOCKET);
        let qemu_spec = QemuSpec {
            name: &name,
            accel: accel.accel,
            size,
            kernel: &template.kernel,
            initramfs: template.initramfs.as_deref(),
            cmdline: &cmdline,
            vhost_socket: (transport == AgentTransport::Vsock).then_some(vhost_socket.as_path()),
            serial_socket: (transport == AgentTransport::Serial).then_some(serial_socket.as_path()),
            ram_file: attach.ram_file.as_deref().map(|path| (path, true)),
            incoming: false,
            disk: overlay.as_deref(),
            console_log: &console,
        };
        let started = Instant::now();
        let mut qemu = self.spawn_qemu(&qemu_spec, &dir, lifetime).await?;
        record.qemu_pid = Some(qemu.pid());
        record.daemon_pid = Some(attach.daemon.pid());
        dir.write_record(&record)?;
        tracing::info!(id = %record.id, template = %template.name, %size, accel = %accel.accel, %transport, qemu_pid = qemu.pid(), "booting");

        let daemon = attach.daemon;
        let waited = tokio::select! {
            ready = attach.ready.receive() => Waited::Ready(ready),
            status = qemu.wait() => Waited::Exited(status),
            () = tokio::time::sleep(spec.ready_timeout) => Waited::TimedOut,
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
                    timeout: spec.ready_timeout,
                    logs,
                }))
            }
        };
        tracing::info!(
            id = %record.id,
            boot_ms = u64::try_from(boot_duration.as_millis()).unwrap_or(u64::MAX),
            agent_version = %ready.agent_version,
            guest_uptime_ms = ready.uptime_ms,
            "vm ready"
        );
        let run_path = dir.path().to_owned();
        Ok(Vm {
            record,
            ready,
            boot_duration,
            accel,
            token,
            qemu: Some(qemu),
            daemon: Some(daemon),
            run_dir: Some(dir),
            run_path,
        })
    }

    /// Every run folder and whether its VM is alive.
    pub fn list(&self) -> Result<Vec<RunDirEntry>, LaunchError> {
        Ok(run_dir::list(&self.config.run_root)?)
    }

    /// Removes the folders of VMs whose owner and QEMU are gone; returns their names.
    pub fn sweep(&self) -> Result<Vec<String>, LaunchError> {
        Ok(run_dir::sweep(&self.config.run_root)?)
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
        match run_dir::remove_run_folder(&path) {
            Ok(()) => Ok(outcome),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(outcome),
            Err(error) => Err(LaunchError::RemoveRunDir {
                id: id.clone(),
                error,
            }),
        }
    }

    /// The transport's host side, started before QEMU: the vsock daemon and the
    /// readiness listener, or the relay (and where the guest RAM goes).
    async fn attach_agent(
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
                    .map_err(|error| LaunchError::StartDaemon {
                        error,
                        logs: BootLogs::collect(dir.path()),
                    })?;
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
                };
                let (daemon, line) = relay_daemon::start(&self.config.relay_path, &paths, lifetime)
                    .await
                    .map_err(|error| LaunchError::StartDaemon {
                        error,
                        logs: BootLogs::collect(dir.path()),
                    })?;
                Ok(AgentAttach {
                    daemon,
                    ready: ReadyWait::Serial(line),
                    ram_file: Some(ram_file),
                })
            }
        }
    }

    /// A fresh RAM file path on the RAM tmpfs, linked from the run folder so that
    /// whoever removes the folder frees the memory too.
    fn ram_file(&self, dir: &RunDir) -> Result<PathBuf, LaunchError> {
        let path = self
            .config
            .ram_dir
            .join(format!("sandbox-{}.ram", dir.id()));
        let link = dir.file(run_dir::RAM_LINK);
        std::os::unix::fs::symlink(&path, &link).map_err(|error| {
            LaunchError::RunDir(run_dir::RunDirError::WriteRecord { path: link, error })
        })?;
        Ok(path)
    }

    fn tsc_khz(&self) -> Option<u32> {
        self.config
            .tsc_khz
            .or_else(|| *self.tsc_khz.get_or_init(host_tsc_khz))
    }

    async fn spawn_qemu(
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
    async fn create_overlay(
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
async fn stop_foreign(pid: u32, needle: &str, grace: Duration) -> StopOutcome {
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
enum Waited {
    Ready(ReadyResult),
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
}

/// The host side of the agent's transport, before QEMU starts.
struct AgentAttach {
    daemon: VsockDaemon,
    ready: ReadyWait,
    ram_file: Option<PathBuf>,
}

/// Where the agent's readiness arrives.
enum ReadyWait {
    /// A frame on the host's vsock readiness port.
    Vsock(ReadyListener),
    /// The relay's line once the agent attached to the link.
    Serial(ReadyLine),
}

type ReadyResult = Result<sandbox_protocol::Ready, Box<dyn FnOnce(BootLogs) -> LaunchError + Send>>;

impl ReadyWait {
    async fn receive(self) -> ReadyResult {
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
fn fail(
    qemu: &mut ChildProcess,
    dir: &RunDir,
    make: impl FnOnce(BootLogs) -> LaunchError,
) -> LaunchError {
    qemu.kill_and_reap();
    make(BootLogs::collect(dir.path()))
}
