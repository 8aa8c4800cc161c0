//! The stdio front: a line filter between the real stdin/stdout and rmcp, so that
//! every request gets an answer and a closed stdin is seen at once.
//!
//! rmcp 3.11 reads stdio itself, and it drops a line over its cap (16 MiB) and a line
//! that is not JSON without any reply, so the client waits forever for the answer
//! to that request. And it only notices the end of stdin as the end of its own
//! read loop, then gives in-flight calls time to drain.
//!
//! # Data flow
//! ```text
//! stdin ─► filter task ─► in-memory pipe ─► rmcp (AsyncRwTransport) ─┐
//!              │ error responses                                       │ responses
//!              └────────────► channel ─► writer task ◄─ in-memory pipe ◄┘
//!                                            │
//!                                            ▼ stdout
//! ```
//! - The filter (`filter`) reads stdin line by line and never holds more than
//!   [`MAX_LINE_BYTES`] of one line: past that, the rest of the line is read and
//!   thrown away as it streams, while a small scan ([`scan`]) picks the request's
//!   `id` out of it. Each line then gets the fate [`line::classify`] decides:
//!   forwarded to rmcp, answered with a JSON-RPC error, or logged and dropped.
//! - The writer (`write_out`) is the only thing that writes stdout: rmcp's output
//!   and the filter's error responses pass through it whole line by whole line, so
//!   they never interleave.
//! - When stdin ends, [`Front::closed`] resolves; the server cancels rmcp and
//!   destroys the VMs without waiting for anything else (see `crate::run`).

pub mod line;
pub mod scan;

use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::RoleServer;
use sandbox_protocol::limits::{FILE_CHUNK_BYTES, MAX_FRAME_BYTES};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream, ReadHalf,
    WriteHalf,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use self::line::Verdict;
use self::scan::IdScan;

/// Longest JSON-RPC message (one line, without its line ending) the server reads.
///
/// Four times the agent's frame limit ([`MAX_FRAME_BYTES`], 4 MiB). An `exec`'s
/// stdin travels in one such frame, so no useful `exec` is larger than it plus its
/// JSON string escaping, which this leaves room for even when it doubles every
/// byte; a `write_file` streams, and a larger file goes in parts of
/// [`ADVISED_PART_BYTES`]. It also bounds what one line can make the server hold in
/// memory (the line, then its parse). It equals rmcp's own default cap, and the
/// transport is given this plus one for the newline, so every line forwarded is one
/// rmcp reads.
pub const MAX_LINE_BYTES: usize = 4 * MAX_FRAME_BYTES;

/// The part size the too-large answer advises for `write_file` in parts: four file
/// chunks ([`FILE_CHUNK_BYTES`], 1 MiB each), so a part is whole chunks of the
/// `put`, and even base64 (4/3) with JSON escaping stays far inside the line cap.
pub const ADVISED_PART_BYTES: usize = 4 * FILE_CHUNK_BYTES;

/// Buffer of each direction of the in-memory pipe to rmcp. Lines stream through it,
/// so it bounds only how far one side can run ahead of the other.
const PIPE_BYTES: usize = 64 * 1024;

/// A line buffer grown past this by one big message is released afterwards, so a
/// single large `write_file` does not pin 16 MiB for the rest of the session.
const KEEP_LINE_BUFFER_BYTES: usize = 1024 * 1024;

/// Error responses waiting for the writer; the filter waits when it is full, so a
/// client that sends garbage and never reads cannot grow the queue.
const REPLY_QUEUE: usize = 16;

/// The rmcp side of the front: a transport over the in-memory pipe.
pub type Transport = AsyncRwTransport<RoleServer, ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

/// The running filter and writer tasks; both stop when this is dropped.
#[derive(Debug)]
pub struct Front {
    closed: watch::Receiver<bool>,
    filter: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Front {
    /// Starts the filter on `input` and the writer on `output`, and returns the
    /// transport for rmcp to serve. Must be called inside the runtime.
    pub fn start<R, W>(input: R, output: W) -> (Self, Transport)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (rmcp_side, front_side) = tokio::io::duplex(PIPE_BYTES);
        let (rmcp_read, rmcp_write) = tokio::io::split(rmcp_side);
        let (from_rmcp, to_rmcp) = tokio::io::split(front_side);
        let (replies_tx, replies_rx) = mpsc::channel(REPLY_QUEUE);
        let (closed_tx, closed) = watch::channel(false);
        let filter = tokio::spawn(filter(input, to_rmcp, replies_tx, closed_tx));
        let writer = tokio::spawn(write_out(from_rmcp, replies_rx, output));
        let transport = AsyncRwTransport::new_server(rmcp_read, rmcp_write)
            .with_max_line_length(MAX_LINE_BYTES + 1);
        (
            Self {
                closed,
                filter,
                writer,
            },
            transport,
        )
    }

