//! Framing: a `u32` little-endian body length, then a postcard body.
//!
//! Decoding is incremental and does no I/O: [`FrameDecoder::decode`] looks at the bytes
//! a transport has buffered and says how many it consumed and whether a frame (or a
//! rejected frame) came out. A frame whose declared length is over the limit is never
//! buffered: the decoder reports it at once, with its request id when the bytes after
//! the prefix show one, and from then on the stream is out of sync
//! ([`FrameDecoder::is_desynced`]): transports close it. Skipping the body instead
//! would let one bad prefix swallow up to 4 GiB of whatever follows, so later valid
//! frames would never be answered. A body that fails to decode inside a well-formed
//! length costs only that frame.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::message::RequestId;

/// Bytes in the length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;

/// Why a frame could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The declared or encoded body length is over the limit.
    #[error("Frame body of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The body length.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// The body is not a valid message.
    #[error("Malformed frame body")]
    Malformed(#[source] postcard::Error),
    /// The body held a valid message followed by extra bytes.
    #[error("Frame body has {extra} trailing bytes")]
    Trailing {
        /// How many bytes followed the message.
        extra: usize,
    },
    /// The message could not be serialized.
    #[error("Cannot encode frame")]
    Encode(#[source] postcard::Error),
}

impl FrameError {
    /// True when the body names an enum variant this side does not know: usually a
    /// newer peer sending a request this one does not implement. (serde's derived enum
    /// visitors report an unknown variant index as a custom error; among this crate's
    /// types nothing else does, because bad bools, options and UTF-8 have their own
    /// postcard errors.)
    pub fn is_unknown_variant(&self) -> bool {
        matches!(
            self,
            Self::Malformed(postcard::Error::DeserializeBadEnum | postcard::Error::SerdeDeCustom)
        )
    }
}

/// Appends one frame holding `msg` to `out`. On error `out` is left as it was.
pub fn encode_into<T: Serialize>(msg: &T, max: usize, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX_BYTES]);
    if let Err(error) = postcard::to_extend(msg, Appender(out)) {
        out.truncate(start);
        return Err(FrameError::Encode(error));
    }
    let len = out.len() - start - LEN_PREFIX_BYTES;
    let prefix = match u32::try_from(len) {
        Ok(prefix) if len <= max => prefix,
        _ => {
            out.truncate(start);
            return Err(FrameError::TooLarge { len, max });
        }
    };
    out[start..start + LEN_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
    Ok(())
}

/// Like [`encode_into`] for a message whose last field is a byte string: `head` is
/// the message up to that field's length, `tail` its bytes, appended as they are
/// (postcard writes a byte string as its length and then the bytes), so a big
/// payload is copied once, into the frame, not first into a message of its own.
pub fn encode_with_tail<T: Serialize>(
    head: &T,
    tail: &[u8],
    max: usize,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    encode_with_tails(head, &[tail], max, out)
}

/// Like [`encode_with_tail`] for a byte string in pieces (a vectored write's), in order.
pub fn encode_with_tails<T: Serialize>(
    head: &T,
    tails: &[&[u8]],
    max: usize,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let tail_len: usize = tails.iter().map(|tail| tail.len()).sum();
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX_BYTES]);
    if let Err(error) = postcard::to_extend(head, Appender(out)) {
        out.truncate(start);
        return Err(FrameError::Encode(error));
    }
    let len = out.len() - start - LEN_PREFIX_BYTES + tail_len;
    let prefix = match u32::try_from(len) {
        Ok(prefix) if len <= max => prefix,
        _ => {
            out.truncate(start);
            return Err(FrameError::TooLarge { len, max });
        }
    };
    out.reserve(tail_len);
    for tail in tails {
        out.extend_from_slice(tail);
    }
    out[start..start + LEN_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
    Ok(())
}

/// Lets postcard append to a borrowed buffer.
struct Appender<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Appender<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

/// One frame holding `msg`, as bytes ready to write.
pub fn encode<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    encode_into(msg, max, &mut out)?;
    Ok(out)
}

/// Decodes a whole frame body strictly: trailing bytes are an error.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(body).map_err(FrameError::Malformed)?;
    if rest.is_empty() {
        Ok(msg)
    } else {
        Err(FrameError::Trailing { extra: rest.len() })
    }
}

