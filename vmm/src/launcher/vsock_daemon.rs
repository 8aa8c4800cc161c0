//! One `vhost-device-vsock` per VM.
//!
//! The daemon is the vsock device's backend: QEMU hands it the guest memory and
//! virtqueues over the vhost-user socket (`vhost.sock`), and it exposes the guest as a
//! hybrid vsock Unix socket (`vm.vsock`: connect, `CONNECT <port>\n`, `OK <n>\n`).
//! Guest-to-host connections to port P arrive on `vm.vsock_P`, where the host must be
//! listening. Each VM gets its own daemon (guest CID 3 in every one is fine: they
//! share nothing). The daemon outlives QEMU and re-listens, so it is always stopped
//! explicitly.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::process::{ChildProcess, Lifetime};

/// The guest's CID inside its own daemon.
pub const GUEST_CID: u32 = 3;

/// How long the daemon may take to create its vhost-user socket.
pub const DAEMON_SOCKET_TIMEOUT_SECS: u64 = 5;

/// How long the daemon gets to exit on `SIGTERM` before `SIGKILL`.
const DAEMON_STOP_GRACE: Duration = Duration::from_millis(500);

/// How often to look for the socket while the daemon starts.
const SOCKET_POLL: Duration = Duration::from_millis(5);

/// Why the daemon did not come up.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// It could not be started.
    #[error("Cannot start {program}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// Its log file could not be created.
    #[error("Cannot create {path}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// It exited before creating its socket.
    #[error("vhost-device-vsock exited ({status}) before creating {}", socket.display())]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// The socket it should have created.
        socket: PathBuf,
    },
    /// It did not create its socket in time.
    #[error("vhost-device-vsock did not create {} within {DAEMON_SOCKET_TIMEOUT_SECS} s", socket.display())]
    Timeout {
        /// The socket it should have created.
        socket: PathBuf,
    },
    /// Waiting on it failed.
    #[error("Cannot wait for vhost-device-vsock")]
    Wait(#[source] std::io::Error),
}

/// Paths the daemon works with, all inside the VM's run folder.
#[derive(Debug, Clone)]
pub(crate) struct DaemonPaths {
    /// vhost-user control socket, for QEMU.
    pub vhost_socket: PathBuf,
    /// Hybrid vsock socket, for host clients.
    pub uds_path: PathBuf,
    /// stdout and stderr.
    pub log: PathBuf,
}

/// A running daemon; killed on drop.
#[derive(Debug)]
pub(crate) struct VsockDaemon {
    child: ChildProcess,
}

impl VsockDaemon {
    /// Starts the daemon and waits until its vhost-user socket exists.
    pub(crate) async fn start(
        program: &Path,
        paths: &DaemonPaths,
        lifetime: Lifetime,
    ) -> Result<Self, DaemonError> {
        let log = std::fs::File::create(&paths.log).map_err(|error| DaemonError::Log {
            path: paths.log.clone(),
            error,
        })?;
        let log_err = log.try_clone().map_err(|error| DaemonError::Log {
            path: paths.log.clone(),
            error,
        })?;
        let mut command = Command::new(program);
        // Separate flags rather than `--vm a=b,c=d`: paths may contain commas.
        command
            .arg("--guest-cid")
            .arg(GUEST_CID.to_string())
            .arg("--socket")
            .arg(&paths.vhost_socket)
            .arg("--uds-path")
            .arg(&paths.uds_path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn");
        }
        let mut child = ChildProcess::spawn("vhost-device-vsock", command, lifetime)
            .await
            .map_err(|error| DaemonError::Spawn {
                program: program.to_owned(),
                error,
            })?;
        let deadline = Instant::now() + Duration::from_secs(DAEMON_SOCKET_TIMEOUT_SECS);
        loop {
            if paths.vhost_socket.exists() {
                return Ok(Self { child });
            }
            if let Some(status) = child.try_wait().map_err(DaemonError::Wait)? {
                return Err(DaemonError::Exited {
                    status,
                    socket: paths.vhost_socket.clone(),
                });
            }
            if Instant::now() >= deadline {
                return Err(DaemonError::Timeout {
                    socket: paths.vhost_socket.clone(),
                });
            }
            tokio::time::sleep(SOCKET_POLL).await;
        }
    }

    /// A VM's other per-VM daemon (the relay of a serial VM) under the same handle:
    /// the VM stops, detaches and reaps it the same way.
    pub(crate) fn from_child(child: ChildProcess) -> Self {
        Self { child }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Stops the daemon (`SIGTERM`, then `SIGKILL`) and reaps it.
    pub(crate) async fn stop(mut self) {
        if let Err(error) = self.child.terminate(DAEMON_STOP_GRACE).await {
            tracing::warn!(name = self.child.name(), pid = self.child.pid(), %error, "stop failed");
        }
    }

    /// Waits up to `within` for a relay to end by itself, which it does once QEMU
    /// has closed its sockets and the console's last bytes are in its log. Other
    /// daemons are not waited for (vhost-device-vsock may outlive QEMU).
    pub(crate) async fn relay_ended(&mut self, within: Duration) {
        if self.child.name() == super::relay_daemon::RELAY_PROGRAM {
            let _ = tokio::time::timeout(within, self.child.wait()).await;
        }
    }

    /// Leaves the daemon running (a detached VM); returns its pid.
    pub(crate) fn release(self) -> u32 {
        self.child.release()
    }
}