    /// Resolves once stdin has ended (the client closed it or died) or failed.
    pub async fn closed(&mut self) {
        // An error means the filter task is gone (ended or panicked): stdin is not
        // read any more either way.
        let _ = self.closed.wait_for(|closed| *closed).await;
    }

    /// Whether stdin has ended.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.filter.abort();
        self.writer.abort();
    }
}

/// How reading one line ended.
enum Read {
    /// A whole line is in the buffer (without its `\n`).
    Line,
    /// The line was longer than [`MAX_LINE_BYTES`] and was discarded; `bytes` is its
    /// length without the `\n`.
    Oversize {
        bytes: u64,
        scan: IdScan,
    },
    /// stdin ended. A last line without a newline is dropped: its sender is gone.
    Eof,
    Failed(std::io::Error),
}

/// stdin as lines of at most [`MAX_LINE_BYTES`].
struct Lines<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(input: R) -> Self {
        Self {
            reader: BufReader::with_capacity(PIPE_BYTES, input),
            line: Vec::new(),
        }
    }

    /// Reads the next line. The buffer only grows while the line is within the cap:
    /// the first chunk that would take it past the cap switches to discarding, and
    /// from then on each chunk is only scanned for the id and consumed.
    async fn next(&mut self) -> Read {
        if self.line.capacity() > KEEP_LINE_BUFFER_BYTES {
            self.line = Vec::new();
        }
        self.line.clear();
        let mut oversize: Option<(u64, IdScan)> = None;
        loop {
            let available = match self.reader.fill_buf().await {
                Ok([]) => return Read::Eof,
                Ok(available) => available,
                Err(error) => return Read::Failed(error),
            };
            let newline = available.iter().position(|&byte| byte == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            if let Some((bytes, scan)) = oversize.as_mut() {
                scan.feed(chunk);
                *bytes += chunk.len() as u64;
            } else if self.line.len() + chunk.len() > MAX_LINE_BYTES {
                let mut scan = IdScan::default();
                scan.feed(&self.line);
                scan.feed(chunk);
                let bytes = (self.line.len() + chunk.len()) as u64;
                self.line = Vec::new();
                oversize = Some((bytes, scan));
            } else {
                self.line.extend_from_slice(chunk);
            }
            let consumed = newline.map_or(available.len(), |at| at + 1);
            self.reader.consume(consumed);
            if newline.is_some() {
                return match oversize {
                    Some((bytes, scan)) => Read::Oversize { bytes, scan },
                    None => Read::Line,
                };
            }
        }
    }
}

/// Reads stdin until it ends, handing each line to rmcp or answering it. Returns
/// when stdin ends or fails, or rmcp stops reading; then sets `closed`.
async fn filter<R>(
    input: R,
    mut to_rmcp: WriteHalf<DuplexStream>,
    replies: mpsc::Sender<Vec<u8>>,
    closed: watch::Sender<bool>,
) where
    R: AsyncRead + Unpin,
{
    let mut lines = Lines::new(input);
    loop {
        match lines.next().await {
            Read::Line => match line::classify(&lines.line) {
                Verdict::Blank => {}
                Verdict::Forward(message) => {
                    if let Err(error) = forward(&mut to_rmcp, message).await {
                        tracing::warn!(%error, "the MCP service stopped reading its input");
                        break;
                    }
                }
                Verdict::Reply(reply) => {
                    tracing::warn!(
                        bytes = lines.line.len(),
                        reply = %String::from_utf8_lossy(reply.trim_ascii_end()),
                        "answered a malformed message with an error"
                    );
                    // The writer is gone only when stdout is; then nobody reads it.
                    let _ = replies.send(reply).await;
                }
                Verdict::Drop(why) => {
                    tracing::warn!(bytes = lines.line.len(), %why, "dropped a malformed message");
                }
            },
            Read::Oversize { bytes, scan } => {
                tracing::warn!(
                    bytes,
                    limit = MAX_LINE_BYTES,
                    id = ?scan.id(),
                    notification = scan.is_notification(),
                    "discarded a message over the line limit"
                );
                if let Some(reply) = line::too_large(&scan, bytes) {
                    let _ = replies.send(reply).await;
                }
            }
            Read::Eof => {
                tracing::info!("stdin closed");
                break;
            }
            Read::Failed(error) => {
                tracing::warn!(%error, "cannot read stdin");
                break;
            }
        }
    }
    // Set before rmcp sees the end of its input, so that a handshake failing on it
    // is known to be a disconnect.
    let _ = closed.send(true);
    let _ = to_rmcp.shutdown().await;
}

