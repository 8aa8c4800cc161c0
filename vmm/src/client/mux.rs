//! One connection, many requests: the writer task, the reader task that routes each
//! agent frame to its request by id, and the table of pending requests.
//!
//! ```text
//!  callers ──start()──► outgoing (mpsc) ──► writer task ──► FrameWriter ──► agent
//!     ▲                                                                       │
//!     └── per-request channel ◄── pending[id] ◄── reader task ◄── FrameReader ◄┘
//! ```
//!
//! Requests register a channel under a fresh id before their frame is queued, so no
//! answer can arrive for an id nobody listens on. The reader removes an id when its
//! final frame (`Reply` or `Error`) passes. When either task sees the stream end or
//! fail, the table is closed: every pending request gets
//! [`ClientError::ConnectionLost`] and new requests fail at once.
//!
//! Per-request channels are unbounded on purpose: a bounded channel would let one slow
//! follow stream stall the reader and with it every other request on the connection.
//! What bounds them is the protocol's per-request stream window: the agent sends at
//! most `STREAM_WINDOW_BYTES` of payload beyond what the request's handle reported
//! consumed (see `stream`).
//!
//! The agent runs at most [`MAX_REQUESTS_IN_FLIGHT`] requests per connection and
//! answers `Busy` beyond that. The writer keeps the same count (requests sent whose
//! final frame has not arrived; the agent frees its slot before that frame leaves, so
//! its count is never higher) and holds further requests back until a slot frees.
//! Frames that are not requests pass held ones, except frames of a held request,
//! which stay behind it; a request abandoned while held is never sent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sandbox_protocol::frame::Decoded;
use sandbox_protocol::limits::{MAX_REQUESTS_IN_FLIGHT, STREAM_WINDOW_CAPABILITY};
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, HelloReply, Request, RequestId,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;

use super::error::ClientError;
use super::stream::RequestStream;

/// Frames the writer batches into one write before flushing.
const WRITE_BATCH_FRAMES: usize = 64;

/// What the reader hands a pending request.
#[derive(Debug)]
pub(crate) enum Routed {
    /// A frame the agent sent under the request's id.
    Msg(AgentMsg),
    /// The request failed on this side (encoding, decoding, connection loss).
    Failed(ClientError),
}

/// The pending-request table, shared by callers and both tasks.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    state: Mutex<PendingState>,
    /// Signalled when a request slot frees, for the writer's held requests.
    slot_freed: Notify,
}

