//! One client connection: handshake, then many concurrent requests.
//!
//! The reader loop decodes frames and starts one task per request; a writer task owns
//! the write half and batches whatever frames are queued into one write. A request's
//! task is watched by a second task that always sends the final frame, also when the
//! handler was cancelled or panicked, so a client never waits forever. When the
//! connection ends, every request still running is cancelled (an exec's process group
//! is killed; spawned processes and terminals live on). The token is checked once, in
//! the handshake: a `reidentify` that replaces it binds the connections opened after
//! it, and those already served stay served.
//!
//! # Bounds
//! What one connection can make the agent hold is bounded by construction:
//! - before the `Hello`, frames over [`HELLO_FRAME_BYTES`] are refused and the reader
//!   grows its buffer only as bytes arrive, so an unauthenticated peer costs a chunk;
//!   such peers have a table of their own ([`Admissions`]) and never displace a
//!   served connection;
//! - a peer that reads nothing for [`WRITE_STALL`] while frames wait for it is closed,
//!   and a closing connection gives its writer [`WRITER_DRAIN`] at most;
//! - at most [`MAX_REQUESTS_IN_FLIGHT`] requests run at once, each holding its slot
//!   until its final frame is queued (a reply waiting on a slow reader counts); more
//!   get `Busy`;
//! - at most [`WRITE_QUEUE_FRAMES`] frames wait for the socket, and every handler
//!   that produces output waits when they do (backpressure from a slow reader);
//! - every stream (exec output, a follow, `get`) keeps at most
//!   [`STREAM_WINDOW_BYTES`](sandbox_protocol::limits::STREAM_WINDOW_BYTES) of payload
//!   beyond what the client reported consumed ([`Events`]);
//! - across all connections, the bytes held for clients (queued replies and events,
//!   collected exec output, large incoming frames) come from one
//!   [`Budget`](crate::budget::Budget): producers wait for it instead of allocating;
//! - an oversize length prefix loses frame sync: the sender gets `TooLarge` under the
//!   request id it named, and the connection closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_protocol::frame::{Decoded, FrameError};
use sandbox_protocol::limits::{HELLO_FRAME_BYTES, MAX_FRAME_BYTES, MAX_REQUESTS_IN_FLIGHT};
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, ErrorKind, Event, Hello, HelloReply, OutputChunk,
    Request, RequestId, WireError, MAGIC, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::AbortHandle;

use super::admission::{Admission, Full};
use super::dispatch;
use crate::agent::{Agent, AGENT_VERSION};
use crate::budget::{Charge, UNCHARGED_BYTES};
use crate::events::{Events, Outgoing};
use crate::files::stream::{put_channel, PutSender};
use crate::process::buffers::OUTPUT_BUFFERS;

/// How long a client has to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames queued for writing before handlers wait (backpressure from a slow client).
const WRITE_QUEUE_FRAMES: usize = 16;

/// How long the writer may take to drain after the connection ended.
const WRITER_DRAIN: Duration = Duration::from_secs(5);

/// A connection whose socket accepts no byte for this long, while the agent has
/// bytes for it, is closed: its peer stopped reading. (A client that reads slowly is
/// not stalled: stream windows make the agent send only what it consumed.)
const WRITE_STALL: Duration = Duration::from_secs(30);

/// Bytes batched into one write before flushing. Output chunks written from their
/// own buffers (see [`queue_frame`]) are held until then, so a batch is kept near
/// the number the pumps' pool keeps spare (a bigger one left the pumps reading
/// into fresh buffers, every page faulted in anew).
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// How long the writer keeps an encode buffer grown by a batch once its queue is
/// empty: longer than a streaming pipe's read interval (20 ms), so a stream of
/// output reuses one buffer instead of faulting a fresh megabyte in per batch.
const KEEP_BUFFER_WHILE_QUIET: Duration = Duration::from_millis(100);

/// A running request: how to cancel it, where a put's data goes, and where the
/// client's consumption reports go (its stream window).
#[derive(Debug)]
struct Running {
    abort: AbortHandle,
    put: Option<PutSender>,
    consumed: watch::Sender<u64>,
}

type InFlight = Arc<Mutex<HashMap<RequestId, Running>>>;

