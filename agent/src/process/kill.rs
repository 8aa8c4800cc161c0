//! `kill`: a signal to everything a tracked process started: every process in its
//! cgroup when the agent confines in cgroups (`SIGKILL` via `cgroup.kill`), else its
//! process group.

use sandbox_protocol::{KillRequest, MAX_SIGNAL};

use super::table::ProcessTable;
use super::ProcessError;
use crate::sys;

/// Signals the cgroup or group of `request.pid`. A signal outside `1..=MAX_SIGNAL` is
/// `Invalid` (the wire carries an explicit signal; 0 would only probe, and the caller
/// wanted a kill); an untracked pid is `NotFound`. An exited process is a no-op
/// success, unless it left processes in its cgroup: they get the signal.
pub fn kill(table: &ProcessTable, request: KillRequest) -> Result<(), ProcessError> {
    let signal = request.signal;
    if !(1..=MAX_SIGNAL).contains(&signal) {
        return Err(ProcessError::Invalid {
            what: "signal",
            reason: format!("{signal} is not a signal number (1 to {MAX_SIGNAL}; SIGKILL is 9)"),
        });
    }
    let record = table.get(request.pid)?;
    let signal_error = |error| ProcessError::Signal {
        pid: request.pid,
        signal,
        error,
    };
    if let Some(cgroup) = record.live_cgroup() {
        return cgroup.signal(signal).map_err(signal_error);
    }
    if record.progress().exit.is_some() {
        return Ok(());
    }
    match sys::kill_process_group(request.pid.0, signal) {
        Ok(()) => Ok(()),
        // The group emptied between our check and the signal: it has exited.
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(error) => Err(signal_error(error)),
    }
}
