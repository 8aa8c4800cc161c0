//! What commands print, and how a closed pipe ends a run.
//!
//! Every write to stdout goes through here and fails with an [`OutputError`] instead
//! of panicking as `println!` does. Rust ignores SIGPIPE, so when the reader of our
//! output goes away (`sandboxctl ps | head -1`) a write fails with `EPIPE`; that is a
//! normal end, not a failure, and `main` exits 0 without a message (as ripgrep does),
//! the reader having taken what it wanted. Keeping SIGPIPE ignored (rather than
//! restoring its default action) matters: a write to a dead agent's socket must be an
//! error we report, not a silent death.

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};

use sandbox_protocol::{OutputChunk, Stream};
use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Writing our output failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Writing to stdout failed.
    #[error("Cannot write to stdout")]
    Stdout(#[source] io::Error),
    /// Writing a command's stderr to ours failed.
    #[error("Cannot write to stderr")]
    Stderr(#[source] io::Error),
    /// A value could not be turned into JSON.
    #[error("Cannot encode JSON")]
    Json(#[source] serde_json::Error),
}

impl OutputError {
    /// True when the reader of our output is gone: the write failed with `EPIPE`.
    fn is_closed_pipe(&self) -> bool {
        match self {
            Self::Stdout(error) | Self::Stderr(error) => error.kind() == io::ErrorKind::BrokenPipe,
            Self::Json(_) => false,
        }
    }
}

/// True when `error` means the reader of our output went away: the run ends quietly.
/// Only our own stdout and stderr count; a broken pipe to the agent is a failure.
pub fn is_closed_output(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<OutputError>())
        .any(OutputError::is_closed_pipe)
}

/// Writes `data` to stdout and flushes, so output shows up live.
pub fn stdout(data: &[u8]) -> Result<(), OutputError> {
    write_flushed(&mut io::stdout().lock(), data).map_err(OutputError::Stdout)
}

/// Writes `data` to stderr and flushes.
pub fn stderr(data: &[u8]) -> Result<(), OutputError> {
    write_flushed(&mut io::stderr().lock(), data).map_err(OutputError::Stderr)
}

/// Writes `text` to stdout.
pub fn print(text: &str) -> Result<(), OutputError> {
    stdout(text.as_bytes())
}

/// Prints one JSON value on its own line.
pub fn print_json_line<T: Serialize>(value: &T) -> Result<(), OutputError> {
    let mut line = serde_json::to_vec(value).map_err(OutputError::Json)?;
    line.push(b'\n');
    stdout(&line)
}

/// Writes a chunk to our stdout or stderr, as the agent tagged it.
pub fn write_chunk(chunk: &OutputChunk) -> Result<(), OutputError> {
    match chunk.stream {
        Stream::Stdout | Stream::Pty => stdout(&chunk.data),
        Stream::Stderr => stderr(&chunk.data),
    }
}

/// Resolves when the reader of our stdout, a pipe, goes away: a follow whose process
/// prints nothing for a while still ends once `head` has what it wanted, as `tail -f`
/// does, instead of waiting for its next write to fail. Never resolves for a
/// terminal or a file, or when stdout cannot be watched.
pub async fn stdout_closed() -> OutputError {
    reader_gone(io::stdout().as_fd()).await;
    OutputError::Stdout(io::ErrorKind::BrokenPipe.into())
}

/// Resolves once `fd`, the write end of a pipe, has no reader left (Linux reports
/// EPOLLERR then); pending forever for what epoll cannot watch (a regular file) or
/// what never errs (a terminal).
async fn reader_gone(fd: BorrowedFd<'_>) {
    // A duplicate, so the watch never deregisters or closes the caller's descriptor.
    let watch = fd.try_clone_to_owned().and_then(|fd| {
        // SAFETY: `fd` is an open descriptor this `AsyncFd` owns: it stays open, and
        // `as_raw_fd` returns the same number, until the `AsyncFd` drops it.
        unsafe { AsyncFd::register_with_interest(fd, Interest::ERROR) }.map_err(io::Error::from)
    });
    if let Ok(watch) = watch {
        if watch.ready(Interest::ERROR).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

fn write_flushed(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    out.write_all(data)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    fn broken_pipe() -> io::Error {
        io::Error::from(io::ErrorKind::BrokenPipe)
    }

    #[test]
    fn a_closed_stdout_or_stderr_ends_quietly() {
        let error = anyhow::Error::new(OutputError::Stdout(broken_pipe()));
        assert!(is_closed_output(&error));
        let error = anyhow::Error::new(OutputError::Stderr(broken_pipe()));
        assert!(is_closed_output(&error));
    }

    #[test]
    fn a_closed_stdout_ends_quietly_under_context() {
        let result: anyhow::Result<()> =
            Err(OutputError::Stdout(broken_pipe())).context("logs 7 failed");
        let Err(error) = result else {
            panic!("not an error")
        };
        assert!(is_closed_output(&error));
    }

    #[test]
    fn other_output_errors_are_failures() {
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(!is_closed_output(&anyhow::Error::new(OutputError::Stdout(
            full
        ))));
    }

    #[tokio::test]
    async fn a_pipe_without_a_reader_is_seen_before_any_write() {
        let (reader, writer) = io::pipe().unwrap();
        let gone = reader_gone(writer.as_fd());
        tokio::pin!(gone);
        // Still read: the watch must not fire (a short look, not a wait for an event).
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), &mut gone).await;
        assert!(early.is_err(), "fired while the reader was open");
        drop(reader);
        tokio::time::timeout(std::time::Duration::from_secs(10), gone)
            .await
            .expect("a closed reader was not noticed");
    }

    // A broken pipe to the agent (it died mid-request) must still be reported.
    #[test]
    fn a_broken_pipe_elsewhere_is_a_failure() {
        let result: anyhow::Result<()> = Err(broken_pipe()).context("Cannot reach the agent");
        let Err(error) = result else {
            panic!("not an error")
        };
        assert!(!is_closed_output(&error));
    }
}
