//! One channel as a byte stream of this process ([`ChannelStream`]).
//!
//! [`Channel::splice`] joins a channel to a stream someone else reads and writes (a
//! client's socket on the host). The agent serves each channel with its ordinary
//! connection handler; spliced to it over an in-memory pipe, every byte it wrote
//! was copied into the pipe, out of the pipe and into a `Data` frame, with a switch
//! to the splice's task at each pipe-full, and every byte it read took the same two
//! extra copies the other way. A `ChannelStream` is the handler's stream itself: a
//! write becomes a `Data` frame at once, a read comes straight out of the frame the
//! link delivered. The rules stay the splice's: a `Data` frame is sent only against
//! the peer's credit, credit goes back once the reader has consumed a batch, a
//! shutdown is the channel's `Eof`, and the peer's `Close` or a new session ends the
//! stream (reads see its end, writes fail).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::{PollSemaphore, PollSender};

use super::{frame_charge, Channel, Channels, Outgoing};
use crate::link::{
    encode_data_parts, encode_frame, ChannelId, LinkFrame, CREDIT_BATCH_BYTES,
    DATA_FRAME_OVERHEAD_BYTES,
};

/// Payload of the `Data` frames a stream writes: a whole frame is then at most 32
/// KiB, what one write into a virtio-serial port takes (the port's driver cuts a
/// longer write there, so a 32 KiB payload plus its head took two writes, each a
/// VM exit).
const STREAM_DATA_BYTES: usize = 32 * 1024 - DATA_FRAME_OVERHEAD_BYTES;

/// A channel read and written in place; see the module docs.
pub struct ChannelStream {
    id: ChannelId,
    session: u64,
    table: Arc<Channels>,
    /// `None` once the stream is dropped (moved to the task that sees the channel out).
    inbound: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    /// The incoming frame being read, and how much of it was.
    reading: Vec<u8>,
    read_at: usize,
    /// Charges of the frames read whose credit has not been granted back yet.
    drained: u32,
    unacknowledged: Arc<AtomicU32>,
    /// The peer's `Eof` (or the channel's end) was read.
    read_ended: bool,
    /// Room in the link's queue: one sender for the read side's `Credit` frames and
    /// one for the write side's `Data` and `Eof`, so that each side's waiting wakes
    /// its own task.
    credit_tx: PollSender<Outgoing>,
    data_tx: PollSender<Outgoing>,
    /// The peer's credit for this side's `Data`; closed when the channel ends.
    credit: PollSemaphore,
    /// This side's `Eof` was sent.
    write_ended: bool,
    /// Credit taken for a `Data` frame still waiting for room in the queue.
    held: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for ChannelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelStream")
            .field("id", &self.id)
            .field("session", &self.session)
            .field("read_ended", &self.read_ended)
            .field("write_ended", &self.write_ended)
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// The channel as a stream this process reads and writes itself (see
    /// [`ChannelStream`]); when dropped, the channel ends as a splice's would once
    /// its stream was gone.
    pub fn into_stream(self) -> ChannelStream {
        let Self {
            id,
            session,
            inbound,
            unacknowledged,
            credit,
            aborted: _,
            table,
        } = self;
        let tx = table.outbox.tx.clone();
        ChannelStream {
            id,
            session,
            inbound: Some(inbound),
            reading: Vec::new(),
            read_at: 0,
            drained: 0,
            unacknowledged,
            read_ended: false,
            credit_tx: PollSender::new(tx.clone()),
            data_tx: PollSender::new(tx),
            credit: PollSemaphore::new(credit),
            write_ended: false,
            held: None,
            table,
        }
    }
}

/// What a failed send to a gone writer or a closed channel is to the stream's user.
fn ended() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the link channel is closed")
}

/// A control frame's bytes (`Credit`, `Eof`: they always encode).
fn encoded(frame: &LinkFrame) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    encode_frame(frame, &mut bytes).map_err(io::Error::other)?;
    Ok(bytes)
}

impl ChannelStream {
    /// Grants the peer the credit of what was read, once it makes a batch. The
    /// window is reopened on this side before the `Credit` goes out, so the peer's
    /// next `Data` can never arrive first and look like a violation.
    fn poll_grant(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.drained < CREDIT_BATCH_BYTES {
            return Poll::Ready(Ok(()));
        }
        let bytes = encoded(&LinkFrame::Credit {
            channel: self.id,
            bytes: self.drained,
        })?;
        ready!(self.credit_tx.poll_reserve(cx)).map_err(|_| ended())?;
        self.unacknowledged
            .fetch_sub(self.drained, Ordering::AcqRel);
        self.drained = 0;
        self.credit_tx
            .send_item(Outgoing {
                session: self.session,
                bytes,
            })
            .map_err(|_| ended())?;
        Poll::Ready(Ok(()))
    }

    /// Grants what is owed if the link's queue has room now; else leaves it to the
    /// next read, giving up the place in the queue's line (a reader that stops
    /// reading must not hold a slot of the queue every channel shares).
    fn grant_if_room(&mut self, cx: &mut Context<'_>) {
        if self.poll_grant(cx).is_pending() {
            self.credit_tx.abort_send();
        }
    }
}