/// What one served connection keeps besides its running requests.
#[derive(Debug)]
struct ConnState {
    /// Request slots: [`MAX_REQUESTS_IN_FLIGHT`] permits.
    slots: Arc<Semaphore>,
    /// Set by the client's first `Consumed`: from then on its streams keep to the
    /// window (a client that never reports is never made to wait for reports).
    windowed: Arc<std::sync::atomic::AtomicBool>,
}

/// The two tables a connection passes through: unauthenticated connections (before
/// a good `Hello`) and served ones. A peer without the token can only ever displace
/// another peer without it, never a served connection.
#[derive(Debug, Clone)]
pub struct Admissions {
    /// Connections that have not completed the handshake.
    pub pending: Arc<Admission>,
    /// Connections past the handshake.
    pub served: Arc<Admission>,
}

/// Serves one connection until the client closes it, breaks the protocol, stops
/// reading what it is sent, or is evicted to make room (see [`Admission`]).
pub async fn serve<S>(stream: S, agent: Arc<Agent>, admissions: Admissions)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    // Boxed and pinned: a port pipe needs the stream back whole and `Unpin`.
    let (read_half, write_half) = tokio::io::split(Box::pin(stream));
    let mut reader = FrameReader::new(read_half, HELLO_FRAME_BYTES);
    let (tx, rx) = mpsc::channel(WRITE_QUEUE_FRAMES);
    let mut writer = tokio::spawn(write_loop(
        FrameWriter::new(write_half, MAX_FRAME_BYTES),
        rx,
    ));
    let port = serve_connection(&mut reader, &tx, &agent, &admissions).await;
    drop(tx);
    // The writer ends once every request task has sent its last frame; a peer that
    // does not read gets a short grace, then the socket is dropped with the writer.
    let writer = match tokio::time::timeout(WRITER_DRAIN, &mut writer).await {
        Ok(Ok(writer)) => writer,
        Ok(Err(error)) => {
            tracing::error!(%error, "connection writer failed");
            None
        }
        Err(_elapsed) => {
            writer.abort();
            None
        }
    };
    let Some(writer) = writer else {
        return;
    };
    match port {
        Some(PortAsk { id, port }) => {
            // Nothing is in flight and the writer has flushed the hello: from here
            // the connection is the pipe's (see `crate::port`).
            let (read_half, early) = reader.into_parts();
            let stream = read_half.unsplit(writer.into_inner());
            agent.ports.serve(stream, early, id, port).await;
        }
        None => {
            let mut write_half = writer.into_inner();
            let _ = tokio::time::timeout(WRITER_DRAIN, write_half.shutdown()).await;
        }
    }
}

/// A connection whose first request asked to become a port pipe.
#[derive(Debug, Clone, Copy)]
struct PortAsk {
    id: RequestId,
    port: u16,
}

/// The connection's life from the first byte: handshake while pending, then
/// requests while served. Returns when it must close, or with the port its first
/// request asked to become a pipe to.
async fn serve_connection<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    tx: &mpsc::Sender<Outgoing>,
    agent: &Arc<Agent>,
    admissions: &Admissions,
) -> Option<PortAsk> {
    // An unauthenticated connection holds no request slot: always "idle".
    let pending = admissions.pending.admit(Arc::new(Semaphore::new(1)), 1);
    let Ok(pending) = pending else {
        return None;
    };
    let accepted = tokio::select! {
        accepted = handshake(reader, tx, agent) => accepted,
        () = pending.evicted() => {
            tracing::info!("dropped a connection still without a Hello to make room");
            false
        }
        () = tx.closed() => false,
    };
    drop(pending);
    if !accepted {
        return None;
    }
    reader.set_max(MAX_FRAME_BYTES);
    let slots = Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT));
    let ticket = match admissions
        .served
        .admit(slots.clone(), MAX_REQUESTS_IN_FLIGHT)
    {
        Ok(ticket) => ticket,
        Err(Full { max }) => {
            tracing::warn!(max, "refused a connection: every connection is busy");
            notify(
                tx,
                WireError::new(
                    ErrorKind::Busy,
                    format!(
                        "the agent serves {max} connections and each has a request in \
                         flight; try again later"
                    ),
                ),
            );
            return None;
        }
    };
    let in_flight: InFlight = Arc::default();
    // Cancel whatever is still running however this ends.
    let _cancel_on_exit = CancelOnDrop(in_flight.clone());
    let conn = ConnState {
        slots,
        windowed: Arc::default(),
    };
    tokio::select! {
        port = read_loop(reader, tx, agent, &in_flight, &conn) => port,
        () = ticket.evicted() => {
            tracing::info!("closing an idle connection to make room for a new one");
            notify(
                tx,
                WireError::new(
                    ErrorKind::Busy,
                    "closed while idle to make room for a new connection (the agent's \
                     connection limit was reached)",
                ),
            );
            None
        }
        // The writer gave up (the peer stopped reading, or the socket failed).
        () = tx.closed() => None,
    }
}