async fn forward(to_rmcp: &mut WriteHalf<DuplexStream>, message: &[u8]) -> std::io::Result<()> {
    to_rmcp.write_all(message).await?;
    to_rmcp.write_all(b"\n").await
}

/// The only writer of stdout: copies rmcp's output and the filter's error responses
/// to it one whole line at a time. Ends when both sources have ended, or stdout
/// fails (the client is gone; dropping the pipe then fails rmcp's writes).
async fn write_out<W>(
    from_rmcp: ReadHalf<DuplexStream>,
    mut replies: mpsc::Receiver<Vec<u8>>,
    mut output: W,
) where
    W: AsyncWrite + Unpin,
{
    let mut from_rmcp = BufReader::with_capacity(PIPE_BYTES, from_rmcp);
    let mut pending = Vec::new();
    let (mut rmcp_open, mut replies_open) = (true, true);
    while rmcp_open || replies_open {
        let line = tokio::select! {
            // Cancel-safe: when the other branch wins, the bytes read so far stay in
            // `pending` and the next call continues the same line.
            read = from_rmcp.read_until(b'\n', &mut pending), if rmcp_open => match read {
                Ok(_) if pending.ends_with(b"\n") => std::mem::take(&mut pending),
                // The end of rmcp's output (after a last line rmcp never ended).
                Ok(_) => {
                    rmcp_open = false;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the MCP service's output");
                    rmcp_open = false;
                    continue;
                }
            },
            reply = replies.recv(), if replies_open => match reply {
                Some(reply) => reply,
                None => {
                    replies_open = false;
                    continue;
                }
            },
        };
        let written = match output.write_all(&line).await {
            Ok(()) => output.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = written {
            tracing::info!(%error, "stdout closed");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn lines_of(input: &[u8]) -> Vec<Result<Vec<u8>, (u64, Option<serde_json::Value>)>> {
        let mut lines = Lines::new(input);
        let mut out = Vec::new();
        loop {
            match lines.next().await {
                Read::Line => out.push(Ok(lines.line.clone())),
                Read::Oversize { bytes, scan } => out.push(Err((bytes, scan.id().cloned()))),
                Read::Eof => return out,
                Read::Failed(error) => panic!("{error}"),
            }
        }
    }

    #[tokio::test]
    async fn an_oversize_line_is_discarded_and_the_next_line_still_read() {
        let mut input = br#"{"id":3,"params":""#.to_vec();
        input.resize(MAX_LINE_BYTES + 10, b'a');
        input.extend_from_slice(b"\"}\nnext\n");
        let read = lines_of(&input).await;
        let bytes = (MAX_LINE_BYTES + 12) as u64;
        assert_eq!(
            read,
            [
                Err((bytes, Some(serde_json::json!(3)))),
                Ok(b"next".to_vec())
            ]
        );
    }

    #[tokio::test]
    async fn a_line_at_the_limit_is_kept_and_an_unended_last_line_dropped() {
        let mut input = vec![b'x'; MAX_LINE_BYTES];
        input.extend_from_slice(b"\n\nlast");
        let read = lines_of(&input).await;
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].as_ref().map(Vec::len), Ok(MAX_LINE_BYTES));
        assert_eq!(read[1], Ok(Vec::new()));
    }

    /// Regression: rmcp answered nothing to a line that is not JSON. The answer and
    /// rmcp's own traffic share stdout as whole lines; the end of stdin is reported.
    #[tokio::test]
    async fn garbage_is_answered_and_valid_lines_reach_rmcp() {
        let (mut client_stdin, server_stdin) = tokio::io::duplex(1024);
        let (server_stdout, mut client_stdout) = tokio::io::duplex(1024);
        let (mut front, mut transport) = Front::start(server_stdin, server_stdout);
        client_stdin.write_all(b"garbage\n\n").await.unwrap();
        client_stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n")
            .await
            .unwrap();
        let received = rmcp::transport::Transport::<RoleServer>::receive(&mut transport)
            .await
            .expect("the ping reaches rmcp");
        let rmcp::model::JsonRpcMessage::Request(request) = received else {
            panic!("not a request: {received:?}");
        };
        assert_eq!(request.id, rmcp::model::NumberOrString::Number(1));
        drop(client_stdin);
        tokio::time::timeout(std::time::Duration::from_secs(5), front.closed())
            .await
            .expect("the end of stdin is reported");
        assert!(front.is_closed());
        drop(transport);
        let mut out = String::new();
        client_stdout.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let reply: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(reply["error"]["code"], -32700);
        assert_eq!(reply["id"], serde_json::Value::Null);
    }
}
