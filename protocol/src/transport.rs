//! Frames over any tokio byte stream (feature `tokio`).
//!
//! The reader owns its buffer and grows it only as bytes arrive, one read chunk at a
//! time, so an announced length costs nothing until its bytes are really sent (a
//! peer that announces 4 MiB and stalls holds one chunk, not 4 MiB), and it gives a
//! large buffer back once the frame that needed it is consumed. It returns `Ok(None)`
//! on a clean end of stream, and an error when the stream ends inside a frame or
//! loses frame sync (an oversize length prefix, reported first as a rejected frame).

use std::io;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{encode_into, Decoded, FrameDecoder, FrameError, LEN_PREFIX_BYTES};

/// Bytes the reader asks the stream for per read: small frames batch up, and a large
/// frame's buffer grows by this much per read as its bytes arrive.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// An idle reader keeps at most this much buffer capacity.
const IDLE_BUFFER_BYTES: usize = 2 * READ_CHUNK_BYTES;

/// Reads frames of type `T` from a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    decoder: FrameDecoder,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader that rejects frames over `max` body bytes.
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            decoder: FrameDecoder::new(max),
        }
    }

    /// Changes the frame limit, e.g. from a small pre-handshake cap to the full one.
    pub fn set_max(&mut self, max: usize) {
        self.decoder.set_max(max);
    }

    /// Bytes of buffer held now (its capacity), for memory accounting and tests.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next frame, a rejected frame, or `None` at a clean end of stream.
    ///
    /// Cancel safe: dropping the future before it completes loses no bytes.
    pub async fn read<T: DeserializeOwned>(&mut self) -> io::Result<Option<Decoded<T>>> {
        loop {
            if let Some(item) = self.next_buffered()? {
                return Ok(Some(item));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// The next frame among the bytes already read, if a whole one is there. With
    /// [`Self::fill`] and [`Self::announced_len`], a caller can admit a large frame's
    /// bytes (e.g. charge them to a memory budget) before they are read.
    pub fn next_buffered<T: DeserializeOwned>(&mut self) -> io::Result<Option<Decoded<T>>> {
        loop {
            if self.decoder.is_desynced() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "frame sync lost after an oversize frame",
                ));
            }
            let (used, item) = self.decoder.decode(&self.buf);
            self.buf.drain(..used);
            if self.buf.capacity() > IDLE_BUFFER_BYTES && self.buf.len() <= READ_CHUNK_BYTES {
                // The large frame that grew the buffer is gone: give the memory back.
                self.buf.shrink_to(IDLE_BUFFER_BYTES);
            }
            if item.is_some() {
                return Ok(item);
            }
            if used == 0 {
                return Ok(None);
            }
        }
    }

    /// The body length announced by the frame whose bytes are arriving, once its
    /// length prefix is in; `None` between frames. Meaningful after
    /// [`Self::next_buffered`] returned `None`.
    pub fn announced_len(&self) -> Option<usize> {
        let prefix: [u8; 4] = self.buf.get(..4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(prefix)).ok()
    }

    /// Reads what the stream has (at most one chunk); false at a clean end of
    /// stream, an error at an end inside a frame. Cancel safe: `read_buf` appends
    /// only what arrived.
    pub async fn fill(&mut self) -> io::Result<bool> {
        self.buf.reserve(READ_CHUNK_BYTES);
        let read = self.inner.read_buf(&mut self.buf).await?;
        if read == 0 {
            if self.decoder.is_mid_frame(&self.buf) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended in the middle of a frame",
                ));
            }
            return Ok(false);
        }
        Ok(true)
    }
}

impl<R> FrameReader<R> {
    /// The stream and the bytes read from it past the last frame returned: for a
    /// connection that stops carrying frames (a port pipe, see [`crate::port`]).
    pub fn into_parts(self) -> (R, Vec<u8>) {
        (self.inner, self.buf)
    }
}

