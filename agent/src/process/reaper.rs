//! The one reaper: a `waitpid(-1, WNOHANG)` loop woken by `SIGCHLD`.
//!
//! It reaps until `ECHILD` or until no more children have exited, retries on `EINTR`,
//! and hands each status to the table by pid. Untracked pids (orphans adopted by the
//! agent as init or subreaper) are reaped and logged, so no zombie is ever left.

use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use sandbox_protocol::{ExitStatus, Pid};
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::table::ProcessTable;

/// Registers for `SIGCHLD`. Do this before starting any child, so no exit goes unseen.
pub fn sigchld() -> std::io::Result<Signal> {
    signal(SignalKind::child())
}

/// Reaps forever: call once, in its own task.
pub async fn run(table: Arc<ProcessTable>, mut sigchld: Signal) {
    loop {
        for (pid, status) in reap_exited(&table) {
            if !table.on_exit(pid, status) {
                tracing::debug!(%pid, ?status, "reaped an untracked process");
            }
        }
        if sigchld.recv().await.is_none() {
            tracing::error!("SIGCHLD stream ended; the reaper stops");
            return;
        }
    }
}

/// Collects every exit status available now, holding the table's reap gate.
fn reap_exited(table: &ProcessTable) -> Vec<(Pid, ExitStatus)> {
    let _gate = table.reap_gate();
    let mut reaped = Vec::new();
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => reaped.push((
                Pid(pid.as_raw()),
                ExitStatus {
                    code: Some(code),
                    signal: None,
                },
            )),
            Ok(WaitStatus::Signaled(pid, signal, _core)) => reaped.push((
                Pid(pid.as_raw()),
                ExitStatus {
                    code: None,
                    signal: Some(signal as i32),
                },
            )),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return reaped,
            Ok(_) => {} // stops and continues are not asked for; keep reaping
            Err(Errno::EINTR) => {}
            Err(errno) => {
                tracing::error!(%errno, "waitpid failed");
                return reaped;
            }
        }
    }
}
