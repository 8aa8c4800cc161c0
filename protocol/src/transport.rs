//! Frames over any tokio byte stream (feature `tokio`).
//!
//! The reader owns its buffer and grows it only to the size the next frame needs,
//! never past the limit. It returns `Ok(None)` on a clean end of stream and an error
//! when the stream ends inside a frame.

use std::io;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{encode_into, Decoded, FrameDecoder, FrameError};

/// Smallest read the reader asks the stream for, so small frames batch up.
const READ_CHUNK_BYTES: usize = 64 * 1024;

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

    /// The next frame, a rejected frame, or `None` at a clean end of stream.
    pub async fn read<T: DeserializeOwned>(&mut self) -> io::Result<Option<Decoded<T>>> {
        loop {
            let (used, item) = self.decoder.decode(&self.buf);
            self.buf.drain(..used);
            if let Some(item) = item {
                return Ok(Some(item));
            }
            if used > 0 {
                continue;
            }
            let wanted = self.decoder.bytes_wanted(&self.buf).max(READ_CHUNK_BYTES);
            let start = self.buf.len();
            self.buf.resize(start.max(wanted), 0);
            let read = self.inner.read(&mut self.buf[start..]).await;
            let read = match read {
                Ok(read) => read,
                Err(error) => {
                    self.buf.truncate(start);
                    return Err(error);
                }
            };
            self.buf.truncate(start + read);
            if read == 0 {
                if self.decoder.is_mid_frame(&self.buf) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "stream ended in the middle of a frame",
                    ));
                }
                return Ok(None);
            }
        }
    }
}

/// Writes frames to a byte stream, reusing one encode buffer.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    buf: Vec<u8>,
    max: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer that refuses frames over `max` body bytes.
    pub fn new(inner: W, max: usize) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            max,
        }
    }

    /// Encodes `msg` into the pending buffer without writing; see [`Self::flush`].
    pub fn queue<T: Serialize>(&mut self, msg: &T) -> Result<(), FrameError> {
        encode_into(msg, self.max, &mut self.buf)
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        let result = self.inner.write_all(&self.buf).await;
        self.buf.clear();
        result?;
        self.inner.flush().await
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ClientFrame, ClientMsg, Request, RequestId};

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
}