/// Queues an error about the whole connection (id 0) if there is room; a connection
/// that is closing never waits on a peer that does not read.
fn notify(tx: &mpsc::Sender<Outgoing>, error: WireError) {
    let _ = tx.try_send(Outgoing::uncharged(AgentFrame {
        id: RequestId::CONNECTION,
        msg: AgentMsg::Error(error),
    }));
}

/// Aborts every request still in flight when dropped.
struct CancelOnDrop(InFlight);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let handles: Vec<_> = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (_, running) in handles {
            running.abort.abort();
        }
    }
}

/// Reads and answers the `Hello`; false when the connection must close.
async fn handshake<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    tx: &mpsc::Sender<Outgoing>,
    agent: &Agent,
) -> bool {
    let first = match tokio::time::timeout(HELLO_TIMEOUT, reader.read::<ClientFrame>()).await {
        Err(_elapsed) => Err(WireError::new(ErrorKind::TimedOut, "no Hello within 10 s")),
        Ok(Ok(None)) => return false,
        Ok(Err(error)) => {
            tracing::debug!(%error, "connection failed before the handshake");
            return false;
        }
        Ok(Ok(Some(Decoded::Rejected { error, .. }))) => Err(WireError::new(
            ErrorKind::BadRequest,
            format!("the first frame must be a Hello: {error}"),
        )),
        Ok(Ok(Some(Decoded::Frame(ClientFrame {
            msg: ClientMsg::Hello(hello),
            ..
        })))) => check_hello(&hello, agent),
        Ok(Ok(Some(Decoded::Frame(_)))) => Err(WireError::new(
            ErrorKind::BadRequest,
            "the first frame must be a Hello",
        )),
    };
    let (msg, accepted) = match first {
        Ok(reply) => (AgentMsg::Hello(reply), true),
        Err(error) => {
            tracing::info!(%error, "refused a client");
            (AgentMsg::Error(error), false)
        }
    };
    let sent = tx
        .send(Outgoing::uncharged(AgentFrame {
            id: RequestId::CONNECTION,
            msg,
        }))
        .await
        .is_ok();
    accepted && sent
}

fn check_hello(hello: &Hello, agent: &Agent) -> Result<HelloReply, WireError> {
    if hello.magic != MAGIC {
        return Err(WireError::new(
            ErrorKind::BadRequest,
            "not a sandbox protocol client (bad magic)",
        ));
    }
    if hello.version != PROTOCOL_VERSION {
        return Err(WireError::new(
            ErrorKind::VersionMismatch,
            format!(
                "the agent speaks protocol version {PROTOCOL_VERSION}, the client {}; use a matching client",
                hello.version
            ),
        ));
    }
    if !agent.admits(hello.token.as_deref()) {
        return Err(WireError::new(
            ErrorKind::Unauthorized,
            "missing or wrong token",
        ));
    }
    Ok(HelloReply {
        version: PROTOCOL_VERSION,
        agent_version: AGENT_VERSION.to_owned(),
        boot_id: agent.boot_id.clone(),
        capabilities: agent.capabilities(),
    })
}

