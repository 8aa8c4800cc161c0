//! Files written in parts: `write_file` calls with `offset` and `more: true` feed
//! one streamed `put` that stays open between the calls, so a file of any size
//! reaches the guest while no request line comes near the server's 16 MiB cap.
//!
//! # Design
//! The first part (offset 0) starts [`Client::put`] on a task, reading from a
//! [`PartsReader`]: a channel the later calls send their parts into. Each call
//! returns once its part was taken by the put (so an upload holds about one part in
//! memory here, and the put's window in flight); the last part (`more` false) ends
//! the stream and waits for the agent's answer, and only then does the file appear,
//! atomically, as every `put` makes it. Nothing is staged on the host's disk.
//!
//! An upload that is abandoned (restarted at offset 0, idle for
//! [`UPLOAD_IDLE_SECS`], or its server gone) is dropped: its task is aborted, which
//! drops the request stream, which cancels the put, and the agent removes its
//! temporary file. A put that failed (a full disk, a lost connection) is reported to
//! the next part, with the offset to start again from (0).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use sandbox_vmm::client::ClientError;
use sandbox_vmm::Client;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use sandbox_engine::util::lock;

/// An upload with no part for this long is abandoned.
pub const UPLOAD_IDLE_SECS: u64 = 600;

/// Uploads one server keeps open at once (each holds a request on its sandbox's
/// agent connection, which allows 32).
pub const MAX_UPLOADS: usize = 8;

/// The uploads in progress, by sandbox and path.
#[derive(Debug, Default)]
pub struct Uploads {
    open: Mutex<HashMap<Key, Upload>>,
}

type Key = (String, String);

/// One upload in progress.
#[derive(Debug)]
struct Upload {
    parts: mpsc::Sender<Part>,
    task: JoinHandle<Result<(u64, u32), ClientError>>,
    received: u64,
    touched: Instant,
}

impl Drop for Upload {
    fn drop(&mut self) {
        // Dropping the put's stream cancels it; the agent removes its temp file.
        self.task.abort();
    }
}

/// What a part did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// More parts are expected; this many bytes were received so far.
    Open {
        /// Bytes received, also the next part's offset.
        received: u64,
    },
    /// The file is complete.
    Done {
        /// Its size.
        bytes: u64,
        /// Its permission bits.
        mode: u32,
    },
}

/// Why a part was refused or the upload failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// A part for an offset other than the next one.
    #[error("offset {offset} does not continue the upload of {path}, which has {received} bytes so far: send the part at offset {received}, or start again with offset 0")]
    Gap {
        /// The file.
        path: String,
        /// The part's offset.
        offset: u64,
        /// Bytes received so far.
        received: u64,
    },
    /// A part after the first with no upload in progress.
    #[error("no upload of {path} is in progress (it finished, failed, or was idle for {UPLOAD_IDLE_SECS} s): start it with offset 0 and more: true")]
    NotStarted {
        /// The file.
        path: String,
    },
    /// Too many uploads are open.
    #[error("{MAX_UPLOADS} uploads are in progress already: finish one (its last part has more: false) before starting another")]
    TooMany,
    /// The put failed; the upload is gone.
    #[error("the upload of {path} failed after {received} bytes")]
    Failed {
        /// The file.
        path: String,
        /// Bytes received before.
        received: u64,
        /// What the put said.
        #[source]
        error: ClientError,
    },
}

/// One part of a file.
#[derive(Debug)]
pub struct FilePart<'a> {
    /// The sandbox.
    pub sandbox: &'a str,
    /// The file.
    pub path: &'a str,
    /// Its permission bits (the first part's count).
    pub mode: Option<u32>,
    /// Where the part starts.
    pub offset: u64,
    /// The part.
    pub data: Vec<u8>,
    /// Whether more parts follow.
    pub more: bool,
}

impl Uploads {
    /// Adds `part` to its upload (starting one at offset 0 with `client`); a part
    /// without `more` finishes it.
    pub async fn part(&self, client: &Client, part: FilePart<'_>) -> Result<Outcome, UploadError> {
        let key = (part.sandbox.to_owned(), part.path.to_owned());
        let upload = self.take(&key, client, part.path, part.mode, part.offset)?;
        self.feed(key, upload, part.path, part.data, part.more)
            .await
    }

    /// The upload to continue: a new one at offset 0, else the open one at `offset`.
    fn take(
        &self,
        key: &Key,
        client: &Client,
        path: &str,
        mode: Option<u32>,
        offset: u64,
    ) -> Result<Upload, UploadError> {
        let mut open = lock(&self.open);
        let idle = Duration::from_secs(UPLOAD_IDLE_SECS);
        open.retain(|_, upload| upload.touched.elapsed() < idle && !upload.task.is_finished());
        if offset == 0 {
            open.remove(key);
            if open.len() >= MAX_UPLOADS {
                return Err(UploadError::TooMany);
            }
            return Ok(start(client, path, mode));
        }
        let upload = open.remove(key).ok_or_else(|| UploadError::NotStarted {
            path: path.to_owned(),
        })?;
        if upload.received != offset {
            let received = upload.received;
            open.insert(key.clone(), upload);
            return Err(UploadError::Gap {
                path: path.to_owned(),
                offset,
                received,
            });
        }
        Ok(upload)
    }

