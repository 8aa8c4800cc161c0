//! `kill`: a signal to a tracked process's whole process group.

use sandbox_protocol::{KillRequest, Pid, MAX_SIGNAL};

use super::table::ProcessTable;
use super::ProcessError;
use crate::sys;

/// Signals the group of `request.pid`. A signal outside `1..=MAX_SIGNAL` is `Invalid`
/// (the wire carries an explicit signal; 0 would only probe, and the caller wanted a
/// kill); an exited process is a no-op success; an untracked pid is `NotFound`.
pub fn kill(table: &ProcessTable, request: KillRequest) -> Result<(), ProcessError> {
    let signal = request.signal;
    if !(1..=MAX_SIGNAL).contains(&signal) {
        return Err(ProcessError::Invalid {
            what: "signal",
            reason: format!("{signal} is not a signal number (1 to {MAX_SIGNAL}; SIGKILL is 9)"),
        });
    }
    let record = table.get(request.pid)?;
    if record.progress().exit.is_some() {
        return Ok(());
    }
    match sys::kill_process_group(request.pid.0, signal) {
        Ok(()) => Ok(()),
        // The group emptied between our check and the signal: it has exited.
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(error) => Err(ProcessError::Signal {
            pid: Pid(request.pid.0),
            signal,
            error,
        }),
    }
}