async fn read_loop<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    tx: &mpsc::Sender<Outgoing>,
    agent: &Arc<Agent>,
    in_flight: &InFlight,
    conn: &ConnState,
) -> Option<PortAsk> {
    let mut first = true;
    loop {
        if tx.is_closed() {
            // The writer failed: nothing more can be answered.
            return None;
        }
        let (decoded, charge) = match read_admitted(reader, &agent.budget).await {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(error) => {
                tracing::debug!(%error, "connection closed");
                return None;
            }
        };
        let was_first = std::mem::replace(&mut first, false);
        let reject = match decoded {
            // A frame that does not decode breaks the request it was meant for.
            Decoded::Rejected { id, error } => Some((
                id.unwrap_or(RequestId::CONNECTION),
                frame_error(&error),
                Breaks::Request,
            )),
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Request(Request::PortForward(ask)),
            }) if was_first && id != RequestId::CONNECTION => {
                return Some(PortAsk { id, port: ask.port });
            }
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Request(request),
            }) => start_request(id, request, charge, tx, agent, in_flight, conn)
                .err()
                .map(|error| (id, error, Breaks::Nothing)),
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Cancel,
            }) => {
                // Unknown ids are fine: the request may have just finished.
                if let Some(running) = in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&id)
                {
                    running.abort.abort();
                }
                None
            }
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Data(data),
            }) => {
                forward_put_data(in_flight, id, |put| put.data(data, charge));
                None
            }
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::DataEnd,
            }) => {
                forward_put_data(in_flight, id, PutSender::end);
                None
            }
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Consumed(bytes),
            }) => {
                // The client reports: hold this connection's streams to the window.
                conn.windowed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // Unknown ids are fine: the stream may have just ended.
                if let Some(running) = in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&id)
                {
                    running.consumed.send_if_modified(|consumed| {
                        let grew = bytes > *consumed;
                        *consumed = (*consumed).max(bytes);
                        grew
                    });
                }
                None
            }
            Decoded::Frame(ClientFrame {
                id,
                msg: ClientMsg::Hello(_),
            }) => Some((
                id,
                WireError::new(
                    ErrorKind::BadRequest,
                    "Hello is only valid as the first frame",
                ),
                Breaks::Nothing,
            )),
        };
        if let Some((id, error, breaks)) = reject {
            tracing::debug!(%id, %error, "rejected a frame");
            let (id, error) = final_frame_target(id, error, breaks, in_flight);
            if tx
                .send(Outgoing::uncharged(AgentFrame {
                    id,
                    msg: AgentMsg::Error(error),
                }))
                .await
                .is_err()
            {
                return None;
            }
        }
    }
}

/// The next frame, with a charge from `budget` for its bytes when it is large: taken
/// once its length prefix is in and before its body is read, so many connections
/// sending large frames at once wait for the budget instead of each holding up to
/// [`MAX_FRAME_BYTES`] of buffer. Cancel safe, like [`FrameReader::read`].
async fn read_admitted<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    budget: &crate::budget::Budget,
) -> std::io::Result<Option<(Decoded<ClientFrame>, Charge)>> {
    let mut charge = Charge::none();
    loop {
        if let Some(decoded) = reader.next_buffered()? {
            return Ok(Some((decoded, charge)));
        }
        if let Some(len) = reader.announced_len() {
            if len >= UNCHARGED_BYTES && charge.bytes() == 0 {
                charge = budget.reserve(len.min(MAX_FRAME_BYTES)).await;
            }
        }
        if !reader.fill().await? {
            return Ok(None);
        }
    }
}

/// Whether a rejected frame breaks the running request that has its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breaks {
    /// The frame was that request's own data: the request cannot go on.
    Request,
    /// The frame was a mistake of its own (a reused id, a late Hello).
    Nothing,
}

/// Where an error about a frame goes. Every request gets exactly one final frame,
/// so an error about a frame whose id belongs to a running request cannot be sent
/// under that id: it goes under id 0 (connection level) and names the id instead.
/// The running request is cancelled when the broken frame was meant for it (put
/// data that did not decode): its watcher then sends its one final frame.
fn final_frame_target(
    id: RequestId,
    error: WireError,
    breaks: Breaks,
    in_flight: &InFlight,
) -> (RequestId, WireError) {
    let requests = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(running) = requests.get(&id) else {
        return (id, error);
    };
    if breaks == Breaks::Request {
        running.abort.abort();
    }
    let message = format!("frame for running request {id}: {}", error.message);
    (RequestId::CONNECTION, WireError { message, ..error })
}

