//! The link's channels over tokio (feature `tokio`), the same on both ends.
//!
//! - [`LinkReader`] turns the shared stream into [`LinkItem`]s.
//! - [`write_loop`] owns the stream's write half. Everything to send goes through one
//!   bounded queue ([`Outbox`]), tagged with the session it belongs to: frames of an
//!   older session are dropped, never written into a new one.
//! - [`Channels`] is the table of open channels of the current session: it routes
//!   incoming `Data`, `Credit`, `Eof` and `Close` to them, and [`Channels::reset`] ends
//!   the session (every channel closes).
//! - [`Channel::splice`] joins one channel to an ordinary byte stream (a client's Unix
//!   socket on the host, one end of an in-memory pipe to a connection handler in the
//!   guest) and moves bytes both ways within the credit each side granted.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Semaphore};

mod stream;

pub use stream::ChannelStream;

use super::{
    encode_data, encode_frame, encode_session_start, ChannelId, LinkDecoder, LinkFrame, LinkItem,
    CHANNEL_WINDOW_BYTES, CREDIT_BATCH_BYTES, LINK_DATA_BYTES, MAX_CHANNELS,
};

/// Frames queued for the writer at most; senders wait beyond it.
pub const OUTBOX_FRAMES: usize = 64;

/// Bytes the reader asks the stream for per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// How long the writer keeps a batch buffer grown by a burst once its queue is
/// empty (longer than the agent's 20 ms read interval of a streaming pipe).
const KEEP_BATCH_BUFFER_WHILE_QUIET: std::time::Duration = std::time::Duration::from_millis(100);

/// Frames at least this big are written on their own, not copied into a batch.
const WRITE_ALONE_BYTES: usize = 16 * 1024;

/// Reads link items from the shared stream.
#[derive(Debug)]
pub struct LinkReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded: compacted once per read, not per frame (a
    /// stream of tiny frames would otherwise cost a memmove of the buffer each).
    start: usize,
    decoder: LinkDecoder,
    /// How long a frame may stay half-read with no byte arriving (see
    /// [`LinkReader::with_stall_timeout`]); `None`: forever.
    stall: Option<std::time::Duration>,
}

impl<R: AsyncRead + Unpin> LinkReader<R> {
    /// A reader that starts by hunting for a session marker: whatever came before it
    /// belongs to no session this side knows.
    pub fn new(inner: R) -> Self {
        let mut reader = Self {
            inner,
            buf: Vec::new(),
            start: 0,
            decoder: LinkDecoder::new(),
            stall: None,
        };
        reader.hunt();
        reader
    }

    /// A frame that stops arriving mid-way for `limit` is given up: the reader hunts
    /// for the next marker and [`LinkReader::next`] says [`LinkItem::Desync`], as for
    /// a frame that does not decode. For a reader whose peer is hostile (the relay
    /// reading a guest): a guest that wrote the start of a 32 KiB frame into the
    /// agent's port and nothing more wedged the relay for good, each later client
    /// waiting for bytes the frame would swallow. An honest peer writes each frame
    /// whole, so its bytes follow one another closely.
    pub fn with_stall_timeout(mut self, limit: std::time::Duration) -> Self {
        self.stall = Some(limit);
        self
    }

    /// Forgets buffered bytes and skips to the next session marker (the peer went
    /// away; what it left half-sent is worthless).
    pub fn hunt(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.decoder.hunt();
    }

