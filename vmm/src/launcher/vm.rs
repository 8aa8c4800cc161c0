//! A running VM: where to reach its agent, and how it stops.
//!
//! Lifecycle: `Ready` (returned by `Launcher::boot`) → stopped by
//! [`Vm::shutdown_with`] / [`Vm::shutdown`], by dropping the handle (immediate
//! `SIGKILL`), or handed off by [`Vm::detach`]. Every way out reaps QEMU and the
//! vsock daemon and removes the run folder, except `detach`, which leaves all three to
//! a later `Launcher::stop`.
//!
//! A handle made by `Launcher::adopt` (a detached VM some other process started)
//! has no child processes: it reaches QEMU and the daemon by pidfd (see `adopt`),
//! and otherwise ends the same ways.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use sandbox_protocol::Ready;
use tokio::time::Instant;

use super::accel::AccelDecision;
use super::adopt::Adopted;
use super::process::ChildProcess;
use super::run_dir::{RunDir, VmId, VmRecord};
use super::size::Size;
use super::vsock_daemon::VsockDaemon;
use super::{AgentTransport, LaunchError, AGENT_PORT, AGENT_SOCKET, CONSOLE_LOG, VSOCK_SOCKET};

/// How long QEMU gets to exit on `SIGTERM` once the grace period is over.
const QEMU_TERM_GRACE: Duration = Duration::from_secs(1);

/// How long [`Vm::wait_exit`] waits, after QEMU, for the relay to finish the console
/// (it drains for up to 2 s itself).
const RELAY_END_AFTER_QEMU: Duration = Duration::from_secs(3);

/// How long a detached VM's daemon gets to exit on `SIGTERM` after QEMU exited.
pub(crate) const DAEMON_STOP_GRACE: Duration = Duration::from_secs(2);

/// How a VM's QEMU ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// QEMU exited on its own (the guest powered off) within the grace period.
    Exited(ExitStatus),
    /// QEMU exited when sent `SIGTERM`.
    Terminated,
    /// QEMU had to be killed.
    Killed,
    /// QEMU was not running (stopping a VM from another process).
    NotRunning,
}

/// A booted VM whose agent said it is ready. Dropping it kills the VM.
#[derive(Debug)]
pub struct Vm {
    pub(crate) record: VmRecord,
    pub(crate) ready: Ready,
    pub(crate) boot_duration: Duration,
    pub(crate) accel: AccelDecision,
    /// The token its agent requires (also in the run folder's `token` file).
    pub(crate) token: String,
    // Dropped in this order: QEMU, then its daemon, then the folder they used.
    pub(crate) qemu: Option<ChildProcess>,
    pub(crate) daemon: Option<VsockDaemon>,
    pub(crate) run_dir: Option<RunDir>,
    pub(crate) run_path: PathBuf,
    /// Set instead of `qemu` and `daemon` for an adopted VM (`Launcher::adopt`).
    pub(crate) adopted: Option<Adopted>,
}

impl Vm {
    /// The VM's id.
    pub fn id(&self) -> &VmId {
        &self.record.id
    }

    /// The agent's address for the client: `unix://RUN/agent.sock` (the relay of a
    /// serial VM) or `hvsock://RUN/vm.vsock:1024`.
    pub fn agent_url(&self) -> String {
        self.record.agent_url.clone()
    }

    /// [`Vm::agent_url`], typed.
    pub fn url(&self) -> crate::client::AgentUrl {
        match self.record.transport {
            AgentTransport::Serial => {
                crate::client::AgentUrl::Unix(self.run_path.join(AGENT_SOCKET))
            }
            AgentTransport::Vsock => crate::client::AgentUrl::Hvsock {
                path: self.run_path.join(VSOCK_SOCKET),
                port: AGENT_PORT,
            },
        }
    }

    /// How the agent is reached.
    pub fn transport(&self) -> AgentTransport {
        self.record.transport
    }

    /// The token this VM's agent requires: the launcher makes a random one per VM.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Records a new token the agent was given (`reidentify`): in the handle and the
    /// run folder's token file.
    pub(crate) fn set_token(&mut self, token: String) -> Result<(), LaunchError> {
        if let Some(dir) = &self.run_dir {
            dir.write_token(&token)?;
        } else {
            super::run_dir::write_token_file(&self.run_path, &token)?;
        }
        self.token = token;
        Ok(())
    }

    /// Connection options for this VM's agent: its token, and the given timeout.
    pub fn connect_options(&self, connect_timeout: Duration) -> crate::client::ConnectOptions {
        crate::client::ConnectOptions {
            token: Some(self.token.clone()),
            connect_timeout,
        }
    }

    /// A client connected to this VM's agent, with the VM's token (a token in
    /// `options` is ignored: no other one is accepted). The agent already reported
    /// ready, so this retries only briefly (`connect_timeout` bounds each attempt).
    pub async fn client(
        &self,
        options: &crate::client::ConnectOptions,
    ) -> Result<crate::client::Client, crate::client::ClientError> {
        let url = self.url();
        let options = self.connect_options(options.connect_timeout);
        let deadline = Instant::now() + options.connect_timeout;
        crate::client::Client::connect_with_retry(&url, &options, deadline).await
    }