/// Hands put data to its request. Data for an id that is not a running put is
/// dropped: that put already failed and got its final error.
fn forward_put_data(in_flight: &InFlight, id: RequestId, send: impl FnOnce(&PutSender) -> bool) {
    let mut requests = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    match requests.get_mut(&id) {
        Some(Running {
            put: put @ Some(_), ..
        }) => {
            if !put.as_ref().is_some_and(send) {
                *put = None;
            }
        }
        _ => tracing::debug!(%id, "dropped data for a request that takes none"),
    }
}

/// The wire error for a frame that could not be decoded.
fn frame_error(error: &FrameError) -> WireError {
    let kind = match error {
        FrameError::TooLarge { .. } => ErrorKind::TooLarge,
        error if error.is_unknown_variant() => ErrorKind::Unsupported,
        _ => ErrorKind::BadRequest,
    };
    let hint = if kind == ErrorKind::Unsupported {
        " (a request this agent does not know; is the client newer?)"
    } else {
        ""
    };
    WireError::new(kind, format!("{error}{hint}"))
}

fn start_request(
    id: RequestId,
    request: Request,
    charge: Charge,
    tx: &mpsc::Sender<Outgoing>,
    agent: &Arc<Agent>,
    in_flight: &InFlight,
    conn: &ConnState,
) -> Result<(), WireError> {
    if id == RequestId::CONNECTION {
        return Err(WireError::new(
            ErrorKind::BadRequest,
            "request id 0 is reserved",
        ));
    }
    let mut requests = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    if requests.contains_key(&id) {
        return Err(WireError::new(
            ErrorKind::BadRequest,
            format!("request id {id} is already in flight"),
        ));
    }
    let Ok(slot) = conn.slots.clone().try_acquire_owned() else {
        return Err(WireError::new(
            ErrorKind::Busy,
            format!(
                "{MAX_REQUESTS_IN_FLIGHT} requests are already in flight on this connection; \
                 send more when one has finished"
            ),
        ));
    };
    let (consumed, consumed_rx) = watch::channel(0);
    let events = Events::new(
        id,
        tx.clone(),
        agent.budget.clone(),
        consumed_rx,
        conn.windowed.clone(),
    );
    // The request's own bytes (a write_file's content, an exec's stdin) stay charged
    // while it runs.
    events.hold(charge);
    let held = events.clone();
    let handler_agent = agent.clone();
    let (put, input) = match request {
        Request::Put(_) => {
            let (sender, receiver) = put_channel();
            (Some(sender), Some(receiver))
        }
        _ => (None, None),
    };
    let handler =
        tokio::spawn(
            async move { dispatch::handle(&handler_agent, request, &events, input).await },
        );
    requests.insert(
        id,
        Running {
            abort: handler.abort_handle(),
            put,
            consumed,
        },
    );
    drop(requests);

    let tx = tx.clone();
    let in_flight = in_flight.clone();
    tokio::spawn(async move {
        let msg = match handler.await {
            Ok(Ok(reply)) => AgentMsg::Reply(reply),
            Ok(Err(error)) => AgentMsg::Error(error),
            Err(join) if join.is_cancelled() => {
                AgentMsg::Error(WireError::new(ErrorKind::Cancelled, "request cancelled"))
            }
            Err(join) => AgentMsg::Error(panic_error(id, join.into_panic())),
        };
        in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        let charge = reply_charge(&held, &msg).await;
        let _ = tx
            .send(Outgoing {
                frame: AgentFrame { id, msg },
                charge,
            })
            .await;
        // The slot is free only once the reply is queued: a reply waiting on a slow
        // reader still counts against the connection.
        drop(slot);
    });
    Ok(())
}

/// The error a request whose handler panicked gets. Most panics are bugs; one is
/// not: tokio panics when it cannot start a blocking-pool thread ("OS can't spawn
/// worker thread: Resource temporarily unavailable"), which a guest at its pid or
/// thread limit causes for any request that reads a file (`cat` answered
/// "internal ... (a bug)" under pid exhaustion). That one is `Busy`.
fn panic_error(id: RequestId, payload: Box<dyn std::any::Any + Send>) -> WireError {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    if text.contains("can't spawn") || text.contains("os error 11") {
        tracing::warn!(%id, panic = text, "no thread for a request: the guest is at its process limit");
        return WireError::new(
            ErrorKind::Busy,
            "the agent could not start a thread (the guest is out of processes or threads: EAGAIN); try again once some exit",
        );
    }
    tracing::error!(%id, "request handler panicked");
    WireError::new(
        ErrorKind::Internal,
        "the request failed inside the agent (a bug); the agent goes on",
    )
}

