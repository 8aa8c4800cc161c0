//! Moves a child's output into its record: one pump per pipe or terminal.
//!
//! A pump allocates its read buffer only once data is ready, so a quiet process
//! costs no buffer memory. It reads until end of file, however long a background
//! grandchild keeps the pipe open (so that grandchild never blocks on a full pipe
//! or dies of `SIGPIPE`). But the stream *settles*, for waiters, at end of file or
//! once it stayed quiet for [`DRAIN_IDLE_AFTER_EXIT`] after the process exited: such
//! a grandchild cannot hold an exec's reply, or a follower, open forever.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::{OutputChunk, Stream};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::table::ProcessRecord;
use crate::sys;

/// How long output may stay silent after the process exits before the pump stops.
pub const DRAIN_IDLE_AFTER_EXIT: Duration = Duration::from_millis(100);

/// Largest single read.
pub(crate) const READ_BYTES: usize = 64 * 1024;

/// Where output comes from.
#[derive(Debug)]
pub enum Source {
    /// A pipe (stdout or stderr).
    Pipe(pipe::Receiver),
    /// A terminal's master end.
    Terminal(Arc<AsyncFd<OwnedFd>>),
}

impl Source {
    /// The next chunk of at most `max` bytes, or `None` at end of file. Cancel-safe.
    pub(crate) async fn read_chunk(&self, max: usize) -> io::Result<Option<Vec<u8>>> {
        loop {
            match self {
                Self::Pipe(pipe) => {
                    pipe.readable().await?;
                    let mut buf = Vec::with_capacity(max);
                    match pipe.try_read_buf(&mut buf) {
                        Ok(0) => return Ok(None),
                        Ok(_) => return Ok(Some(buf)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
                Self::Terminal(fd) => {
                    let mut guard = fd.readable().await?;
                    let mut buf = vec![0u8; max];
                    let read = guard.try_io(|inner| sys::read(inner.get_ref().as_fd(), &mut buf));
                    match read {
                        Err(_would_block) => continue,
                        Ok(Ok(0)) => return Ok(None),
                        Ok(Ok(n)) => {
                            buf.truncate(n);
                            return Ok(Some(buf));
                        }
                        // The last holder of the terminal's other end closed it.
                        Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(None),
                        Ok(Err(e)) => return Err(e),
                    }
                }
            }
        }
    }
}

/// Reads `source` into `record` until it is drained; each chunk also goes to `sink`
/// when there is one (a streaming exec), which applies backpressure to the child.
pub async fn pump(
    record: Arc<ProcessRecord>,
    source: Source,
    stream: Stream,
    sink: Option<mpsc::Sender<OutputChunk>>,
) {
    let mut progress = record.subscribe();
    let mut settled = false;
    loop {
        let exited = progress.borrow_and_update().exit.is_some();
        // An exec's capture may have to wait for the budget before it grows.
        let max = record.next_read_bytes(READ_BYTES).await;
        let next = if settled {
            source.read_chunk(max).await
        } else if exited {
            match tokio::time::timeout(DRAIN_IDLE_AFTER_EXIT, source.read_chunk(max)).await {
                Ok(next) => next,
                Err(_idle) => {
                    record.settle_stream();
                    settled = true;
                    continue;
                }
            }
        } else {
            tokio::select! {
                next = source.read_chunk(max) => next,
                _ = progress.changed() => continue,
            }
        };
        let data = match next {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(pid = %record.pid, ?stream, %error, "reading output failed");
                break;
            }
        };
        let offset = record.push_output(stream, &data);
        if let Some(sink) = &sink {
            // A closed sink means the request went away; keep draining regardless.
            let _ = sink
                .send(OutputChunk {
                    stream,
                    offset,
                    data,
                })
                .await;
        }
    }
    if !settled {
        record.settle_stream();
    }
}