    /// The hybrid vsock Unix socket (connect, then `CONNECT <port>\n`) of a vsock VM.
    pub fn agent_socket(&self) -> PathBuf {
        self.run_path.join(VSOCK_SOCKET)
    }

    /// The vsock port the agent listens on.
    pub fn agent_port(&self) -> u32 {
        AGENT_PORT
    }

    /// What the agent said when it became ready.
    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    /// From QEMU's start to the `Ready` frame.
    pub fn boot_duration(&self) -> Duration {
        self.boot_duration
    }

    /// The accelerator and why it was chosen.
    pub fn accel(&self) -> &AccelDecision {
        &self.accel
    }

    /// vCPUs and memory.
    pub fn size(&self) -> Size {
        self.record.size
    }

    /// The serial console log (removed with the VM).
    pub fn console_log_path(&self) -> PathBuf {
        self.run_path.join(CONSOLE_LOG)
    }

    /// The run folder.
    pub fn run_dir(&self) -> &Path {
        &self.run_path
    }

    /// What `vm.json` says.
    pub fn record(&self) -> &VmRecord {
        &self.record
    }

    /// QEMU's pid.
    pub fn qemu_pid(&self) -> Option<u32> {
        self.record.qemu_pid
    }

    /// Waits until QEMU exits on its own (the guest powered off or crashed); the VM is
    /// then dead but its daemon and folder remain until the handle is dropped or shut
    /// down. Cancel-safe.
    /// An adopted VM's QEMU is not this process's child: its status reads as 0.
    pub async fn wait_exit(&mut self) -> Result<ExitStatus, LaunchError> {
        if let (None, Some(adopted)) = (&self.qemu, &self.adopted) {
            use std::os::unix::process::ExitStatusExt;
            adopted
                .wait_exit()
                .await
                .map_err(|error| LaunchError::Wait {
                    what: "QEMU",
                    error,
                })?;
            return Ok(ExitStatus::from_raw(0));
        }
        let qemu = self.qemu.as_mut().ok_or_else(gone)?;
        let status = qemu.wait().await.map_err(|error| LaunchError::Wait {
            what: "QEMU",
            error,
        })?;
        // The relay copies the console: once it has ended, the console log is whole
        // (a post-mortem read at once finds the guest's last line).
        if let Some(daemon) = self.daemon.as_mut() {
            daemon.relay_ended(RELAY_END_AFTER_QEMU).await;
        }
        Ok(status)
    }

    /// Stops the VM without asking the guest: `SIGTERM` to QEMU, up to `grace` for
    /// it to exit, then `SIGKILL`; then the daemon and the run folder.
    pub async fn shutdown(mut self, grace: Duration) -> Result<StopOutcome, LaunchError> {
        if let (None, Some(adopted)) = (&self.qemu, self.adopted.as_mut()) {
            let outcome = adopted.stop(grace).await;
            self.finish().await;
            return Ok(outcome);
        }
        let qemu = self.qemu.as_mut().ok_or_else(gone)?;
        let outcome = match qemu.try_wait() {
            Ok(Some(status)) => Ok(StopOutcome::Exited(status)),
            _ => match signal_then_wait(qemu, Signal::SIGTERM, grace).await {
                Ok(Some(_)) => Ok(StopOutcome::Terminated),
                Ok(None) => kill(qemu).await,
                Err(error) => Err(error),
            },
        };
        self.finish().await;
        outcome
    }

    /// Stops the VM gracefully: runs `hook` (typically the client asking the agent to
    /// shut down), waits for QEMU to exit until `grace` has passed since the call,
    /// then sends `SIGTERM`, then `SIGKILL`; then stops the daemon and removes the run
    /// folder. `hook` is abandoned if it outlasts `grace`.
    pub async fn shutdown_with<F>(
        mut self,
        grace: Duration,
        hook: F,
    ) -> Result<StopOutcome, LaunchError>
    where
        F: Future<Output = ()>,
    {
        let deadline = Instant::now() + grace;
        if tokio::time::timeout_at(deadline, hook).await.is_err() {
            tracing::warn!(id = %self.id(), "shutdown hook outlasted the grace period");
        }
        if let (None, Some(adopted)) = (&self.qemu, self.adopted.as_mut()) {
            let exited = tokio::time::timeout_at(deadline, adopted.wait_exit()).await;
            let outcome = match exited {
                Ok(Ok(())) => {
                    use std::os::unix::process::ExitStatusExt;
                    adopted.release();
                    StopOutcome::Exited(ExitStatus::from_raw(0))
                }
                _ => adopted.stop(QEMU_TERM_GRACE).await,
            };
            self.finish().await;
            return Ok(outcome);
        }
        let qemu = self.qemu.as_mut().ok_or_else(gone)?;
        let outcome = match tokio::time::timeout_at(deadline, qemu.wait()).await {
            Ok(Ok(status)) => Ok(StopOutcome::Exited(status)),
            Ok(Err(error)) => Err(LaunchError::Wait {
                what: "QEMU",
                error,
            }),
            Err(_) => match signal_then_wait(qemu, Signal::SIGTERM, QEMU_TERM_GRACE).await {
                Ok(Some(_)) => Ok(StopOutcome::Terminated),
                Ok(None) => kill(qemu).await,
                Err(error) => Err(error),
            },
        };
        self.finish().await;
        outcome
    }