/// Final replies built without a charge ahead (a directory listing, `ps`) are charged
/// from this size on.
const UNCHARGED_REPLY_BYTES: usize = 256 * 1024;

/// What a final frame holds of the budget: the handler's charges (made before it
/// read what it replies), and for a large reply built without one, a charge for
/// its payload, waited for here so that it queues only within the budget.
async fn reply_charge(events: &Events, msg: &AgentMsg) -> Charge {
    let mut charge = events.take_held();
    let payload = match msg {
        AgentMsg::Reply(reply) => reply_payload_bytes(reply),
        _ => 0,
    };
    // Wait only while holding nothing: a handler that charged ahead (and whose
    // reply came out a little larger, say a file that grew) goes on. Replies under
    // `UNCHARGED_REPLY_BYTES` never wait, so `ps` and its like are answered while
    // large transfers wait for the budget.
    if payload >= UNCHARGED_REPLY_BYTES && charge.bytes() == 0 {
        charge = events.budget().reserve(payload).await;
    }
    charge
}

/// The bytes a reply carries beyond its fixed fields, roughly.
fn reply_payload_bytes(reply: &sandbox_protocol::Reply) -> usize {
    use sandbox_protocol::Reply;
    match reply {
        Reply::Exec(exec) => exec.stdout.len() + exec.stderr.len(),
        Reply::File(data) => data.len(),
        Reply::Logs(logs) => logs.batch.chunks.iter().map(|c| c.data.len()).sum(),
        Reply::Dir(entries) => entries.iter().map(|e| e.name.len() + 32).sum(),
        Reply::Ps(rows) => rows
            .iter()
            .map(|r| r.argv.iter().map(|a| a.len() + 8).sum::<usize>() + 32)
            .sum(),
        Reply::PsDetail(rows) => rows
            .iter()
            .map(|r| r.info.argv.iter().map(|a| a.len() + 8).sum::<usize>() + 64)
            .sum(),
        _ => 0,
    }
}

/// Writes queued frames, batching them; a frame too large to encode becomes an error.
/// Each frame's charge is given back once its bytes are written.
/// Writes queued frames until the queue closes, then gives the writer back (its
/// caller shuts the stream down, or hands it to a port pipe); `None` after a failed
/// write.
async fn write_loop<W: AsyncWrite + Send>(
    mut writer: FrameWriter<WriteHalf<W>>,
    mut rx: mpsc::Receiver<Outgoing>,
) -> Option<FrameWriter<WriteHalf<W>>> {
    let mut written: Vec<Charge> = Vec::with_capacity(WRITE_QUEUE_FRAMES);
    // Each frame is dropped once encoded: while a slow client is written to, only
    // the encoded bytes (which its charge covers) are held, not the frame as well.
    while let Some(Outgoing { frame, charge }) = next_outgoing(&mut writer, &mut rx).await {
        queue_frame(&mut writer, frame);
        written.push(charge);
        let mut batched = 1;
        while batched < WRITE_QUEUE_FRAMES {
            match rx.try_recv() {
                Ok(Outgoing { frame, charge }) => {
                    queue_frame(&mut writer, frame);
                    written.push(charge);
                    batched += 1;
                }
                Err(_) => break,
            }
            if writer.queued_bytes() >= WRITE_BATCH_BYTES {
                break;
            }
        }
        let flushed = tokio::time::timeout(WRITE_STALL, writer.flush_keeping_buffer())
            .await
            .unwrap_or_else(|_elapsed| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client has read nothing for 30 s",
                ))
            });
        // The frames' bytes are written (or lost with the connection).
        written.clear();
        for data in writer.spent_tails() {
            OUTPUT_BUFFERS.give_back(data);
        }
        if let Err(error) = flushed {
            tracing::debug!(%error, "writing to the client failed");
            // Dropping the queue makes every later send fail at once: handlers stop
            // instead of blocking, and the reader stops taking requests that could
            // never be answered (the socket may still hold many).
            return None;
        }
    }
    Some(writer)
}