    /// The next item, or `None` when a read returned no bytes (end of stream; for a
    /// guest's virtio-serial port: no host is connected right now).
    ///
    /// Cancel safe: dropping the future loses no bytes.
    pub async fn next(&mut self) -> io::Result<Option<LinkItem>> {
        loop {
            let (used, item) = self.decoder.decode(&self.buf[self.start..]);
            self.start += used;
            if let Some(item) = item {
                return Ok(Some(item));
            }
            if used > 0 {
                continue;
            }
            self.buf.drain(..self.start);
            self.start = 0;
            if self.buf.capacity() > 2 * READ_CHUNK_BYTES && self.buf.len() <= READ_CHUNK_BYTES {
                self.buf.shrink_to(2 * READ_CHUNK_BYTES);
            }
            self.buf.reserve(READ_CHUNK_BYTES);
            // Bytes left over at a frame boundary, not hunting: a frame half-read.
            let stall = self
                .stall
                .filter(|_| !self.decoder.is_hunting() && !self.buf.is_empty());
            let read = self.inner.read_buf(&mut self.buf);
            let read = match stall {
                Some(limit) => match tokio::time::timeout(limit, read).await {
                    Ok(read) => read,
                    Err(_) => {
                        self.hunt();
                        return Ok(Some(LinkItem::Desync));
                    }
                },
                None => read.await,
            };
            if read? == 0 {
                return Ok(None);
            }
        }
    }
}

/// One encoded write, and the session it belongs to.
#[derive(Debug)]
pub struct Outgoing {
    session: u64,
    bytes: Vec<u8>,
}

/// Where frames to send go. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    current: Arc<AtomicU64>,
    /// `Data` frame buffers the writer gave back, for the next `Data` frames: a
    /// fresh 32 KiB buffer per frame is a fresh mapping for musl's allocator, each
    /// of its pages faulted in anew (most of a streamed exec's system time in the
    /// guest, under TCG).
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// Buffers kept in [`Outbox::spare`]: a window's worth of `Data` frames.
const SPARE_DATA_BUFFERS: usize = CHANNEL_WINDOW_BYTES as usize / LINK_DATA_BYTES;

/// Largest buffer kept as a spare: a `Data` frame's.
const SPARE_BUFFER_BYTES: usize = LINK_DATA_BYTES + 64;

impl Outbox {
    /// An outbox and the receiver [`write_loop`] drains.
    pub fn new() -> (Self, mpsc::Receiver<Outgoing>) {
        let (tx, rx) = mpsc::channel(OUTBOX_FRAMES);
        let current = Arc::new(AtomicU64::new(0));
        let spare = Arc::default();
        (Self { tx, current, spare }, rx)
    }

