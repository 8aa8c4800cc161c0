//! One `sandbox-relay` per serial-transport VM (see [`crate::relay`]).
//!
//! The relay connects to QEMU's virtio-serial chardev (`serial.sock`, QEMU listens)
//! and serves clients on `agent.sock`. When the agent first attaches it prints the
//! agent's [`Ready`] as one JSON line on stdout and closes it: that line is the boot's
//! readiness, as the frame on vsock port 1025 is for a vsock VM. It exits by itself
//! when QEMU closes the chardev.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandbox_protocol::Ready;
use tokio::io::AsyncReadExt;

use super::accel::find_program;
use super::process::{ChildProcess, Lifetime};
use super::vsock_daemon::{DaemonError, VsockDaemon};

/// The relay binary's name, looked up next to this program, then on `PATH`.
pub const RELAY_PROGRAM: &str = "sandbox-relay";

/// How long the relay retries connecting to QEMU's chardev.
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// The ready line is small; anything longer is not from our relay.
const READY_LINE_MAX_BYTES: u64 = 4096;

/// Where a VM's relay connects, listens and logs.
#[derive(Debug, Clone)]
pub(crate) struct RelayPaths {
    /// QEMU's chardev socket.
    pub chardev: PathBuf,
    /// Where clients connect.
    pub listen: PathBuf,
    /// stderr.
    pub log: PathBuf,
    /// The VM's egress policy (absent: `net: none`) and log.
    pub egress_policy: PathBuf,
    /// Where the relay records egress.
    pub egress_log: PathBuf,
    /// QEMU's console socket, and the bounded log the relay copies it into.
    pub console: (PathBuf, PathBuf),
}

/// Why the relay's readiness line could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RelayReadyError {
    /// Reading the relay's stdout failed.
    #[error("Cannot read the relay's output")]
    Read(#[source] std::io::Error),
    /// The relay closed its stdout without a line (it exited: see its log).
    #[error("The relay exited before the agent attached")]
    Closed,
    /// The line is not a `Ready`.
    #[error("The relay's readiness line is not a Ready message: {line:?}")]
    Malformed {
        /// What arrived.
        line: String,
    },
}

/// The relay's stdout, where its one readiness line arrives.
#[derive(Debug)]
pub(crate) struct ReadyLine(tokio::net::unix::pipe::Receiver);

impl ReadyLine {
    /// Waits for the line. Cancel safe only in the sense that a dropped wait loses
    /// the line: callers race it against QEMU's exit and a deadline, once.
    pub(crate) async fn receive(self) -> Result<Ready, RelayReadyError> {
        let mut bytes = Vec::new();
        self.0
            .take(READY_LINE_MAX_BYTES)
            .read_to_end(&mut bytes)
            .await
            .map_err(RelayReadyError::Read)?;
        let line = String::from_utf8_lossy(&bytes);
        let line = line.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Err(RelayReadyError::Closed);
        }
        serde_json::from_str(line).map_err(|_| RelayReadyError::Malformed {
            line: line.chars().take(200).collect(),
        })
    }
}

/// Starts the relay; returns it as the VM's daemon, and its readiness line.
pub(crate) async fn start(
    program: &Path,
    paths: &RelayPaths,
    lifetime: Lifetime,
) -> Result<(VsockDaemon, ReadyLine), DaemonError> {
    let program = resolve(program);
    let log = std::fs::File::create(&paths.log).map_err(|error| DaemonError::Log {
        path: paths.log.clone(),
        error,
    })?;
    let mut command = Command::new(&program);
    command
        .arg("--agent")
        .arg(&paths.chardev)
        .arg("--listen")
        .arg(&paths.listen)
        .arg("--connect-timeout-ms")
        .arg(CONNECT_TIMEOUT_MS.to_string())
        .arg("--egress-policy")
        .arg(&paths.egress_policy)
        .arg("--egress-log")
        .arg(&paths.egress_log)
        .arg("--log")
        .arg(&paths.log)
        .arg("--console")
        .arg(&paths.console.0)
        .arg("--console-log")
        .arg(&paths.console.1)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    let spawn_failed = |error| DaemonError::Spawn {
        program: program.clone(),
        error,
    };
    let mut child = ChildProcess::spawn(RELAY_PROGRAM, command, lifetime)
        .await
        .map_err(spawn_failed)?;
    let stdout = child
        .take_stdout()
        .ok_or_else(|| spawn_failed(std::io::Error::other("no stdout pipe")))?;
    let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
        .map_err(spawn_failed)?;
    Ok((VsockDaemon::from_child(child), ReadyLine(receiver)))
}

/// A bare `sandbox-relay` is looked up next to the running program first (front
/// ends and tests are built into one folder; a test binary sits one level deeper, in
/// `deps/`), then on `PATH`. A path is taken as it is.
pub fn resolve(program: &Path) -> PathBuf {
    if program.components().count() > 1 {
        return program.to_owned();
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?.to_owned();
        let candidates = [
            Some(dir.join(program)),
            dir.parent().map(|p| p.join(program)),
        ];
        candidates.into_iter().flatten().find(|path| path.is_file())
    });
    beside
        .or_else(|| find_program(program))
        .unwrap_or_else(|| program.to_owned())
}