/// The next frame to write; once the queue stayed empty for
/// [`KEEP_BUFFER_WHILE_QUIET`], the encode buffer is given back before waiting on.
async fn next_outgoing<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    rx: &mut mpsc::Receiver<Outgoing>,
) -> Option<Outgoing> {
    match tokio::time::timeout(KEEP_BUFFER_WHILE_QUIET, rx.recv()).await {
        Ok(next) => next,
        Err(_quiet) => {
            writer.give_back_buffer();
            rx.recv().await
        }
    }
}

/// Queues `frame` for the next flush. A big output chunk's bytes are written from
/// its own buffer after the frame's head (one copy fewer per byte of a streamed
/// exec), which goes back to the pumps once written; other frames are encoded
/// whole, and an output chunk's buffer goes back at once.
fn queue_frame<W: AsyncWrite + Unpin>(writer: &mut FrameWriter<W>, frame: AgentFrame) {
    match frame.msg {
        AgentMsg::Event(Event::Output(mut chunk)) if chunk.data.len() >= WRITTEN_APART_BYTES => {
            let head = AgentFrame {
                id: frame.id,
                msg: AgentMsg::Event(Event::Output(OutputChunk {
                    stream: chunk.stream,
                    offset: chunk.offset,
                    data: Vec::new(),
                })),
            };
            match writer.queue_with_tail(&head, std::mem::take(&mut chunk.data)) {
                Ok(()) => {}
                Err((_, data)) => {
                    chunk.data = data;
                    let frame = AgentFrame {
                        id: frame.id,
                        msg: AgentMsg::Event(Event::Output(chunk)),
                    };
                    queue(writer, &frame);
                    recycle(frame);
                }
            }
        }
        msg => {
            let frame = AgentFrame { id: frame.id, msg };
            queue(writer, &frame);
            recycle(frame);
        }
    }
}

/// Output chunks at least this big are written from their own buffer (see
/// [`queue_frame`]); a smaller one costs less to copy than a piece of a vectored write.
const WRITTEN_APART_BYTES: usize = 4 * 1024;

/// Drops an encoded frame, giving an output chunk's buffer back to the pumps.
fn recycle(frame: AgentFrame) {
    if let AgentMsg::Event(Event::Output(chunk)) = frame.msg {
        OUTPUT_BUFFERS.give_back(chunk.data);
    }
}

fn queue<W: AsyncWrite + Unpin>(writer: &mut FrameWriter<W>, frame: &AgentFrame) {
    if let Err(error) = writer.queue(frame) {
        tracing::error!(id = %frame.id, %error, "cannot encode a reply");
        let fallback = AgentFrame {
            id: frame.id,
            msg: AgentMsg::Error(WireError::new(
                ErrorKind::TooLarge,
                format!("the reply cannot be sent: {error}"),
            )),
        };
        if let Err(error) = writer.queue(&fallback) {
            tracing::error!(%error, "cannot encode an error reply");
        }
    }
}

#[cfg(test)]
mod tests {
    use sandbox_protocol::{ReidentifyRequest, Reply};
    use tokio::io::DuplexStream;

    use super::*;
    use crate::server::admission::Admission;

    /// Regression (issue 22, item 9): a request that found no thread under pid
    /// exhaustion came back as "internal ... (a bug)".
    #[test]
    fn a_thread_spawn_failure_is_busy_and_other_panics_are_internal() {
        let eagain = "OS can't spawn worker thread: Resource temporarily unavailable (os error 11)";
        let busy = panic_error(RequestId(1), Box::new(eagain.to_owned()));
        assert_eq!(busy.kind, ErrorKind::Busy, "{busy}");
        let bug = panic_error(RequestId(2), Box::new("index out of bounds"));
        assert_eq!(bug.kind, ErrorKind::Internal, "{bug}");
    }

    /// A client end of an in-memory connection to `agent`, served by [`serve`].
    struct Peer {
        reader: FrameReader<tokio::io::ReadHalf<DuplexStream>>,
        writer: FrameWriter<WriteHalf<DuplexStream>>,
    }