    /// A cleared buffer for a `Data` frame: a spare when there is one.
    fn data_buffer(&self) -> Vec<u8> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(SPARE_BUFFER_BYTES))
    }

    /// Keeps a written frame's buffer for a later `Data` frame (when it is one's
    /// size and fewer than [`SPARE_DATA_BUFFERS`] are kept).
    fn give_back(&self, mut bytes: Vec<u8>) {
        let capacity = bytes.capacity();
        if !(LINK_DATA_BYTES..=SPARE_BUFFER_BYTES).contains(&capacity) {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < SPARE_DATA_BUFFERS {
            bytes.clear();
            spare.push(bytes);
        }
    }

    /// Drops the spare buffers (the link went quiet).
    fn drop_spares(&self) {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        *spare = Vec::new();
    }

    /// The session number frames are sent under now.
    pub fn session(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    /// Starts a new session (frames of older ones are dropped from now on) and queues
    /// the marker and `frame` as its first bytes. Returns the new session number.
    pub async fn start_session(&self, frame: &LinkFrame, padding: usize) -> u64 {
        let session = self.current.fetch_add(1, Ordering::AcqRel) + 1;
        let mut bytes = vec![0; padding];
        if encode_session_start(frame, &mut bytes).is_ok() {
            let _ = self.tx.send(Outgoing { session, bytes }).await;
        }
        session
    }

    /// Queues `frame` of `session`; false when the writer is gone.
    pub async fn send(&self, session: u64, frame: &LinkFrame) -> bool {
        let mut bytes = Vec::new();
        if encode_frame(frame, &mut bytes).is_err() {
            return true;
        }
        self.tx.send(Outgoing { session, bytes }).await.is_ok()
    }

    /// Queues a `Data` frame of `bytes` for `channel` in `session` (encoded straight
    /// from `bytes`); false when the writer is gone.
    pub async fn send_data(&self, session: u64, channel: ChannelId, bytes: &[u8]) -> bool {
        let mut frame = self.data_buffer();
        if encode_data(channel, bytes, &mut frame).is_err() {
            return true;
        }
        self.tx
            .send(Outgoing {
                session,
                bytes: frame,
            })
            .await
            .is_ok()
    }

    /// Like [`Outbox::send`], without waiting: a control frame from a context that
    /// must not block (the reader). Dropped when the queue is full, so only frames
    /// whose loss the peer survives go this way: a `Close` (its channel is gone from
    /// this side's table either way), a refused `Dial` (the agent's dial times out).
    pub fn try_send(&self, session: u64, frame: &LinkFrame) {
        let mut bytes = Vec::new();
        if encode_frame(frame, &mut bytes).is_ok() {
            let _ = self.tx.try_send(Outgoing { session, bytes });
        }
    }
}

/// Writes queued frames of the current session, batching what is queued into one
/// write (each write into a virtio port costs a VM exit). Returns when every
/// [`Outbox`] is gone, or on a write error.
pub async fn write_loop<W: AsyncWrite + Unpin>(
    mut stream: W,
    mut rx: mpsc::Receiver<Outgoing>,
    outbox: &Outbox,
) -> io::Result<()> {
    let mut batch = Vec::new();
    let mut bytes = Vec::new();
    loop {
        // A batch buffer grown by a burst is kept while frames keep coming (growing
        // it again would fault every page in anew) and given back once the queue
        // stayed empty for a while.
        let received = match tokio::time::timeout(
            KEEP_BATCH_BUFFER_WHILE_QUIET,
            rx.recv_many(&mut batch, OUTBOX_FRAMES),
        )
        .await
        {
            Ok(received) => received,
            Err(_quiet) => {
                if bytes.capacity() > 4 * READ_CHUNK_BYTES {
                    bytes = Vec::new();
                }
                outbox.drop_spares();
                rx.recv_many(&mut batch, OUTBOX_FRAMES).await
            }
        };
        if received == 0 {
            break;
        }
        let current = outbox.session();
        batch.retain(|out| out.session == current);
        // Small frames are gathered into one write (each write into a virtio port
        // costs a VM exit); a big one (a full `Data` frame, typically) is written as
        // it is: copying it into the batch cost more than the write it would share.
        bytes.clear();
        for out in &batch {
            if out.bytes.len() < WRITE_ALONE_BYTES {
                bytes.extend_from_slice(&out.bytes);
                continue;
            }
            if !bytes.is_empty() {
                stream.write_all(&bytes).await?;
                bytes.clear();
            }
            stream.write_all(&out.bytes).await?;
        }
        if !bytes.is_empty() {
            stream.write_all(&bytes).await?;
        }
        if !batch.is_empty() {
            stream.flush().await?;
        }
        for out in batch.drain(..) {
            outbox.give_back(out.bytes);
        }
    }
    Ok(())
}

/// Why a channel could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The id is in use in this session.
    #[error("Channel {0} is already open")]
    InUse(ChannelId),
    /// [`MAX_CHANNELS`] are open.
    #[error("Too many channels open (at most {MAX_CHANNELS})")]
    TooMany,
}

/// One open channel as the table sees it.
#[derive(Debug)]
struct Slot {
    session: u64,
    /// Incoming bytes for the splice; dropped on the peer's `Eof`.
    inbound: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes queued in `inbound` or written out but not yet credited back.
    unacknowledged: Arc<AtomicU32>,
    /// Credit to send: one permit per byte.
    credit: Arc<Semaphore>,
    /// Dropped to end the splice at once (peer's `Close`, protocol violation, reset).
    _abort: oneshot::Sender<()>,
}