/// Reads the request id at the start of a body, when one is there: every frame type
/// starts with its id, so even a frame that fails to decode can be answered.
pub fn peek_request_id(body: &[u8]) -> Option<RequestId> {
    postcard::take_from_bytes::<RequestId>(body)
        .ok()
        .map(|(id, _)| id)
}

/// The result of [`FrameDecoder::decode`] when it produced something.
#[derive(Debug)]
pub enum Decoded<T> {
    /// A well-formed frame.
    Frame(T),
    /// A frame that was consumed but could not be decoded; `id` is its request id when
    /// it could be read, so the sender can be told which request failed.
    Rejected {
        /// The request id read from the body, if any.
        id: Option<RequestId>,
        /// Why it was rejected.
        error: FrameError,
    },
}

/// Incremental, allocation-free frame decoder with a size limit.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    /// Set by an oversize length prefix: frame boundaries are lost for good.
    desynced: bool,
}

impl FrameDecoder {
    /// A decoder that rejects bodies longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            desynced: false,
        }
    }

    /// Changes the limit, e.g. from a small pre-handshake cap to the full one.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The limit in force.
    pub fn max(&self) -> usize {
        self.max
    }

    /// True once an oversize length prefix was seen: nothing after it can be framed,
    /// and the transport must close the stream.
    pub fn is_desynced(&self) -> bool {
        self.desynced
    }

    /// True while the decoder is in the middle of a frame, so an end of stream now
    /// would cut a frame short.
    pub fn is_mid_frame(&self, buffered: &[u8]) -> bool {
        !buffered.is_empty()
    }

    /// How many bytes the buffer must hold before the next call can return a frame;
    /// transports use it to size their reads without over-allocating.
    pub fn bytes_wanted(&self, buffered: &[u8]) -> usize {
        if self.desynced {
            return 0;
        }
        match read_len(buffered) {
            Some(len) if len <= self.max => LEN_PREFIX_BYTES + len,
            _ => LEN_PREFIX_BYTES,
        }
    }

    /// Looks at `buf` and returns how many bytes of it were consumed, and the frame or
    /// rejection that came out, if any. Call again while it consumes bytes. After an
    /// oversize prefix it consumes everything and produces nothing.
    pub fn decode<T: DeserializeOwned>(&mut self, buf: &[u8]) -> (usize, Option<Decoded<T>>) {
        if self.desynced {
            return (buf.len(), None);
        }
        let Some(len) = read_len(buf) else {
            return (0, None);
        };
        let body = &buf[LEN_PREFIX_BYTES..];
        if len > self.max {
            let id = peek_request_id(&body[..body.len().min(len)]);
            self.desynced = true;
            let error = FrameError::TooLarge { len, max: self.max };
            return (buf.len(), Some(Decoded::Rejected { id, error }));
        }
        let Some(body) = body.get(..len) else {
            return (0, None);
        };
        let decoded = match decode_body(body) {
            Ok(frame) => Decoded::Frame(frame),
            Err(error) => Decoded::Rejected {
                id: peek_request_id(body),
                error,
            },
        };
        (LEN_PREFIX_BYTES + len, Some(decoded))
    }
}