    /// Leaves a VM booted with `BootSpec::detached` running past this handle (and this
    /// process) and returns its record; stop it later with `Launcher::stop`. A VM booted
    /// attached is handed back unchanged: its processes die with this process anyway.
    pub fn detach(mut self) -> Result<VmRecord, Box<Self>> {
        if !self.record.detached {
            return Err(Box::new(self));
        }
        // Nobody will own this VM: the watcher started with its QEMU (see
        // `watch_exit`) stops its daemon when QEMU exits (the guest powered off or
        // panicked), so no daemon outlives its VM.
        if let Some(qemu) = self.qemu.take() {
            qemu.release();
        }
        if let Some(daemon) = self.daemon.take() {
            daemon.release();
        }
        if let Some(dir) = self.run_dir.take() {
            dir.keep();
        }
        if let Some(mut adopted) = self.adopted.take() {
            adopted.release();
        }
        Ok(self.record.clone())
    }

    /// Reaps QEMU (already stopped), stops the daemon, removes the run folder.
    async fn finish(&mut self) {
        if let Some(mut qemu) = self.qemu.take() {
            qemu.kill_and_reap();
        }
        if let Some(daemon) = self.daemon.take() {
            daemon.stop().await;
        }
        drop(self.run_dir.take());
        self.remove_adopted_folder();
        tracing::info!(id = %self.record.id, "vm stopped");
    }

    /// An adopted VM's folder is nobody's `RunDir`: its handle removes it (and the
    /// RAM file it links to) once the VM is stopped.
    fn remove_adopted_folder(&mut self) {
        let Some(mut adopted) = self.adopted.take() else {
            return;
        };
        adopted.kill();
        if let Err(error) = super::run_dir::remove_run_folder(&self.run_path) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.run_path.display(), %error, "cannot remove run folder");
            }
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Synchronous and best effort: SIGKILL and reap each, then remove the folder.
        if let Some(mut qemu) = self.qemu.take() {
            qemu.kill_and_reap();
        }
        drop(self.daemon.take());
        drop(self.run_dir.take());
        self.remove_adopted_folder();
    }
}

/// Starts the watcher of a VM's QEMU (see [`super::sys::spawn_exit_watcher`]): once
/// QEMU exits, it stops `daemon` (a detached VM's, which nobody else would stop) and
/// unlinks `ram` (the VM's own RAM file). Best effort: without it, `Launcher::stop`,
/// the owner's handle or the next sweep still clean up.
pub(crate) fn watch_exit(qemu: &ChildProcess, daemon: Option<&VsockDaemon>, ram: Option<&Path>) {
    use std::os::unix::ffi::OsStrExt;
    let ram = ram.and_then(|path| std::ffi::CString::new(path.as_os_str().as_bytes()).ok());
    let watched = super::sys::PidFd::open(qemu.pid()).and_then(|qemu| {
        let daemon = daemon
            .map(|daemon| super::sys::PidFd::open(daemon.pid()))
            .transpose()?;
        let grace = i32::try_from(DAEMON_STOP_GRACE.as_millis()).unwrap_or(i32::MAX);
        super::sys::spawn_exit_watcher(&qemu, daemon.as_ref(), grace, ram.as_deref())
    });
    if let Err(error) = watched {
        tracing::warn!(%error, qemu_pid = qemu.pid(), "cannot watch the VM's QEMU; its daemon and RAM file go only with its handle, `stop` or a sweep");
    }
}

fn gone() -> LaunchError {
    LaunchError::Wait {
        what: "QEMU",
        error: std::io::Error::other("the VM was already stopped"),
    }
}

/// Sends `signal` and waits up to `grace`; `None` if QEMU is still running.
async fn signal_then_wait(
    qemu: &mut ChildProcess,
    signal: Signal,
    grace: Duration,
) -> Result<Option<ExitStatus>, LaunchError> {
    qemu.signal(signal).map_err(|error| LaunchError::Wait {
        what: "QEMU",
        error,
    })?;
    match tokio::time::timeout(grace, qemu.wait()).await {
        Ok(Ok(status)) => Ok(Some(status)),
        Ok(Err(error)) => Err(LaunchError::Wait {
            what: "QEMU",
            error,
        }),
        Err(_) => Ok(None),
    }
}

async fn kill(qemu: &mut ChildProcess) -> Result<StopOutcome, LaunchError> {
    qemu.signal(Signal::SIGKILL)
        .map_err(|error| LaunchError::Wait {
            what: "QEMU",
            error,
        })?;
    qemu.wait().await.map_err(|error| LaunchError::Wait {
        what: "QEMU",
        error,
    })?;
    Ok(StopOutcome::Killed)
}