    impl Peer {
        fn connect(agent: &Arc<Agent>, admissions: &Admissions) -> Self {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(serve(theirs, agent.clone(), admissions.clone()));
            let (read_half, write_half) = tokio::io::split(ours);
            Self {
                reader: FrameReader::new(read_half, MAX_FRAME_BYTES),
                writer: FrameWriter::new(write_half, MAX_FRAME_BYTES),
            }
        }

        async fn send(&mut self, id: u64, msg: ClientMsg) {
            let frame = ClientFrame {
                id: RequestId(id),
                msg,
            };
            self.writer.write(&frame).await.unwrap();
        }

        async fn answer(&mut self) -> AgentFrame {
            match self.reader.read::<AgentFrame>().await.unwrap() {
                Some(Decoded::Frame(frame)) => frame,
                other => panic!("no frame from the agent: {other:?}"),
            }
        }

        /// Sends a `Hello` with `token`; the agent's answer.
        async fn hello(&mut self, token: &str) -> AgentMsg {
            self.send(0, ClientMsg::Hello(Hello::new(Some(token.to_owned()))))
                .await;
            self.answer().await.msg
        }

        /// Sends `request` under `id`; its final answer.
        async fn call(&mut self, id: u64, request: Request) -> AgentMsg {
            self.send(id, ClientMsg::Request(request)).await;
            let frame = self.answer().await;
            assert_eq!(frame.id, RequestId(id));
            frame.msg
        }
    }

    fn admissions() -> Admissions {
        Admissions {
            pending: Admission::new(4),
            served: Admission::new(4),
        }
    }

    #[tokio::test]
    async fn a_new_token_applies_to_new_connections_only() {
        let agent = Arc::new(Agent::new(
            Duration::from_secs(60),
            Some("old".into()),
            false,
        ));
        let admissions = admissions();
        let mut first = Peer::connect(&agent, &admissions);
        assert!(matches!(first.hello("old").await, AgentMsg::Hello(_)));
        let mut second = Peer::connect(&agent, &admissions);
        assert!(matches!(second.hello("old").await, AgentMsg::Hello(_)));

        let reidentify = Request::Reidentify(ReidentifyRequest {
            hostname: None,
            token: Some("new".into()),
        });
        assert_eq!(
            first.call(1, reidentify).await,
            AgentMsg::Reply(Reply::Done)
        );

        // Both connections authenticated under the old token are still served.
        for peer in [&mut first, &mut second] {
            assert!(matches!(
                peer.call(2, Request::Ps).await,
                AgentMsg::Reply(Reply::Ps(_))
            ));
        }
        // A new connection with the old token is refused, one with the new accepted.
        let mut stale = Peer::connect(&agent, &admissions);
        match stale.hello("old").await {
            AgentMsg::Error(error) => assert_eq!(error.kind, ErrorKind::Unauthorized),
            other => panic!("the old token was accepted: {other:?}"),
        }
        let mut fresh = Peer::connect(&agent, &admissions);
        assert!(matches!(fresh.hello("new").await, AgentMsg::Hello(_)));
        assert!(matches!(
            fresh.call(1, Request::Ps).await,
            AgentMsg::Reply(Reply::Ps(_))
        ));
    }

    #[tokio::test]
    async fn a_refused_reidentify_keeps_the_old_token() {
        let agent = Arc::new(Agent::new(
            Duration::from_secs(60),
            Some("old".into()),
            false,
        ));
        let admissions = admissions();
        let mut peer = Peer::connect(&agent, &admissions);
        assert!(matches!(peer.hello("old").await, AgentMsg::Hello(_)));
        let empty = Request::Reidentify(ReidentifyRequest {
            hostname: None,
            token: Some(String::new()),
        });
        match peer.call(1, empty).await {
            AgentMsg::Error(error) => assert_eq!(error.kind, ErrorKind::BadRequest),
            other => panic!("an empty token was accepted: {other:?}"),
        }
        let mut again = Peer::connect(&agent, &admissions);
        assert!(matches!(again.hello("old").await, AgentMsg::Hello(_)));
    }
}