impl AsyncRead for ChannelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Owed credit first: a reader must not run a window ahead of its grants.
        ready!(this.poll_grant(cx))?;
        loop {
            let left = &this.reading[this.read_at..];
            if !left.is_empty() {
                let n = left.len().min(buf.remaining());
                buf.put_slice(&left[..n]);
                this.read_at += n;
                if this.read_at == this.reading.len() {
                    this.drained = this
                        .drained
                        .saturating_add(frame_charge(this.reading.len()));
                    this.reading = Vec::new();
                    this.read_at = 0;
                    // Sent now if the queue has room, else at the next read (whose
                    // bytes wait for it). A failure shows there too, not here,
                    // where the bytes are already copied out.
                    this.grant_if_room(cx);
                }
                return Poll::Ready(Ok(()));
            }
            let Some(inbound) = this.inbound.as_mut().filter(|_| !this.read_ended) else {
                return Poll::Ready(Ok(()));
            };
            match ready!(inbound.poll_recv(cx)) {
                Some(bytes) => {
                    this.reading = bytes;
                    this.read_at = 0;
                }
                None => {
                    this.read_ended = true;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

impl AsyncWrite for ChannelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    /// Gathers the pieces into one `Data` frame (of up to [`STREAM_DATA_BYTES`]):
    /// a connection writes a frame's head and a big payload as two pieces, copied
    /// once, here.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.write_ended {
            return Poll::Ready(Err(ended()));
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(bufs.len().min(8));
        let mut n = 0;
        for buf in bufs {
            let take = buf.len().min(STREAM_DATA_BYTES - n);
            if take > 0 {
                parts.push(&buf[..take]);
                n += take;
            }
            if n == STREAM_DATA_BYTES {
                break;
            }
        }
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        // The peer's credit first (this channel's own), kept across a wait for the
        // queue; then a slot of the queue every channel shares, held only once the
        // frame can go: a channel waiting for credit must not sit on a slot.
        let charge = frame_charge(n);
        if this
            .held
            .as_ref()
            .is_some_and(|held| held.num_permits() != charge as usize)
        {
            // A retry with another size: give the permits back, take the right count.
            this.held = None;
        }
        if this.held.is_none() {
            let Some(permit) = ready!(this.credit.poll_acquire_many(cx, charge)) else {
                return Poll::Ready(Err(ended()));
            };
            this.held = Some(permit);
        }
        ready!(this.data_tx.poll_reserve(cx)).map_err(|_| ended())?;
        let mut frame = this.table.outbox.data_buffer();
        if let Err(error) = encode_data_parts(this.id, &parts, &mut frame) {
            // `n` is within a frame's limit: not expected.
            this.data_tx.abort_send();
            return Poll::Ready(Err(io::Error::other(error)));
        }
        this.data_tx
            .send_item(Outgoing {
                session: this.session,
                bytes: frame,
            })
            .map_err(|_| ended())?;
        // Spent: it comes back as the peer's `Credit`.
        if let Some(permit) = this.held.take() {
            permit.forget();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Each write is queued whole for the link's writer, which writes as it goes.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.write_ended {
            return Poll::Ready(Ok(()));
        }
        ready!(this.data_tx.poll_reserve(cx)).map_err(|_| ended())?;
        let bytes = match encoded(&LinkFrame::Eof { channel: this.id }) {
            Ok(bytes) => bytes,
            Err(error) => {
                this.data_tx.abort_send();
                return Poll::Ready(Err(error));
            }
        };
        this.data_tx
            .send_item(Outgoing {
                session: this.session,
                bytes,
            })
            .map_err(|_| ended())?;
        this.write_ended = true;
        Poll::Ready(Ok(()))
    }
}

impl Drop for ChannelStream {
    /// Sees the channel out as a splice whose stream is gone would: this side's
    /// `Eof` (when not sent yet), then the peer's own `Eof` is awaited; anything it
    /// sends before that has no reader, and closes the channel.
    fn drop(&mut self) {
        if self.credit.clone_inner().is_closed() {
            // The channel already left the table (the peer's `Close`, a new session).
            return;
        }
        let (id, session, table) = (self.id, self.session, self.table.clone());
        let inbound = self.inbound.take().filter(|_| !self.read_ended);
        let send_eof = !self.write_ended;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to wait in (a test's teardown): close at once.
            if table.remove(id, Some(session)) {
                table
                    .outbox
                    .try_send(session, &LinkFrame::Close { channel: id });
            }
            return;
        };
        runtime.spawn(async move {
            let outbox = table.outbox.clone();
            if send_eof {
                outbox.send(session, &LinkFrame::Eof { channel: id }).await;
            }
            if let Some(mut inbound) = inbound {
                if inbound.recv().await.is_some() {
                    outbox
                        .send(session, &LinkFrame::Close { channel: id })
                        .await;
                }
            }
            table.remove(id, Some(session));
        });
    }
}