    /// Hands `data` to the put, then keeps the upload open or finishes it.
    async fn feed(
        &self,
        key: Key,
        mut upload: Upload,
        path: &str,
        data: Vec<u8>,
        more: bool,
    ) -> Result<Outcome, UploadError> {
        let len = data.len() as u64;
        let (taken_tx, taken) = oneshot::channel();
        let sent = upload.parts.send(Part::Data(data, taken_tx)).await.is_ok();
        // The part is the put's once the reader took it; a put that ended instead
        // (it failed) drops the part, and with it `taken`.
        if !sent || taken.await.is_err() {
            return Err(failure(upload, path).await);
        }
        upload.received += len;
        upload.touched = Instant::now();
        if more {
            let received = upload.received;
            lock(&self.open).insert(key, upload);
            return Ok(Outcome::Open { received });
        }
        if upload.parts.send(Part::End).await.is_err() {
            return Err(failure(upload, path).await);
        }
        let received = upload.received;
        match (&mut upload.task).await {
            Ok(Ok((bytes, mode))) => Ok(Outcome::Done { bytes, mode }),
            Ok(Err(error)) => Err(UploadError::Failed {
                path: path.to_owned(),
                received,
                error,
            }),
            Err(join) => Err(UploadError::Failed {
                path: path.to_owned(),
                received,
                error: ClientError::Local {
                    what: "run the upload".to_owned(),
                    error: io::Error::other(join.to_string()),
                },
            }),
        }
    }
}

/// Starts the put of `path` reading the parts sent to the returned upload.
fn start(client: &Client, path: &str, mode: Option<u32>) -> Upload {
    let (parts, rx) = mpsc::channel(1);
    let client = client.clone();
    let target = path.to_owned();
    let task = tokio::spawn(async move { client.put(&target, mode, PartsReader::new(rx)).await });
    Upload {
        parts,
        task,
        received: 0,
        touched: Instant::now(),
    }
}

/// The error of an upload whose put ended early.
async fn failure(mut upload: Upload, path: &str) -> UploadError {
    let error = match (&mut upload.task).await {
        Ok(Err(error)) => error,
        Ok(Ok(_)) => ClientError::Local {
            what: "finish the upload".to_owned(),
            error: io::Error::other("the put ended before its last part"),
        },
        Err(join) => ClientError::Local {
            what: "run the upload".to_owned(),
            error: io::Error::other(join.to_string()),
        },
    };
    UploadError::Failed {
        path: path.to_owned(),
        received: upload.received,
        error,
    }
}

/// What a `write_file` call hands the put.
#[derive(Debug)]
enum Part {
    /// Bytes, and who to tell once the reader has taken them.
    Data(Vec<u8>, oneshot::Sender<()>),
    /// The last part was sent.
    End,
}

/// The put's source: the parts, in order, then end of file at [`Part::End`]. A
/// channel closed without it (the upload dropped) is an error, so a put is never
/// completed with a file cut short.
#[derive(Debug)]
struct PartsReader {
    rx: mpsc::Receiver<Part>,
    current: Vec<u8>,
    at: usize,
    taken: Option<oneshot::Sender<()>>,
    ended: bool,
}

impl PartsReader {
    fn new(rx: mpsc::Receiver<Part>) -> Self {
        Self {
            rx,
            current: Vec::new(),
            at: 0,
            taken: None,
            ended: false,
        }
    }
}

impl AsyncRead for PartsReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.at < this.current.len() {
                let n = buf.remaining().min(this.current.len() - this.at);
                buf.put_slice(&this.current[this.at..this.at + n]);
                this.at += n;
                if this.at == this.current.len() {
                    this.current = Vec::new();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            // The part is all read: tell its call.
            if let Some(taken) = this.taken.take() {
                let _ = taken.send(());
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Part::Data(data, taken))) => {
                    this.current = data;
                    this.at = 0;
                    this.taken = Some(taken);
                }
                Poll::Ready(Some(Part::End)) => this.ended = true,
                Poll::Ready(None) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upload was abandoned before its last part",
                    )))
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_reader_yields_the_parts_in_order_then_ends() {
        let (tx, rx) = mpsc::channel(1);
        let reader = tokio::spawn(async move {
            let mut out = Vec::new();
            PartsReader::new(rx)
                .read_to_end(&mut out)
                .await
                .map(|_| out)
        });
        for part in [&b"abc"[..], b"", b"defg"] {
            let (taken_tx, taken) = oneshot::channel();
            tx.send(Part::Data(part.to_vec(), taken_tx)).await.unwrap();
            taken.await.expect("each part is acknowledged once read");
        }
        tx.send(Part::End).await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), b"abcdefg");
    }

    #[tokio::test]
    async fn an_abandoned_upload_is_an_error_not_a_short_file() {
        let (tx, rx) = mpsc::channel(1);
        let reader = tokio::spawn(async move {
            let mut out = Vec::new();
            PartsReader::new(rx).read_to_end(&mut out).await
        });
        let (taken_tx, _taken) = oneshot::channel();
        tx.send(Part::Data(b"abc".to_vec(), taken_tx))
            .await
            .unwrap();
        drop(tx);
        let error = reader.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }
}