/// The open channels of the current session.
#[derive(Debug)]
pub struct Channels {
    slots: Mutex<HashMap<ChannelId, Slot>>,
    outbox: Outbox,
}

/// What [`Channels::deliver`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Routed to its channel.
    Delivered,
    /// For a channel this session does not have (a stale frame): dropped.
    Unknown,
    /// The channel broke the window or credit rules and was closed.
    Violation,
    /// Not a channel frame (`Attach`, `Attached`, `Open`, the egress frames): the
    /// caller's business.
    NotForChannels,
}

impl Channels {
    /// An empty table sending through `outbox`.
    pub fn new(outbox: Outbox) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(HashMap::new()),
            outbox,
        })
    }

    /// The outbox frames go through.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Channels open now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Channels open now whose id has `bit` set (the egress channels).
    pub fn count_with_bit(&self, bit: ChannelId) -> usize {
        self.lock().keys().filter(|id| *id & bit != 0).count()
    }

    /// True when no channel is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every channel of the session (each splice ends at once). The caller
    /// starts the next session through the outbox.
    pub fn reset(&self) {
        let slots = std::mem::take(&mut *self.lock());
        for slot in slots.values() {
            slot.credit.close();
        }
    }

    /// Opens channel `id` in the current session.
    pub fn open(self: &Arc<Self>, id: ChannelId) -> Result<Channel, OpenError> {
        let session = self.outbox.session();
        let mut slots = self.lock();
        if slots.contains_key(&id) {
            return Err(OpenError::InUse(id));
        }
        if slots.len() >= MAX_CHANNELS {
            return Err(OpenError::TooMany);
        }
        let (inbound_tx, inbound) = mpsc::unbounded_channel();
        let (abort_tx, aborted) = oneshot::channel();
        let unacknowledged = Arc::new(AtomicU32::new(0));
        let credit = Arc::new(Semaphore::new(CHANNEL_WINDOW_BYTES as usize));
        slots.insert(
            id,
            Slot {
                session,
                inbound: Some(inbound_tx),
                unacknowledged: unacknowledged.clone(),
                credit: credit.clone(),
                _abort: abort_tx,
            },
        );
        Ok(Channel {
            id,
            session,
            inbound,
            unacknowledged,
            credit,
            aborted,
            table: self.clone(),
        })
    }

    /// Routes a channel frame read from the stream. Never waits: the reader must go on
    /// reading whatever one channel's consumer does.
    pub fn deliver(&self, frame: LinkFrame) -> Delivery {
        let (channel, violation) = match frame {
            LinkFrame::Data { channel, bytes } => match self.lock().get_mut(&channel) {
                None => return Delivery::Unknown,
                Some(slot) => (channel, !accept_data(slot, bytes)),
            },
            LinkFrame::Credit { channel, bytes } => match self.lock().get(&channel) {
                None => return Delivery::Unknown,
                Some(slot) => (channel, !accept_credit(slot, bytes)),
            },
            LinkFrame::Eof { channel } => match self.lock().get_mut(&channel) {
                None => return Delivery::Unknown,
                Some(slot) => {
                    slot.inbound = None;
                    return Delivery::Delivered;
                }
            },
            LinkFrame::Close { channel } => {
                return match self.remove(channel, None) {
                    true => Delivery::Delivered,
                    false => Delivery::Unknown,
                }
            }
            LinkFrame::Attach { .. }
            | LinkFrame::Attached { .. }
            | LinkFrame::Open { .. }
            | LinkFrame::Network { .. }
            | LinkFrame::Dial { .. }
            | LinkFrame::Dialed { .. }
            | LinkFrame::ProxyRefused { .. } => return Delivery::NotForChannels,
        };
        if !violation {
            return Delivery::Delivered;
        }
        if self.remove(channel, None) {
            self.outbox
                .try_send(self.outbox.session(), &LinkFrame::Close { channel });
        }
        Delivery::Violation
    }

    /// Removes `id` (of `session`, when given); true when it was there.
    fn remove(&self, id: ChannelId, session: Option<u64>) -> bool {
        let mut slots = self.lock();
        match slots.get(&id) {
            Some(slot) if session.is_none_or(|s| s == slot.session) => {
                slot.credit.close();
                slots.remove(&id);
                true
            }
            _ => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ChannelId, Slot>> {
        // The table's invariants hold between statements: a panic elsewhere while it
        // was held leaves it usable.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one `Data` frame of `len` bytes costs against a window: at least
/// [`MIN_FRAME_CHARGE`], so a peer cannot queue unbounded numbers of tiny frames
/// (each costs memory beyond its payload). Both ends charge the same.
pub fn frame_charge(len: usize) -> u32 {
    u32::try_from(len.max(MIN_FRAME_CHARGE)).unwrap_or(u32::MAX)
}

/// The least a `Data` frame costs against a window (see [`frame_charge`]).
pub const MIN_FRAME_CHARGE: usize = 64;

/// Queues incoming bytes if they fit the window this side granted. An empty frame is
/// a violation (a sender ends a direction with `Eof`).
fn accept_data(slot: &mut Slot, bytes: Vec<u8>) -> bool {
    if bytes.is_empty() || bytes.len() > super::LINK_DATA_BYTES {
        return false;
    }
    let charge = frame_charge(bytes.len());
    let before = slot.unacknowledged.fetch_add(charge, Ordering::AcqRel);
    if before.saturating_add(charge) > CHANNEL_WINDOW_BYTES {
        return false;
    }
    if let Some(inbound) = &slot.inbound {
        // A splice that has stopped reading (its stream is gone) just drops them.
        let _ = inbound.send(bytes);
    }
    true
}

/// Adds credit the peer granted, refusing more than a window in total.
fn accept_credit(slot: &Slot, bytes: u32) -> bool {
    let available = slot.credit.available_permits();
    match available.checked_add(bytes as usize) {
        Some(total) if total <= CHANNEL_WINDOW_BYTES as usize => {
            slot.credit.add_permits(bytes as usize);
            true
        }
        _ => false,
    }
}

/// One open channel, to be spliced to a byte stream.
#[derive(Debug)]
pub struct Channel {
    id: ChannelId,
    session: u64,
    inbound: mpsc::UnboundedReceiver<Vec<u8>>,
    unacknowledged: Arc<AtomicU32>,
    credit: Arc<Semaphore>,
    aborted: oneshot::Receiver<()>,
    table: Arc<Channels>,
}

impl Channel {
    /// The channel's number.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// Leaves the table without a word to the peer: a dial that was refused (the
    /// peer already knows).
    pub fn discard(self) {
        self.table.remove(self.id, Some(self.session));
    }

    /// Moves bytes between the channel and `stream` until both directions have ended
    /// (each side's `Eof`), the peer closes the channel, or the session ends; then the
    /// channel leaves the table. A write to `stream` that fails closes the channel.
    pub async fn splice<S: AsyncRead + AsyncWrite>(self, stream: S) {
        let Self {
            id,
            session,
            mut inbound,
            unacknowledged,
            credit,
            mut aborted,
            table,
        } = self;
        let (mut read_half, mut write_half) = tokio::io::split(stream);
        let outbox = table.outbox.clone();
        let to_link = async {
            let mut buf = vec![0; LINK_DATA_BYTES];
            loop {
                let n = match read_half.read(&mut buf).await {
                    Ok(0) => {
                        outbox.send(session, &LinkFrame::Eof { channel: id }).await;
                        return;
                    }
                    Ok(n) => n,
                    Err(_) => {
                        outbox
                            .send(session, &LinkFrame::Close { channel: id })
                            .await;
                        return;
                    }
                };
                // `n` is at most LINK_DATA_BYTES.
                let Ok(permits) = credit.acquire_many(frame_charge(n)).await else {
                    return;
                };
                permits.forget();
                if !outbox.send_data(session, id, &buf[..n]).await {
                    return;
                }
            }
        };
        let from_link = async {
            let mut drained: u32 = 0;
            while let Some(bytes) = inbound.recv().await {
                if write_half.write_all(&bytes).await.is_err() {
                    outbox
                        .send(session, &LinkFrame::Close { channel: id })
                        .await;
                    table.remove(id, Some(session));
                    return;
                }
                drained = drained.saturating_add(frame_charge(bytes.len()));
                // Not also whenever the queue runs empty: a stream of small chunks
                // then cost a `Credit` frame back per chunk (in a guest, a read of
                // the port and an interrupt each). The window is four batches, so
                // the sender never waits on credit held back here.
                if drained >= CREDIT_BATCH_BYTES {
                    unacknowledged.fetch_sub(drained, Ordering::AcqRel);
                    let grant = LinkFrame::Credit {
                        channel: id,
                        bytes: drained,
                    };
                    drained = 0;
                    if !outbox.send(session, &grant).await {
                        return;
                    }
                }
            }
            let _ = write_half.shutdown().await;
        };
        tokio::select! {
            _ = async { tokio::join!(to_link, from_link) } => {}
            _ = &mut aborted => {}
        }
        table.remove(id, Some(session));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{duplex, DuplexStream};

    /// Two link ends over an in-memory stream, each with a table; frames read on one
    /// end are delivered to its table, and `Open`s become channels spliced to a pipe
    /// whose far end the test holds.
    struct End {
        channels: Arc<Channels>,
        opened: mpsc::UnboundedReceiver<(ChannelId, tokio::io::DuplexStream)>,
    }

    fn link() -> (End, End) {
        let (a, b) = duplex(8 * 1024);
        (end(a), end(b))
    }

    fn end(stream: tokio::io::DuplexStream) -> End {
        let (read, write) = tokio::io::split(stream);
        let (outbox, rx) = Outbox::new();
        let channels = Channels::new(outbox.clone());
        tokio::spawn(async move { write_loop(write, rx, &outbox).await });
        let (opened_tx, opened) = mpsc::unbounded_channel();
        let table = channels.clone();
        tokio::spawn(async move {
            let mut reader = LinkReader::new(read);
            while let Ok(Some(item)) = reader.next().await {
                if let LinkItem::Frame(frame) = item {
                    if let LinkFrame::Open { channel } = frame {
                        let (mine, theirs) = duplex(64 * 1024);
                        let ch = table.open(channel).unwrap();
                        tokio::spawn(ch.splice(mine));
                        opened_tx.send((channel, theirs)).unwrap();
                    } else {
                        table.deliver(frame);
                    }
                }
            }
        });
        End { channels, opened }
    }

    async fn start(a: &End, b: &End) {
        // Both sides: session 1 (a real peer sends `Attach`; here each just starts).
        a.channels
            .outbox()
            .start_session(&LinkFrame::Attach { session: 1 }, 0)
            .await;
        b.channels
            .outbox()
            .start_session(&LinkFrame::Attach { session: 1 }, 0)
            .await;
    }

    async fn open(
        a: &End,
        b: &mut End,
        id: ChannelId,
    ) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        let ch = a.channels.open(id).unwrap();
        let (mine, theirs) = duplex(64 * 1024);
        tokio::spawn(ch.splice(mine));
        (theirs, announce(a, b, id).await)
    }

    /// Tells `b` that `a` opened `id`; the pipe `b` spliced it to.
    async fn announce(a: &End, b: &mut End, id: ChannelId) -> DuplexStream {
        let session = a.channels.outbox().session();
        a.channels
            .outbox()
            .send(session, &LinkFrame::Open { channel: id })
            .await;
        let (got, far) = b.opened.recv().await.unwrap();
        assert_eq!(got, id);
        far
    }

    /// Sends more than a window from `near` to `far` and `reply` back (credit must
    /// flow both ways), each side ending with `Eof`; then the channel is closed on
    /// both ends.
    async fn both_ways_then_closed<S>(
        a: &End,
        b: &End,
        near: S,
        mut far: DuplexStream,
        reply: Vec<u8>,
    ) where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            let mut near = near;
            near.write_all(&sent).await.unwrap();
            near.shutdown().await.unwrap();
            let mut back = Vec::new();
            near.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big);
        far.write_all(&reply).await.unwrap();
        far.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), reply);
        drop(far);
        until_closed(a, b).await;
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_eof_closes_the_channel() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (near, far) = open(&a, &mut b, 1).await;
        both_ways_then_closed(&a, &b, near, far, b"reply".to_vec()).await;
    }

    /// Opens `id` from `a`, read and written in place there (as the agent serves a
    /// channel), spliced to a pipe on `b` (as the host's relay does).
    async fn open_stream(a: &End, b: &mut End, id: ChannelId) -> (ChannelStream, DuplexStream) {
        let stream = a.channels.open(id).unwrap().into_stream();
        (stream, announce(a, b, id).await)
    }

    async fn until_closed(a: &End, b: &End) {
        for _ in 0..200 {
            if a.channels.is_empty() && b.channels.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!(
            "channels left open: {} {}",
            a.channels.len(),
            b.channels.len()
        );
    }

    #[tokio::test]
    async fn a_stream_moves_bytes_both_ways_within_the_credit_and_closes() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (near, far) = open_stream(&a, &mut b, 1).await;
        // More than a window back, read in small pieces (a frame read in parts).
        let reply: Vec<u8> = (0..700_000u32).map(|i| (i % 13) as u8).collect();
        both_ways_then_closed(&a, &b, near, far, reply).await;
    }

    #[tokio::test]
    async fn a_stream_that_does_not_read_holds_its_peer_to_the_window() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (mut near, mut far) = open_stream(&a, &mut b, 1).await;
        let sender = tokio::spawn(async move {
            far.write_all(&vec![7; 2 * 1024 * 1024]).await.unwrap();
            far
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            !sender.is_finished(),
            "a window's worth went unread, yet more was sent"
        );
        let unread = a
            .channels
            .lock()
            .get(&1)
            .unwrap()
            .unacknowledged
            .load(Ordering::Acquire);
        assert!(unread <= CHANNEL_WINDOW_BYTES, "{unread}");
        let mut buf = vec![0; 2 * 1024 * 1024];
        near.read_exact(&mut buf).await.unwrap();
        assert!(buf.iter().all(|b| *b == 7));
        drop(sender.await.unwrap());
    }

    #[tokio::test]
    async fn a_dropped_stream_ends_its_direction_and_its_peers_next_bytes_close_it() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (mut near, mut far) = open_stream(&a, &mut b, 1).await;
        near.write_all(b"last words").await.unwrap();
        drop(near);
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
        // Nobody reads this side now: what the peer sends closes the channel.
        far.write_all(b"anyone?").await.unwrap();
        until_closed(&a, &b).await;
    }

    #[tokio::test]
    async fn streams_waiting_for_credit_leave_the_shared_queue_to_the_others() {
        let (a, mut b) = link();
        start(&a, &b).await;
        // More channels than the link's queue has slots, each writing far past its
        // window to a peer that never reads.
        let mut stalled = Vec::new();
        for id in 1..=ChannelId::try_from(OUTBOX_FRAMES).unwrap() + 1 {
            let (mut stream, far) = open_stream(&a, &mut b, id).await;
            let writer = tokio::spawn(async move {
                let _ = stream.write_all(&vec![1; 1 << 20]).await;
                stream
            });
            stalled.push((writer, far));
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let crossed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let (mut live, mut far) = open_stream(&a, &mut b, 1000).await;
            live.write_all(b"hello").await.unwrap();
            let mut got = [0; 5];
            far.read_exact(&mut got).await.unwrap();
            got
        })
        .await;
        assert_eq!(crossed.ok(), Some(*b"hello"), "a live channel starved");
        assert!(stalled.iter().all(|(writer, _)| !writer.is_finished()));
    }

    #[tokio::test]
    async fn a_new_session_ends_a_stream() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (mut near, _far) = open_stream(&a, &mut b, 1).await;
        a.channels.reset();
        let mut buf = [0; 8];
        assert_eq!(near.read(&mut buf).await.unwrap(), 0);
        let error = near.write_all(b"late").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_stalled_channel_does_not_stall_another() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (mut stalled, _far_never_read) = open(&a, &mut b, 1).await;
        let (mut live, mut live_far) = open(&a, &mut b, 2).await;
        // Fill channel 1 past its window and the far pipe: its writer blocks.
        tokio::spawn(async move {
            let _ = stalled.write_all(&vec![0; 4 * 1024 * 1024]).await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        live.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            live_far.read_exact(&mut buf),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[tokio::test]
    async fn a_reset_closes_every_channel_and_drops_old_frames() {
        let (a, mut b) = link();
        start(&a, &b).await;
        let (_near, mut far) = open(&a, &mut b, 1).await;
        b.channels.reset();
        let mut buf = Vec::new();
        // The far end sees its channel end.
        tokio::time::timeout(std::time::Duration::from_secs(5), far.read_to_end(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(b.channels.is_empty());
        // The id can be opened again in the new session.
        b.channels
            .outbox()
            .start_session(&LinkFrame::Attach { session: 2 }, 0)
            .await;
        assert!(b.channels.open(1).is_ok());
    }

    #[test]
    fn data_past_the_window_and_excess_credit_are_violations() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (outbox, _rx) = Outbox::new();
            let table = Channels::new(outbox);
            let _ch = table.open(5).unwrap();
            let empty = LinkFrame::Data {
                channel: 5,
                bytes: Vec::new(),
            };
            assert_eq!(table.deliver(empty), Delivery::Violation, "an empty frame");
            let _ch = table.open(5).unwrap();
            // Tiny frames cost at least MIN_FRAME_CHARGE each.
            let tiny_per_window = CHANNEL_WINDOW_BYTES as usize / MIN_FRAME_CHARGE;
            for _ in 0..tiny_per_window {
                let one = LinkFrame::Data {
                    channel: 5,
                    bytes: vec![1],
                };
                assert_eq!(table.deliver(one), Delivery::Delivered);
            }
            let one_more = LinkFrame::Data {
                channel: 5,
                bytes: vec![1],
            };
            assert_eq!(table.deliver(one_more), Delivery::Violation);
            let _ch = table.open(5).unwrap();
            let chunk = vec![0; LINK_DATA_BYTES];
            let per_window = CHANNEL_WINDOW_BYTES as usize / LINK_DATA_BYTES;
            for _ in 0..per_window {
                let data = LinkFrame::Data {
                    channel: 5,
                    bytes: chunk.clone(),
                };
                assert_eq!(table.deliver(data), Delivery::Delivered);
            }
            let over = LinkFrame::Data {
                channel: 5,
                bytes: vec![0],
            };
            assert_eq!(table.deliver(over), Delivery::Violation);
            assert!(table.is_empty());
            let _ch = table.open(6).unwrap();
            let credit = LinkFrame::Credit {
                channel: 6,
                bytes: u32::MAX,
            };
            assert_eq!(table.deliver(credit), Delivery::Violation);
            let stale = LinkFrame::Eof { channel: 99 };
            assert_eq!(table.deliver(stale), Delivery::Unknown);
            let _again = table.open(6).unwrap();
            assert_eq!(table.open(6).err(), Some(OpenError::InUse(6)));
        });
    }
}
