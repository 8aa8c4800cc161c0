//! `kill`: a signal to a tracked process's whole process group.

use sandbox_protocol::{KillRequest, Pid};

use super::table::ProcessTable;
use super::ProcessError;
use crate::sys;

/// Signals the group of `request.pid`. Signal 0 means `SIGKILL`; an exited process is
/// a no-op success; an untracked pid is `NotFound`.
pub fn kill(table: &ProcessTable, request: KillRequest) -> Result<(), ProcessError> {
    let record = table.get(request.pid)?;
    if record.progress().exit.is_some() {
        return Ok(());
    }
    let signal = if request.signal == 0 {
        libc::SIGKILL
    } else {
        request.signal
    };
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
