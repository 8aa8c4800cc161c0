//! Terminals: a process on a pseudo-terminal whose output goes to its ring (as
//! [`Stream::Pty`]), so it survives client disconnects and a re-attach replays it.
//! Input and resizes go to the master end the record keeps.

use std::os::fd::AsFd;
use std::sync::Arc;

use sandbox_protocol::{Pid, ProcessKind, PtyOpenRequest, Stream, WindowSize};
use tokio::io::unix::AsyncFd;

use super::launch::{self, ChildStdio};
use super::pump::pump;
use super::source::Source;
use super::table::{ProcessRecord, ProcessTable};
use super::ProcessError;
use crate::sys;

/// Opens a terminal running the request's command (or the login shell).
pub fn open(table: &ProcessTable, request: &PtyOpenRequest) -> Result<Pid, ProcessError> {
    let plan = launch::plan(&request.spec, true, table.defaults())?;
    let pair = sys::open_pty(sanitize(request.size)).map_err(ProcessError::OpenPty)?;
    sys::set_nonblocking(pair.master.as_fd()).map_err(ProcessError::OpenPty)?;
    let master = sys::register_async(pair.master).map_err(ProcessError::OpenPty)?;
    let master = Arc::new(master);
    let stdio = ChildStdio::Terminal {
        master: master.clone(),
        slave: pair.slave,
    };
    let (record, _pipes) = launch::start(table, plan, ProcessKind::Pty, stdio, None)?;
    tokio::spawn(pump(
        record.clone(),
        Source::Terminal(master),
        Stream::Pty,
        None,
    ));
    Ok(record.pid)
}

/// Writes `data` to the terminal of `pid`.
pub async fn input(table: &ProcessTable, pid: Pid, data: &[u8]) -> Result<(), ProcessError> {
    let (record, master) = terminal_of(table, pid)?;
    let io_error = |error| ProcessError::PtyIo { pid, error };
    // Requests are started in arrival order and the lock is fair, so input is
    // written in the order it was sent.
    let _in_order = record.input_order.lock().await;
    let mut rest = data;
    while !rest.is_empty() {
        // A terminal whose process is gone drains no more: do not wait on it.
        if record.progress().exit.is_some() {
            return Err(ProcessError::Exited { pid });
        }
        let mut guard = master.writable().await.map_err(io_error)?;
        let written = guard.try_io(|inner| sys::write(inner.get_ref().as_fd(), rest));
        match written {
            Err(_would_block) => continue,
            Ok(Ok(n)) => rest = &rest[n..],
            Ok(Err(error)) => return Err(io_error(error)),
        }
    }
    Ok(())
}

/// Resizes the terminal of `pid`; its foreground process group gets `SIGWINCH`.
pub fn resize(table: &ProcessTable, pid: Pid, size: WindowSize) -> Result<(), ProcessError> {
    let (_record, master) = terminal_of(table, pid)?;
    sys::set_window_size(master.get_ref().as_fd(), sanitize(size))
        .map_err(|error| ProcessError::PtyIo { pid, error })
}

fn terminal_of(
    table: &ProcessTable,
    pid: Pid,
) -> Result<(Arc<ProcessRecord>, Arc<AsyncFd<std::os::fd::OwnedFd>>), ProcessError> {
    let record = table.get(pid)?;
    let master = record
        .pty
        .clone()
        .ok_or(ProcessError::NotATerminal { pid })?;
    if record.progress().exit.is_some() {
        return Err(ProcessError::Exited { pid });
    }
    Ok((record, master))
}

/// A zero dimension confuses full-screen programs; use the classic 24x80 instead.
fn sanitize(size: WindowSize) -> WindowSize {
    WindowSize {
        rows: if size.rows == 0 { 24 } else { size.rows },
        cols: if size.cols == 0 { 80 } else { size.cols },
    }
}
