//! Moves a child's output into its record: one pump per pipe or terminal.
//!
//! A pump allocates its read buffer only once data is ready, so a quiet process
//! costs no buffer memory. It reads until end of file, however long a background
//! grandchild keeps the pipe open (so that grandchild never blocks on a full pipe
//! or dies of `SIGPIPE`). But the stream *settles*, for waiters, at end of file or
//! once it stayed quiet for [`DRAIN_IDLE_AFTER_EXIT`] after the process exited: such
//! a grandchild cannot hold an exec's reply, or a follower, open forever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_protocol::{OutputChunk, Stream};
use tokio::sync::mpsc;

use super::buffers::OUTPUT_BUFFERS;
use super::source::Source;
use super::table::ProcessRecord;

/// How long output may stay silent after the process exits before the pump stops.
pub const DRAIN_IDLE_AFTER_EXIT: Duration = Duration::from_millis(100);

/// Largest single read: a pipe's capacity, less room for the head of the frame it
/// is streamed in, so that frame fits two of the link's `Data` frames of at most
/// 32 KiB (each one write into the virtio-serial port; a full 64 KiB took a third).
pub(crate) const READ_BYTES: usize = 64 * 1024 - 64;

/// Reads `source` into `record` until it is drained; each chunk also goes to `sink`
/// when there is one (a streaming exec), which applies backpressure to the child.
pub async fn pump(
    record: Arc<ProcessRecord>,
    mut source: Source,
    stream: Stream,
    sink: Option<mpsc::Sender<OutputChunk>>,
) {
    let mut progress = record.subscribe();
    let mut settled = false;
    let mut last_read: Option<Instant> = None;
    loop {
        let exited = progress.borrow_and_update().exit.is_some();
        // An exec's capture may have to wait for the budget before it grows.
        let max = record.next_read_bytes(READ_BYTES).await;
        let next = if settled {
            source.read_chunk(max, None).await
        } else if exited {
            match tokio::time::timeout(DRAIN_IDLE_AFTER_EXIT, source.read_chunk(max, None)).await {
                Ok(next) => next,
                Err(_idle) => {
                    record.settle_stream();
                    settled = true;
                    continue;
                }
            }
        } else {
            tokio::select! {
                // Once the process exited, what is left is read at once (above):
                // its exec's reply waits for it.
                next = source.read_chunk(max, last_read) => next,
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
        last_read = Some(Instant::now());
        let offset = record.push_output(stream, &data);
        if let Some(sink) = &sink {
            // A closed sink means the request went away; keep draining regardless.
            // The connection's writer gives the buffer back once it is encoded.
            let _ = sink
                .send(OutputChunk {
                    stream,
                    offset,
                    data,
                })
                .await;
        } else {
            OUTPUT_BUFFERS.give_back(data);
        }
    }
    if !settled {
        record.settle_stream();
    }
}