fn read_len(buf: &[u8]) -> Option<usize> {
    let prefix: [u8; LEN_PREFIX_BYTES] = buf.get(..LEN_PREFIX_BYTES)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(prefix)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ClientFrame, ClientMsg, Request};

    fn ps(id: u64) -> ClientFrame {
        ClientFrame {
            id: RequestId(id),
            msg: ClientMsg::Request(Request::Ps),
        }
    }

    fn decode_all(decoder: &mut FrameDecoder, mut buf: &[u8]) -> Vec<Decoded<ClientFrame>> {
        let mut out = Vec::new();
        loop {
            let (used, item) = decoder.decode(buf);
            buf = &buf[used..];
            match item {
                Some(item) => out.push(item),
                None if used == 0 => return out,
                None => {}
            }
        }
    }

    #[test]
    fn round_trips_frames_split_at_every_byte() {
        let bytes = [encode(&ps(1), 64).unwrap(), encode(&ps(2), 64).unwrap()].concat();
        for split in 0..bytes.len() {
            let mut decoder = FrameDecoder::new(64);
            let mut buffer = bytes[..split].to_vec();
            let mut frames = Vec::new();
            for chunk in [&bytes[split..], &[][..]] {
                loop {
                    let (used, item) = decoder.decode::<ClientFrame>(&buffer);
                    buffer.drain(..used);
                    match item {
                        Some(Decoded::Frame(frame)) => frames.push(frame),
                        Some(Decoded::Rejected { error, .. }) => panic!("{error}"),
                        None if used == 0 => break,
                        None => {}
                    }
                }
                buffer.extend_from_slice(chunk);
            }
            assert_eq!(frames, vec![ps(1), ps(2)], "split at {split}");
        }
    }

    #[test]
    fn trailing_bytes_are_rejected_with_the_request_id() {
        let mut body = postcard::to_allocvec(&ps(9)).unwrap();
        body.push(0);
        let mut frame = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame.extend(encode(&ps(10), 64).unwrap());
        let out = decode_all(&mut FrameDecoder::new(64), &frame);
        assert!(matches!(
            &out[0],
            Decoded::Rejected {
                id: Some(RequestId(9)),
                error: FrameError::Trailing { extra: 1 }
            }
        ));
        assert!(matches!(&out[1], Decoded::Frame(f) if *f == ps(10)));
    }

    #[test]
    fn an_oversize_frame_is_rejected_without_buffering_and_desyncs_the_stream() {
        let mut decoder = FrameDecoder::new(16);
        let mut bytes = 1000u32.to_le_bytes().to_vec();
        bytes.extend(postcard::to_allocvec(&RequestId(5)).unwrap());
        bytes.resize(4 + 1000, 0xAA);
        bytes.extend(encode(&ps(6), 16).unwrap());
        // Feed in 7-byte slices, as a slow transport would.
        let mut out = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        for chunk in bytes.chunks(7) {
            pending.extend_from_slice(chunk);
            loop {
                let (used, item) = decoder.decode::<ClientFrame>(&pending);
                pending.drain(..used);
                if let Some(item) = item {
                    out.push(item);
                } else if used == 0 {
                    break;
                }
            }
            assert!(pending.len() < 16 + 4, "decoder buffered an oversize body");
        }
        // The rejection names the request; the valid frame after it is not framed,
        // because the stream's boundaries are gone.
        assert!(matches!(
            &out[..],
            [Decoded::Rejected {
                id: Some(RequestId(5)),
                error: FrameError::TooLarge { len: 1000, max: 16 }
            }]
        ));
        assert!(decoder.is_desynced());
        assert_eq!(decoder.bytes_wanted(&[]), 0);
    }

    #[test]
    fn a_raised_limit_accepts_what_the_small_one_refused() {
        let frame = encode(&ps(1), 64).unwrap();
        let mut decoder = FrameDecoder::new(1);
        decoder.set_max(64);
        assert_eq!(decoder.max(), 64);
        let out = decode_all(&mut decoder, &frame);
        assert!(matches!(&out[..], [Decoded::Frame(f)] if *f == ps(1)));
    }

    #[test]
    fn an_unknown_request_variant_is_recognized_as_such() {
        // id 3, ClientMsg::Request (1), request variant 200 (a varint: 0xC8 0x01).
        let body = [3u8, 1, 0xC8, 0x01];
        let mut frame = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        let out = decode_all(&mut FrameDecoder::new(64), &frame);
        match &out[0] {
            Decoded::Rejected {
                id: Some(RequestId(3)),
                error,
            } => assert!(error.is_unknown_variant(), "{error:?}"),
            other => panic!("{other:?}"),
        }
        // A truncated body is malformed, not unknown.
        let frame_err = decode_body::<ClientFrame>(&[3u8, 1]).unwrap_err();
        assert!(!frame_err.is_unknown_variant());
    }

    #[test]
    fn garbage_body_is_rejected_and_the_stream_goes_on() {
        let mut bytes = vec![3, 0, 0, 0, 0x07, 0xFF, 0xFF];
        bytes.extend(encode(&ps(1), 64).unwrap());
        let out = decode_all(&mut FrameDecoder::new(64), &bytes);
        assert!(matches!(
            &out[0],
            Decoded::Rejected {
                id: Some(RequestId(7)),
                ..
            }
        ));
        assert!(matches!(&out[1], Decoded::Frame(f) if *f == ps(1)));
    }

    #[test]
    fn encode_refuses_oversize_messages_and_keeps_what_was_queued() {
        let mut out = encode(&ps(1), 64).unwrap();
        let queued = out.clone();
        let err = encode_into(&vec![0u8; 100], 10, &mut out).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: 10, .. }));
        assert_eq!(out, queued);
    }
}