/// Writes frames to a byte stream, reusing one encode buffer.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    buf: Vec<u8>,
    max: usize,
    /// Payloads queued by [`Self::queue_with_tail`]: each goes out after the bytes of
    /// `buf` up to its offset, in a vectored write.
    tails: Vec<(usize, Vec<u8>)>,
    /// Payloads written (or dropped by a failed write), for the caller to reuse.
    spent: Vec<Vec<u8>>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer that refuses frames over `max` body bytes.
    pub fn new(inner: W, max: usize) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            max,
            tails: Vec::new(),
            spent: Vec::new(),
        }
    }

    /// Encodes `msg` into the pending buffer without writing; see [`Self::flush`].
    pub fn queue<T: Serialize>(&mut self, msg: &T) -> Result<(), FrameError> {
        encode_into(msg, self.max, &mut self.buf)
    }

    /// Queues a frame whose last field is a byte string, without copying its bytes:
    /// `msg` is the frame with that byte string empty (so its encoding ends with the
    /// string's length, 0), `tail` the bytes, written after the head when flushed
    /// (copied after all into a stream without vectored writes).
    /// Once written, `tail` is among [`Self::spent_tails`]. A frame that cannot be
    /// queued so (too large, or `msg` does not end with an empty byte string) gives
    /// `tail` back with the error.
    pub fn queue_with_tail<T: Serialize>(
        &mut self,
        msg: &T,
        tail: Vec<u8>,
    ) -> Result<(), (FrameError, Vec<u8>)> {
        let start = self.buf.len();
        if let Err(error) = encode_into(msg, self.max, &mut self.buf) {
            return Err((error, tail));
        }
        let mut varint = [0u8; 10];
        let length = match postcard::to_slice(&tail.len(), &mut varint) {
            Ok(length) => length.len(),
            Err(error) => {
                self.buf.truncate(start);
                return Err((FrameError::Encode(error), tail));
            }
        };
        if self.buf.len() == start + LEN_PREFIX_BYTES || self.buf.last() != Some(&0) {
            self.buf.truncate(start);
            return Err((FrameError::Encode(postcard::Error::SerdeSerCustom), tail));
        }
        self.buf.pop();
        self.buf.extend_from_slice(&varint[..length]);
        let len = self.buf.len() - start - LEN_PREFIX_BYTES + tail.len();
        let prefix = match u32::try_from(len) {
            Ok(prefix) if len <= self.max => prefix,
            _ => {
                self.buf.truncate(start);
                let max = self.max;
                return Err((FrameError::TooLarge { len, max }, tail));
            }
        };
        self.buf[start..start + LEN_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
        if self.inner.is_write_vectored() {
            self.tails.push((self.buf.len(), tail));
        } else {
            // Each piece would be a write of its own: one copy costs less.
            self.buf.extend_from_slice(&tail);
            self.spent.push(tail);
        }
        Ok(())
    }

    /// The payloads of [`Self::queue_with_tail`] that were written (or lost to a
    /// failed write) since the last call.
    pub fn spent_tails(&mut self) -> std::vec::Drain<'_, Vec<u8>> {
        self.spent.drain(..)
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.buf.len() + self.tails.iter().map(|(_, tail)| tail.len()).sum::<usize>()
    }

    /// Bytes of buffer held now (its capacity), for memory accounting and tests.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Writes everything queued. A buffer grown by a large frame is given back
    /// afterwards, so an idle writer holds at most [`IDLE_BUFFER_BYTES`].
    pub async fn flush(&mut self) -> io::Result<()> {
        let result = self.flush_keeping_buffer().await;
        self.give_back_buffer();
        result
    }

    /// Writes everything queued and keeps the buffer as grown, for a writer that
    /// has more to send at once: giving a megabyte back after every batch and growing
    /// it again for the next costs a page fault per page each time, which under TCG
    /// was most of a streamed exec's cost in the agent. The caller calls
    /// [`Self::give_back_buffer`] once the stream pauses.
    pub async fn flush_keeping_buffer(&mut self) -> io::Result<()> {
        let result = if self.tails.is_empty() {
            self.inner.write_all(&self.buf).await
        } else {
            let result = write_gathered(&mut self.inner, &self.buf, &self.tails).await;
            self.spent
                .extend(self.tails.drain(..).map(|(_, tail)| tail));
            result
        };
        self.buf.clear();
        result?;
        self.inner.flush().await
    }

    /// Shrinks a buffer grown by large frames back to [`IDLE_BUFFER_BYTES`]; what is
    /// queued stays.
    pub fn give_back_buffer(&mut self) {
        if self.buf.capacity() > IDLE_BUFFER_BYTES {
            self.buf.shrink_to(IDLE_BUFFER_BYTES);
        }
    }

    /// Queues and writes one frame.
    pub async fn write<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        self.queue(msg)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        self.flush().await
    }

    /// The stream, for shutting it down.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The stream, for a connection that stops carrying frames; bytes queued and not
    /// flushed are dropped.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// Writes `head` with each tail inserted at its offset, in vectored writes.