#[derive(Debug, Default)]
struct PendingState {
    routes: HashMap<RequestId, mpsc::UnboundedSender<Routed>>,
    /// Set once the connection is gone; the reason every later request gets.
    closed: Option<Arc<str>>,
    /// The last error the agent sent under id 0, kept to explain a hang-up after it.
    connection_error: Option<String>,
    /// Requests sent whose final frame has not arrived (abandoned ones included: the
    /// agent holds their slot until it answers them).
    unanswered: usize,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, PendingState> {
        // A panic while holding this lock leaves the map consistent (each operation
        // is a single insert/remove), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a route for `id`, unless the connection is already gone.
    fn register(&self, id: RequestId) -> Result<mpsc::UnboundedReceiver<Routed>, ClientError> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(ClientError::ConnectionLost {
                reason: reason.clone(),
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.routes.insert(id, tx);
        Ok(rx)
    }

    /// Removes `id`'s route; true when it was still pending (no final frame routed).
    pub(crate) fn unregister(&self, id: RequestId) -> bool {
        self.lock().routes.remove(&id).is_some()
    }

    /// True while someone waits for `id`'s answers.
    fn is_registered(&self, id: RequestId) -> bool {
        self.lock().routes.contains_key(&id)
    }

    /// Takes a request slot if one is free.
    fn take_slot(&self) -> bool {
        let mut state = self.lock();
        if state.unanswered < MAX_REQUESTS_IN_FLIGHT {
            state.unanswered += 1;
            true
        } else {
            false
        }
    }

    /// Gives back a slot: the request's final frame arrived, or it was never sent.
    fn release_slot(&self) {
        let mut state = self.lock();
        state.unanswered = state.unanswered.saturating_sub(1);
        drop(state);
        self.slot_freed.notify_one();
    }

    /// Fails one request with a local error.
    fn fail(&self, id: RequestId, error: ClientError) {
        if let Some(tx) = self.lock().routes.remove(&id) {
            let _ = tx.send(Routed::Failed(error));
        }
    }

    /// Hands an agent frame to its request.
    fn route(&self, frame: AgentFrame) {
        let AgentFrame { id, msg } = frame;
        let mut state = self.lock();
        if id == RequestId::CONNECTION {
            match msg {
                AgentMsg::Error(error) => {
                    tracing::warn!(%error, "agent reported a connection-level error");
                    state.connection_error = Some(error.to_string());
                }
                other => tracing::warn!(?other, "unexpected frame under id 0"),
            }
            return;
        }
        let is_final = matches!(msg, AgentMsg::Reply(_) | AgentMsg::Error(_));
        let route = if is_final {
            state.unanswered = state.unanswered.saturating_sub(1);
            self.slot_freed.notify_one();
            state.routes.remove(&id)
        } else {
            state.routes.get(&id).cloned()
        };
        match route {
            Some(tx) => {
                let _ = tx.send(Routed::Msg(msg));
            }
            // A request its caller dropped (and cancelled): its last frames are moot.
            None => tracing::debug!(%id, "frame for a request no longer pending"),
        }
    }

    /// Marks the connection gone and fails every pending request.
    fn close(&self, reason: &str) {
        let mut state = self.lock();
        if state.closed.is_some() {
            return;
        }
        let reason: Arc<str> = match &state.connection_error {
            Some(error) => format!("{reason} (after the agent reported: {error})").into(),
            None => reason.into(),
        };
        tracing::debug!(%reason, "connection closed");
        state.closed = Some(reason.clone());
        for (_, tx) in state.routes.drain() {
            let _ = tx.send(Routed::Failed(ClientError::ConnectionLost {
                reason: reason.clone(),
            }));
        }
    }

    /// Why the connection is gone (or a generic reason if it is not marked yet).
    fn lost(&self) -> ClientError {
        let reason = self
            .lock()
            .closed
            .clone()
            .unwrap_or_else(|| Arc::from("writer stopped"));
        ClientError::ConnectionLost { reason }
    }

    /// The reason the connection is gone, if it is.
    fn closed_reason(&self) -> Option<Arc<str>> {
        self.lock().closed.clone()
    }
}

/// A live, handshaken connection: the shared half of every [`super::Client`] clone.
#[derive(Debug)]
pub(crate) struct Connection {
    hello: HelloReply,
    pending: Arc<Pending>,
    outgoing: mpsc::UnboundedSender<ClientFrame>,
    next_id: AtomicU64,
    reader: AbortHandle,
}

impl Connection {
    /// Starts the reader and writer tasks over a stream whose handshake is done.
    pub(crate) fn start<R, W>(
        hello: HelloReply,
        reader: FrameReader<R>,
        writer: FrameWriter<W>,
    ) -> Arc<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let pending = Arc::new(Pending::default());
        let (outgoing, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(writer, queue, pending.clone()));
        let reader = tokio::spawn(read_loop(reader, pending.clone())).abort_handle();
        Arc::new(Self {
            hello,
            pending,
            outgoing,
            next_id: AtomicU64::new(1),
            reader,
        })
    }

    /// True when the agent applies a stream window (and so takes `Consumed`).
    pub(crate) fn has_stream_window(&self) -> bool {
        self.hello
            .capabilities
            .iter()
            .any(|capability| capability == STREAM_WINDOW_CAPABILITY)
    }

    pub(crate) fn hello(&self) -> &HelloReply {
        &self.hello
    }

    pub(crate) fn closed_reason(&self) -> Option<Arc<str>> {
        self.pending.closed_reason()
    }

    /// Sends `request` under a fresh id and returns the handle its answers arrive on.
    pub(crate) fn start_request(
        self: &Arc<Self>,
        request: Request,
        what: &'static str,
    ) -> Result<RequestStream, ClientError> {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let rx = self.pending.register(id)?;
        let frame = ClientFrame {
            id,
            msg: ClientMsg::Request(request),
        };
        if self.outgoing.send(frame).is_err() {
            self.pending.unregister(id);
            return Err(self.pending.lost());
        }
        Ok(RequestStream::new(id, what, rx, self.clone()))
    }

    /// Forgets `id` and, when it was still pending, tells the agent to stop it.
    pub(crate) fn abandon(&self, id: RequestId) {
        if self.pending.unregister(id) {
            self.send_cancel(id);
        }
    }

    /// Queues a frame about request `id` (the data of a `put`); false once the
    /// connection is gone.
    pub(crate) fn send(&self, id: RequestId, msg: ClientMsg) -> bool {
        self.outgoing.send(ClientFrame { id, msg }).is_ok()
    }

    /// Queues a `Cancel` for `id`; the request stays registered for its final frame.
    pub(crate) fn send_cancel(&self, id: RequestId) {
        let _ = self.outgoing.send(ClientFrame {
            id,
            msg: ClientMsg::Cancel,
        });
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The writer ends by itself once `outgoing` is dropped (and shuts the stream
        // down); the reader would wait for the agent to hang up, so stop it here.
        self.reader.abort();
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: FrameWriter<W>,
    mut queue: mpsc::UnboundedReceiver<ClientFrame>,
    pending: Arc<Pending>,
) {
    let mut held = HeldRequests::default();
    loop {
        held.release(&pending, |frame, is_request| {
            queue_frame(&mut writer, &pending, frame, is_request);
        });
        if writer.queued_bytes() > 0 {
            if let Err(error) = writer.flush().await {
                pending.close(&format!("write failed: {error}"));
                return;
            }
        }
        let first = tokio::select! {
            frame = queue.recv() => frame,
            () = pending.slot_freed.notified(), if !held.is_empty() => continue,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        let mut batched = 0;
        while let Some(frame) = next.take() {
            if let Some(frame) = held.admit(frame) {
                queue_frame(&mut writer, &pending, frame, false);
            }
            batched += 1;
            if batched < WRITE_BATCH_FRAMES {
                next = queue.try_recv().ok();
            }
        }
    }
    // Every client handle is gone: say goodbye with an end of stream.
    let _ = writer.get_mut().shutdown().await;
    pending.close("client closed the connection");
}

/// Encodes one frame into the writer's buffer; a frame that cannot be encoded fails
/// its request alone (and gives back the slot a request took).
fn queue_frame<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    pending: &Pending,
    frame: ClientFrame,
    took_slot: bool,
) {
    if let Err(error) = writer.queue(&frame) {
        pending.fail(frame.id, ClientError::Encode(error));
        if took_slot {
            pending.release_slot();
        }
    }
}

/// Requests waiting for a slot, with the frames of theirs that came after them.
#[derive(Debug, Default)]
struct HeldRequests {
    frames: VecDeque<ClientFrame>,
}

impl HeldRequests {
    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Holds `frame` if it is a request or belongs to a held one; else hands it back to
    /// be sent now.
    fn admit(&mut self, frame: ClientFrame) -> Option<ClientFrame> {
        let is_request = matches!(frame.msg, ClientMsg::Request(_));
        if is_request || self.frames.iter().any(|held| held.id == frame.id) {
            self.frames.push_back(frame);
            None
        } else {
            Some(frame)
        }
    }

    /// Sends, in order, every held request a slot is free for and the frames that
    /// follow it; drops what belongs to requests abandoned before they were sent.
    /// `send` gets each frame and whether it is a request that took a slot.
    fn release(&mut self, pending: &Pending, mut send: impl FnMut(ClientFrame, bool)) {
        let mut still_held = VecDeque::new();
        let mut blocked: HashSet<RequestId> = HashSet::new();
        for frame in self.frames.drain(..) {
            let is_request = matches!(frame.msg, ClientMsg::Request(_));
            if blocked.contains(&frame.id) {
                still_held.push_back(frame);
            } else if !pending.is_registered(frame.id) {
                // Its caller gave up before it was sent: the agent never hears of it.
            } else if !is_request {
                send(frame, false);
            } else if pending.take_slot() {
                send(frame, true);
            } else {
                blocked.insert(frame.id);
                still_held.push_back(frame);
            }
        }
        self.frames = still_held;
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut reader: FrameReader<R>, pending: Arc<Pending>) {
    loop {
        match reader.read::<AgentFrame>().await {
            Ok(Some(Decoded::Frame(frame))) => pending.route(frame),
            Ok(Some(Decoded::Rejected { id, error })) => match id {
                Some(id) if id != RequestId::CONNECTION => {
                    // Taken as the request's final frame: its slot is free.
                    pending.fail(id, ClientError::Decode(error));
                    pending.release_slot();
                }
                _ => tracing::warn!(%error, "undecodable frame from the agent"),
            },
            Ok(None) => {
                pending.close("agent closed the connection");
                return;
            }
            Err(error) => {
                pending.close(&format!("read failed: {error}"));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The demultiplexer against a scripted peer on an in-memory pipe. (The real agent
    //! is exercised end to end in the `sandbox-tests` crate.)
    use super::*;
    use crate::client::{Client, ExecEvent};
    use sandbox_protocol::limits::MAX_FRAME_BYTES;
    use sandbox_protocol::{
        Event, ExecRequest, ExitStatus, OutputChunk, Pid, ProcessSpec, Reply, Stream,
    };
    use tokio::io::DuplexStream;

    type PeerReader = FrameReader<tokio::io::ReadHalf<DuplexStream>>;
    type PeerWriter = FrameWriter<tokio::io::WriteHalf<DuplexStream>>;

    /// A connected client and the peer's ends, past the handshake.
    async fn pair() -> (Client, PeerReader, PeerWriter) {
        let (near, far) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(far);
        let mut reader = FrameReader::new(read, MAX_FRAME_BYTES);
        let mut writer = FrameWriter::new(write, MAX_FRAME_BYTES);
        let peer = async {
            let Some(Decoded::Frame(hello)) = reader.read::<ClientFrame>().await.unwrap() else {
                panic!("no hello");
            };
            assert_eq!(hello.id, RequestId::CONNECTION);
            let reply = HelloReply {
                version: sandbox_protocol::PROTOCOL_VERSION,
                agent_version: "test".into(),
                boot_id: "boot".into(),
                capabilities: vec![],
            };
            writer
                .write(&AgentFrame {
                    id: RequestId::CONNECTION,
                    msg: AgentMsg::Hello(reply),
                })
                .await
                .unwrap();
        };
        let (client, ()) = tokio::join!(Client::over_stream(near, None), peer);
        (client.unwrap(), reader, writer)
    }

    /// The peer answers request `id` with an empty `ps`.
    async fn answer_ps(writer: &mut PeerWriter, id: RequestId) {
        writer
            .write(&AgentFrame {
                id,
                msg: AgentMsg::Reply(Reply::Ps(vec![])),
            })
            .await
            .unwrap();
    }

    async fn next_frame(reader: &mut PeerReader) -> ClientFrame {
        match reader.read::<ClientFrame>().await.unwrap() {
            Some(Decoded::Frame(frame)) => frame,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    fn exec(line: &str) -> ExecRequest {
        ExecRequest {
            spec: ProcessSpec::new(sandbox_protocol::Command::Shell(line.into())),
            stdin: vec![],
            timeout_ms: None,
            stream: false,
        }
    }

    fn exec_reply(pid: i32) -> AgentMsg {
        AgentMsg::Reply(Reply::Exec(sandbox_protocol::ExecReply {
            pid: Pid(pid),
            stdout: pid.to_string().into_bytes(),
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            exit: Some(ExitStatus {
                code: Some(0),
                signal: None,
            }),
            timed_out: false,
            duration_us: 1,
        }))
    }

    #[tokio::test]
    async fn answers_out_of_order_reach_the_right_caller() {
        let (client, mut reader, mut writer) = pair().await;
        let first = tokio::spawn({
            let client = client.clone();
            async move { client.exec(exec("a")).await }
        });
        let a = next_frame(&mut reader).await;
        let second = tokio::spawn({
            let client = client.clone();
            async move { client.exec(exec("b")).await }
        });
        let b = next_frame(&mut reader).await;
        assert_eq!((a.id, b.id), (RequestId(1), RequestId(2)));
        // Answer the second request first.
        for (id, pid) in [(b.id, 2), (a.id, 1)] {
            writer
                .write(&AgentFrame {
                    id,
                    msg: exec_reply(pid),
                })
                .await
                .unwrap();
        }
        assert_eq!(second.await.unwrap().unwrap().stdout, b"2");
        assert_eq!(first.await.unwrap().unwrap().stdout, b"1");
    }

    #[tokio::test]
    async fn dropping_a_stream_sends_cancel_and_late_frames_are_ignored() {
        let (client, mut reader, mut writer) = pair().await;
        let mut stream = client.exec_stream(exec("sleep 9")).unwrap();
        let request = next_frame(&mut reader).await;
        let chunk = OutputChunk {
            stream: Stream::Stdout,
            offset: 0,
            data: b"x".to_vec(),
        };
        writer
            .write(&AgentFrame {
                id: request.id,
                msg: AgentMsg::Event(Event::Output(chunk.clone())),
            })
            .await
            .unwrap();
        assert_eq!(stream.next().await.unwrap(), ExecEvent::Output(chunk));
        drop(stream);
        let cancel = next_frame(&mut reader).await;
        assert_eq!(cancel.id, request.id);
        assert_eq!(cancel.msg, ClientMsg::Cancel);
        // The agent's final frame for the cancelled id goes nowhere, harmlessly.
        writer
            .write(&AgentFrame {
                id: request.id,
                msg: AgentMsg::Error(sandbox_protocol::WireError::new(
                    sandbox_protocol::ErrorKind::Cancelled,
                    "cancelled",
                )),
            })
            .await
            .unwrap();
        let ps = tokio::spawn({
            let client = client.clone();
            async move { client.ps().await }
        });
        let frame = next_frame(&mut reader).await;
        answer_ps(&mut writer, frame.id).await;
        assert_eq!(ps.await.unwrap().unwrap(), vec![]);
    }

    #[tokio::test]
    async fn a_hang_up_fails_every_pending_request_and_later_ones() {
        let (client, mut reader, writer) = pair().await;
        let pending = tokio::spawn({
            let client = client.clone();
            async move { client.ps().await }
        });
        next_frame(&mut reader).await;
        drop((reader, writer));
        let err = pending.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, ClientError::ConnectionLost { reason } if reason.contains("closed")),
            "{err:?}"
        );
        let err = client.info().await.unwrap_err();
        assert!(matches!(err, ClientError::ConnectionLost { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn an_oversize_request_fails_alone() {
        let (client, mut reader, mut writer) = pair().await;
        let mut big = exec("cat");
        big.stdin = vec![0; MAX_FRAME_BYTES + 1];
        let err = client.exec(big).await.unwrap_err();
        assert!(matches!(err, ClientError::Encode(_)), "{err:?}");
        // The connection is fine: the next request goes out as normal.
        let ps = tokio::spawn({
            let client = client.clone();
            async move { client.ps().await }
        });
        let frame = next_frame(&mut reader).await;
        assert_eq!(frame.msg, ClientMsg::Request(Request::Ps));
        answer_ps(&mut writer, frame.id).await;
        assert!(ps.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn requests_past_the_agents_cap_wait_for_a_slot_and_abandoned_ones_never_leave() {
        let (client, mut reader, mut writer) = pair().await;
        let calls: Vec<_> = (0..MAX_REQUESTS_IN_FLIGHT + 2)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.ps().await })
            })
            .collect();
        let mut seen = Vec::new();
        for _ in 0..MAX_REQUESTS_IN_FLIGHT {
            seen.push(next_frame(&mut reader).await.id);
        }
        // A request abandoned while held back is never sent.
        let abandoned = client.exec_stream(exec("never")).unwrap();
        drop(abandoned);
        let more = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            next_frame(&mut reader),
        )
        .await;
        assert!(more.is_err(), "a request past the cap went out");
        // Each answer lets exactly one held request out.
        for round in 0..2 {
            answer_ps(&mut writer, seen[round]).await;
            let frame = next_frame(&mut reader).await;
            assert_eq!(frame.msg, ClientMsg::Request(Request::Ps));
            seen.push(frame.id);
        }
        for id in &seen[2..] {
            answer_ps(&mut writer, *id).await;
        }
        for call in calls {
            assert!(call.await.unwrap().is_ok());
        }
        // The abandoned exec left no frame behind, and the connection still works.
        let ps = tokio::spawn({
            let client = client.clone();
            async move { client.ps().await }
        });
        let frame = next_frame(&mut reader).await;
        assert_eq!(frame.msg, ClientMsg::Request(Request::Ps));
        answer_ps(&mut writer, frame.id).await;
        assert!(ps.await.unwrap().is_ok());
    }
}
