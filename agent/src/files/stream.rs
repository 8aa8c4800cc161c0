//! Streamed transfer of files of any size: `put` (client to guest) and `get`.
//!
//! A put's data frames arrive on the connection's reader, which must never wait on a
//! disk, so they go into an unbounded queue whose size the client bounds by honouring
//! the put window; a client that overruns it twice over gets its put failed.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sandbox_protocol::limits::{FILE_CHUNK_BYTES, PUT_WINDOW_BYTES};
use sandbox_protocol::{Event, PutRequest};
use tokio::sync::mpsc;

use super::atomic::AtomicFile;
use super::{absolute_path, display, FileError};
use crate::budget::Charge;
use crate::events::Events;

/// The least a queued put frame counts against the window (see [`PutSender::data`]).
const FRAME_COST_FLOOR_BYTES: u64 = 4096;

/// What the connection forwards to a running put.
#[derive(Debug)]
enum Input {
    /// A chunk, with what it holds of the agent's budget until it is written.
    Data(Vec<u8>, Charge),
    End,
    Overrun,
}

/// The connection's end of a put's input queue.
#[derive(Debug)]
pub struct PutSender {
    tx: mpsc::UnboundedSender<Input>,
    queued: Arc<AtomicU64>,
}

/// The handler's end of a put's input queue.
#[derive(Debug)]
pub struct PutReceiver {
    rx: mpsc::UnboundedReceiver<Input>,
    queued: Arc<AtomicU64>,
}

/// A queue for one put's data.
pub fn put_channel() -> (PutSender, PutReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicU64::new(0));
    (
        PutSender {
            tx,
            queued: queued.clone(),
        },
        PutReceiver { rx, queued },
    )
}

impl PutSender {
    /// Queues a chunk; false once the put is over (or overran its window).
    pub fn data(&self, data: Vec<u8>, charge: Charge) -> bool {
        // Each queued frame costs at least a page: empty `Data` frames must not grow
        // the queue for free.
        let cost = (data.len() as u64).max(FRAME_COST_FLOOR_BYTES);
        let queued = self.queued.fetch_add(cost, Ordering::Relaxed) + cost;
        if queued > 2 * PUT_WINDOW_BYTES {
            let _ = self.tx.send(Input::Overrun);
            return false;
        }
        self.tx.send(Input::Data(data, charge)).is_ok()
    }

    /// Marks the end of the data.
    pub fn end(&self) -> bool {
        self.tx.send(Input::End).is_ok()
    }
}

/// Receives a file and replaces the target atomically once `DataEnd` arrives.
pub async fn put(
    request: PutRequest,
    mut input: PutReceiver,
    events: &Events,
) -> Result<(u64, u32), FileError> {
    let path = absolute_path(&request.path)?;
    let create_path = path.clone();
    let mut file = blocking(move || AtomicFile::create(&create_path, request.mode)).await?;
    loop {
        match input.rx.recv().await {
            Some(Input::Data(data, charge)) => {
                let len = data.len() as u64;
                file = blocking(move || file.write(&data).map(|()| file)).await?;
                drop(charge);
                input
                    .queued
                    .fetch_sub(len.max(FRAME_COST_FLOOR_BYTES), Ordering::Relaxed);
                events.send(Event::Acked(file.written())).await;
            }
            Some(Input::End) => return blocking(move || file.commit()).await,
            Some(Input::Overrun) => {
                return Err(FileError::WindowExceeded {
                    window: PUT_WINDOW_BYTES,
                })
            }
            None => {
                return Err(FileError::Incomplete {
                    path: display(&path),
                })
            }
        }
    }
}

/// Sends a file of any size as `Data` events; returns its size and mode.
pub async fn get(path: &[u8], events: &Events) -> Result<(u64, u32), FileError> {
    let path = absolute_path(path)?;
    let open_path = path.clone();
    let (file, before) = blocking(move || {
        let meta = std::fs::metadata(&open_path)
            .map_err(|error| FileError::io("read", &open_path, error))?;
        if meta.is_dir() {
            return Err(FileError::IsDirectory {
                path: display(&open_path),
            });
        }
        if !meta.is_file() {
            return Err(FileError::NotRegular {
                path: display(&open_path),
            });
        }
        // Non-blocking: the workload may swap a FIFO in after the check above, and a
        // blocking open of a FIFO would hang a blocking-pool thread for good.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(&open_path)
            .map_err(|error| FileError::io("open", &open_path, error))?;
        // What was opened counts, not what the path named a moment before.
        let meta = file
            .metadata()
            .map_err(|error| FileError::io("stat", &open_path, error))?;
        if !meta.is_file() {
            return Err(FileError::NotRegular {
                path: display(&open_path),
            });
        }
        Ok((file, meta))
    })
    .await?;
    let mode = before.permissions().mode() & 0o7777;
    let mut file = file;
    let mut sent = 0u64;
    loop {
        // Charged before it is read (see `crate::budget`). Past the size it had at
        // the start (a file that grew) it is read on in whole chunks.
        let want = match before.len().saturating_sub(sent) {
            0 => FILE_CHUNK_BYTES,
            left => usize::try_from(left).map_or(FILE_CHUNK_BYTES, |l| l.min(FILE_CHUNK_BYTES)),
        };
        // The window first: a charge is never held while waiting for the client.
        events.room_for(want as u64).await;
        let charge = events.budget().reserve_large(want).await;
        let read_path = path.clone();
        let (returned, chunk) = blocking(move || {
            let mut chunk = Vec::with_capacity(want);
            (&mut file)
                .take(want as u64)
                .read_to_end(&mut chunk)
                .map_err(|error| FileError::io("read", &read_path, error))?;
            Ok((file, chunk))
        })
        .await?;
        file = returned;
        if chunk.is_empty() {
            let after = file
                .metadata()
                .map_err(|error| FileError::io("stat", &path, error))?;
            super::check_unchanged(&path, &before, &after, sent)?;
            return Ok((sent, mode));
        }
        sent += chunk.len() as u64;
        if !events.send_charged(Event::Data(chunk), charge).await {
            return Err(FileError::Incomplete {
                path: display(&path),
            });
        }
    }
}

/// Runs blocking file I/O on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| {
            Err(FileError::Io {
                op: "finish",
                path: String::from("(file operation)"),
                error: std::io::Error::other(join.to_string()),
            })
        })
}