async fn write_gathered<W: AsyncWrite + Unpin>(
    stream: &mut W,
    head: &[u8],
    tails: &[(usize, Vec<u8>)],
) -> io::Result<()> {
    let mut slices = Vec::with_capacity(2 * tails.len() + 1);
    let mut from = 0;
    for (at, tail) in tails {
        slices.push(io::IoSlice::new(&head[from..*at]));
        slices.push(io::IoSlice::new(tail));
        from = *at;
    }
    slices.push(io::IoSlice::new(&head[from..]));
    slices.retain(|slice| !slice.is_empty());
    let mut left = slices.as_mut_slice();
    while !left.is_empty() {
        let n = stream.write_vectored(left).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ClientFrame, ClientMsg, Request, RequestId};

    fn output_frame(id: u64, data: Vec<u8>) -> crate::message::AgentFrame {
        crate::message::AgentFrame {
            id: RequestId(id),
            msg: crate::message::AgentMsg::Event(crate::message::Event::Output(
                crate::output::OutputChunk {
                    stream: crate::output::Stream::Stderr,
                    offset: 1 << 40,
                    data,
                },
            )),
        }
    }

    /// Queues three output frames with their payloads apart into `near`, and
    /// checks `far` reads what encoding them whole gives.
    async fn frames_apart_read_back<S>(near: S, mut far: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let mut whole = Vec::new();
        for (id, data) in [(1, big.clone()), (2, b"small".to_vec()), (3, Vec::new())] {
            encode_into(&output_frame(id, data), 1 << 20, &mut whole).unwrap();
        }
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            far.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut writer = FrameWriter::new(near, 1 << 20);
        writer
            .queue_with_tail(&output_frame(1, Vec::new()), big.clone())
            .unwrap();
        writer.queue(&output_frame(2, b"small".to_vec())).unwrap();
        writer
            .queue_with_tail(&output_frame(3, Vec::new()), Vec::new())
            .unwrap();
        assert_eq!(writer.queued_bytes(), whole.len());
        writer.flush().await.unwrap();
        let spent: Vec<_> = writer.spent_tails().collect();
        assert_eq!(spent, vec![big.clone(), Vec::new()]);
        writer.get_mut().shutdown().await.unwrap();
        drop(writer);
        assert_eq!(reader.await.unwrap(), whole);
    }

    #[tokio::test]
    async fn a_frame_queued_with_its_payload_apart_is_the_same_bytes() {
        // Vectored writes (a socket), in as many parts as the socket takes.
        let (near, far) = tokio::net::UnixStream::pair().unwrap();
        frames_apart_read_back(near, far).await;
        // A stream without vectored writes (copied), narrower than a frame.
        let (near, far) = tokio::io::duplex(7);
        frames_apart_read_back(near, far).await;
    }

    #[test]
    fn a_tail_that_cannot_go_apart_comes_back() {
        let mut writer = FrameWriter::new(Vec::new(), 1000);
        // The message does not end with an empty byte string.
        let frame = ClientFrame {
            id: RequestId(4),
            msg: ClientMsg::Request(Request::Ps),
        };
        let (_, tail) = writer.queue_with_tail(&frame, vec![1, 2, 3]).unwrap_err();
        assert_eq!(tail, vec![1, 2, 3]);
        // Over the limit with its tail.
        let (error, tail) = writer
            .queue_with_tail(&output_frame(1, Vec::new()), vec![0; 2000])
            .unwrap_err();
        assert!(matches!(error, FrameError::TooLarge { .. }), "{error}");
        assert_eq!(tail.len(), 2000);
        assert_eq!(writer.queued_bytes(), 0);
    }

    #[tokio::test]
    async fn reader_reports_clean_end_and_cut_frames() {
        let frame = ClientFrame {
            id: RequestId(1),
            msg: ClientMsg::Request(Request::Ps),
        };
        let bytes = crate::frame::encode(&frame, 64).unwrap();
        let mut reader = FrameReader::new(&bytes[..], 64);
        assert!(
            matches!(reader.read::<ClientFrame>().await, Ok(Some(Decoded::Frame(f))) if f == frame)
        );
        assert!(matches!(reader.read::<ClientFrame>().await, Ok(None)));

        let mut cut = FrameReader::new(&bytes[..bytes.len() - 1], 64);
        let err = cut.read::<ClientFrame>().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_cancelled_read_loses_no_bytes() {
        let frame = ClientFrame {
            id: RequestId(4),
            msg: ClientMsg::Request(Request::Ps),
        };
        let bytes = crate::frame::encode(&frame, 64).unwrap();
        let (mut client, server) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(server, 64);
        client.write_all(&bytes[..3]).await.unwrap();
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            reader.read::<ClientFrame>(),
        )
        .await;
        assert!(cut.is_err(), "half a frame is not a frame");
        client.write_all(&bytes[3..]).await.unwrap();
        assert!(
            matches!(reader.read::<ClientFrame>().await, Ok(Some(Decoded::Frame(f))) if f == frame)
        );
    }

    #[tokio::test]
    async fn a_frames_length_is_known_before_its_body_is_read() {
        let frame = ClientFrame {
            id: RequestId(9),
            msg: ClientMsg::Data(vec![7; 1000]),
        };
        let bytes = crate::frame::encode(&frame, 4096).unwrap();
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(server, 4096);
        assert_eq!(reader.announced_len(), None);
        client.write_all(&bytes[..10]).await.unwrap();
        assert!(reader.fill().await.unwrap());
        assert!(reader.next_buffered::<ClientFrame>().unwrap().is_none());
        assert_eq!(reader.announced_len(), Some(bytes.len() - 4));
        client.write_all(&bytes[10..]).await.unwrap();
        while reader.next_buffered::<ClientFrame>().unwrap().is_none() {
            assert!(reader.fill().await.unwrap());
        }
        assert_eq!(reader.announced_len(), None);
        drop(client);
        assert!(!reader.fill().await.unwrap());
    }

    #[tokio::test]
    async fn an_announced_length_costs_nothing_until_its_bytes_arrive() {
        // A prefix announcing 4 MiB, then a stall: the reader holds one chunk.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(server, 4 << 20);
        client.write_all(&(4u32 << 20).to_le_bytes()).await.unwrap();
        let read = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            reader.read::<ClientFrame>(),
        )
        .await;
        assert!(read.is_err(), "nothing to read yet");
        assert!(reader.buffer_capacity() <= 2 * READ_CHUNK_BYTES);
    }

    #[tokio::test]
    async fn a_writer_gives_back_the_buffer_a_large_frame_grew() {
        // A connection that once sent a large reply must not keep its size for life:
        // many connections each holding a past reply's buffer add up outside any budget.
        let big = ClientFrame {
            id: RequestId(1),
            msg: ClientMsg::Data(vec![7; 1 << 20]),
        };
        let mut writer = FrameWriter::new(Vec::new(), 2 << 20);
        writer.write(&big).await.unwrap();
        assert!(writer.buffer_capacity() <= IDLE_BUFFER_BYTES);
        assert_eq!(writer.inner, crate::frame::encode(&big, 2 << 20).unwrap());
        // A busy writer keeps it until told the stream paused.
        writer.queue(&big).unwrap();
        writer.flush_keeping_buffer().await.unwrap();
        assert!(writer.buffer_capacity() > 1 << 20);
        assert_eq!(writer.queued_bytes(), 0);
        writer.give_back_buffer();
        assert!(writer.buffer_capacity() <= IDLE_BUFFER_BYTES);
    }

    #[tokio::test]
    async fn a_large_frame_buffer_is_given_back_and_an_oversize_one_ends_the_stream() {
        let big = ClientFrame {
            id: RequestId(1),
            msg: ClientMsg::Data(vec![7; 1 << 20]),
        };
        let mut bytes = crate::frame::encode(&big, 2 << 20).unwrap();
        // Then an oversize prefix and a valid frame that must never be framed.
        bytes.extend((3u32 << 20).to_le_bytes());
        bytes.extend([2, 0]);
        let ps = ClientFrame {
            id: RequestId(3),
            msg: ClientMsg::Request(Request::Ps),
        };
        bytes.extend(crate::frame::encode(&ps, 64).unwrap());
        let mut reader = FrameReader::new(&bytes[..], 2 << 20);
        assert!(
            matches!(reader.read::<ClientFrame>().await, Ok(Some(Decoded::Frame(f))) if f == big)
        );
        assert!(reader.buffer_capacity() <= IDLE_BUFFER_BYTES);
        assert!(matches!(
            reader.read::<ClientFrame>().await,
            Ok(Some(Decoded::Rejected {
                id: Some(RequestId(2)),
                error: FrameError::TooLarge { .. }
            }))
        ));
        let err = reader.read::<ClientFrame>().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
