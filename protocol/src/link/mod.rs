//! The link: many host connections over one byte stream that cannot be reopened.
//!
//! A snapshot-capable microVM has no vsock device (vhost-user-vsock blocks migration);
//! the agent is reached over one virtio-serial port instead. A port is a single
//! ordered byte stream with a single host peer, and it survives a checkpoint: the
//! source VM's host end keeps its connection, and a VM restored from the snapshot gets
//! a new host end. The link carries many *channels* over that stream, each one what a
//! Unix or vsock connection is elsewhere (its own `Hello`, its own requests, a
//! disconnect cancels its execs), so everything above the transport is unchanged.
//!
//! # Frames
//! A link frame is a `u32` little-endian body length (1..=[`LINK_FRAME_BYTES`]) and a
//! postcard [`LinkFrame`]; a zero length is padding and is skipped. A session starts with [`LINK_SYNC`], eight bytes that can
//! never begin a frame (as a length they are far over the limit), followed by the
//! host's [`LinkFrame::Attach`]; the agent answers with the same marker and
//! [`LinkFrame::Attached`] carrying the session's nonce and its [`Ready`].
//!
//! # Sessions, and why the marker
//! A VM restored from a snapshot resumes with whatever the agent had buffered at the
//! checkpoint: perhaps half a frame from the old host end, and frames of channels that
//! belonged to the old host's clients. So each side, whenever it meets a length it
//! cannot believe or a body it cannot decode, drops every channel and *hunts*: it
//! skips bytes until the next marker. The host sends the marker and `Attach` again
//! (after a run of zeros long enough to finish any half frame, see
//! [`LinkDecoder`]) until the agent answers; everything the host reads before the
//! `Attached` with its own nonce belongs to an older session and is discarded. An
//! `Attach` always starts a fresh session: the agent closes every channel of the old
//! one, as if all their clients had disconnected; processes they spawned live on.
//!
//! # Channels and flow control
//! The host opens a channel per client ([`LinkFrame::Open`]). Each direction of a
//! channel has a window of [`CHANNEL_WINDOW_BYTES`]: a side sends `Data` only against
//! credit the receiver granted ([`LinkFrame::Credit`], as its consumer drains the
//! bytes), so a client that stops reading stalls its own channel and never the stream
//! the others share. A receiver that is sent more than it granted closes the channel.
//! `Eof` ends one direction (a half close); `Close` ends both at once.

pub mod egress;
#[cfg(feature = "tokio")]
pub mod mux;

use serde::{Deserialize, Serialize};

use crate::frame::{decode_body, encode_into, encode_with_tails, FrameError, LEN_PREFIX_BYTES};
use crate::ready::Ready;

/// Starts every session, in both directions. As a length prefix its first four bytes
/// read 0x5842_53ff, far over [`LINK_FRAME_BYTES`], so at a frame boundary it is never
/// mistaken for a frame.
pub const LINK_SYNC: [u8; 8] = *b"\xffSBXLNK\x01";

/// Largest link frame body: one full data chunk plus its envelope.
pub const LINK_FRAME_BYTES: usize = LINK_DATA_BYTES + 64;

/// Largest payload of one `Data` frame. Small enough that one channel's burst delays
/// the others by at most this much on the shared stream.
pub const LINK_DATA_BYTES: usize = 32 * 1024;

/// Bytes a sender may have in flight on one direction of one channel before the
/// receiver grants more: what a slow client costs the receiving side at most.
pub const CHANNEL_WINDOW_BYTES: u32 = 256 * 1024;

/// A receiver grants credit once its consumer has drained this much.
pub const CREDIT_BATCH_BYTES: u32 = CHANNEL_WINDOW_BYTES / 4;

/// Channels open at once in one session: the agent's served and pending connection
/// limits together, plus its port pipes and the egress connections it opens. The
/// host refuses clients past it; the agent closes extra opens.
pub const MAX_CHANNELS: usize = crate::limits::MAX_CONNECTIONS
    + 16
    + crate::port::MAX_PORT_CONNECTIONS
    + egress::MAX_EGRESS_CONNECTIONS;

/// Zeros the host sends before a repeated `Attach`: they complete any half frame the
/// agent holds (its remaining body is at most [`LINK_FRAME_BYTES`]); at a frame
/// boundary each run of four zeros is an empty frame, which receivers skip, so
/// padding that reaches an agent in sync costs nothing.
pub const ATTACH_PADDING_BYTES: usize = LINK_FRAME_BYTES + LEN_PREFIX_BYTES;

/// A channel's number, unique within a session: the host numbers the channels it
/// opens below [`egress::EGRESS_CHANNEL_BIT`], the agent its egress channels above.
pub type ChannelId = u32;

/// One link frame. Variants and fields are pinned on the wire like the protocol's
/// (see the crate docs); append, never reorder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkFrame {
    /// Host → agent, right after [`LINK_SYNC`]: start a fresh session.
    Attach {
        /// Random per attempt; echoed in `Attached`.
        session: u64,
    },
    /// Agent → host, right after [`LINK_SYNC`]: the session is open.
    Attached {
        /// The `Attach`'s nonce.
        session: u64,
        /// What the agent would have sent on vsock's readiness port.
        ready: Ready,
    },
    /// Host → agent: a client connected.
    Open {
        /// Its channel.
        channel: ChannelId,
    },
    /// Bytes of one channel, within the credit the receiver granted.
    Data {
        /// The channel.
        channel: ChannelId,
        /// At most [`LINK_DATA_BYTES`].
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// The receiver drained `bytes` of a channel: the sender may send that much more.
    Credit {
        /// The channel.
        channel: ChannelId,
        /// Bytes granted.
        bytes: u32,
    },
    /// The sender will send no more on this channel (the other direction goes on).
    Eof {
        /// The channel.
        channel: ChannelId,
    },
    /// The channel is gone in both directions.
    Close {
        /// The channel.
        channel: ChannelId,
    },
    /// Host → agent, after `Attached`: whether this VM has egress (see [`egress`]).
    /// Sent only when it does.
    Network {
        /// Serve the proxy and point programs at it.
        egress: bool,
    },
    /// Agent → host: open the agent's channel `channel` to `host:port`.
    Dial {
        /// The channel (with [`egress::EGRESS_CHANNEL_BIT`] set).
        channel: ChannelId,
        /// A name or an IP literal, as the program gave it; at most
        /// [`egress::DIAL_HOST_MAX_BYTES`].
        host: String,
        /// The port.
        port: u16,
    },
    /// Host → agent: how the `Dial` of `channel` ended.
    Dialed {
        /// The channel.
        channel: ChannelId,
        /// Connected, or why not.
        outcome: egress::DialOutcome,
    },
    /// Agent → host: the proxy refused a program's request before any dial (not
    /// HTTP, a method it does not proxy...), for the host's egress log.
    ProxyRefused {
        /// What was wrong; at most [`egress::PROXY_NOTE_MAX_BYTES`].
        note: String,
    },
}

/// Appends one link frame to `out`.
pub fn encode_frame(frame: &LinkFrame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    encode_into(frame, LINK_FRAME_BYTES, out)
}

/// The variant index of [`LinkFrame::Data`] on the wire.
const DATA_VARIANT: u32 = 3;

/// Appends the frame `encode_frame` makes of a [`LinkFrame::Data`] of `bytes`,
/// copying them once, straight from the caller's buffer.
pub fn encode_data(channel: ChannelId, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
    encode_data_parts(channel, &[bytes], out)
}

/// Like [`encode_data`] for bytes in pieces (a vectored write's), in order.
pub fn encode_data_parts(
    channel: ChannelId,
    parts: &[&[u8]],
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    encode_with_tails(&(DATA_VARIANT, channel, len), parts, LINK_FRAME_BYTES, out)
}

/// The most a [`LinkFrame::Data`] frame adds to its payload on the wire: the
/// length prefix, the variant, the channel and the payload's length (varints).
pub const DATA_FRAME_OVERHEAD_BYTES: usize = LEN_PREFIX_BYTES + 1 + 5 + 5;

/// Appends the session marker and then `frame` (an `Attach` or `Attached`).
pub fn encode_session_start(frame: &LinkFrame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&LINK_SYNC);
    encode_frame(frame, out).inspect_err(|_| out.truncate(start))
}

/// What [`LinkDecoder::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum LinkItem {
    /// A well-formed frame.
    Frame(LinkFrame),
    /// The session marker: a session-start frame follows.
    Sync,
    /// The stream lost frame sync (an unbelievable length or an undecodable body):
    /// the receiver drops its session; the decoder now skips to the next marker.
    Desync,
}

/// Incremental decoder of the link's byte stream. Like [`crate::frame::FrameDecoder`]
/// it does no I/O: it looks at the buffered bytes and says how many it used.
#[derive(Debug, Default)]
pub struct LinkDecoder {
    /// Skipping bytes until the next [`LINK_SYNC`].
    hunting: bool,
}

impl LinkDecoder {
    /// A decoder at a frame boundary.
    pub fn new() -> Self {
        Self::default()
    }

    /// Skips to the next marker from here on.
    pub fn hunt(&mut self) {
        self.hunting = true;
    }

    /// True while skipping to the next marker.
    pub fn is_hunting(&self) -> bool {
        self.hunting
    }

    /// Decodes from the start of `buf`: (bytes consumed, what came out). `(0, None)`
    /// means more bytes are needed; consumed bytes with `None` were skipped while
    /// hunting.
    pub fn decode(&mut self, buf: &[u8]) -> (usize, Option<LinkItem>) {
        if self.hunting {
            return match find(buf, &LINK_SYNC) {
                Some(at) => {
                    self.hunting = false;
                    (at + LINK_SYNC.len(), Some(LinkItem::Sync))
                }
                // Keep a tail that may be the start of a marker split across reads.
                None => (buf.len().saturating_sub(LINK_SYNC.len() - 1), None),
            };
        }
        let Some(prefix) = buf.first_chunk::<LEN_PREFIX_BYTES>() else {
            return (0, None);
        };
        if prefix[..] == LINK_SYNC[..LEN_PREFIX_BYTES] {
            return match buf.first_chunk::<8>() {
                None => (0, None),
                Some(marker) if *marker == LINK_SYNC => (LINK_SYNC.len(), Some(LinkItem::Sync)),
                Some(_) => self.desync(),
            };
        }
        let len = u32::from_le_bytes(*prefix) as usize;
        if len == 0 {
            // Padding (see ATTACH_PADDING_BYTES).
            return (LEN_PREFIX_BYTES, None);
        }
        if len > LINK_FRAME_BYTES {
            return self.desync();
        }
        let Some(body) = buf.get(LEN_PREFIX_BYTES..LEN_PREFIX_BYTES + len) else {
            return (0, None);
        };
        match decode_body::<LinkFrame>(body) {
            Ok(frame) => (LEN_PREFIX_BYTES + len, Some(LinkItem::Frame(frame))),
            Err(_) => {
                let (_, item) = self.desync();
                (LEN_PREFIX_BYTES + len, item)
            }
        }
    }

    fn desync(&mut self) -> (usize, Option<LinkItem>) {
        self.hunting = true;
        (0, Some(LinkItem::Desync))
    }
}

/// The first position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_frame_encoded_from_a_slice_is_the_data_frame() {
        for len in [0usize, 1, 127, 128, 16_384, LINK_DATA_BYTES] {
            let bytes: Vec<u8> = (0..=250u8).cycle().take(len).collect();
            for channel in [0, 1, 300, ChannelId::MAX] {
                let mut framed = vec![7];
                encode_frame(
                    &LinkFrame::Data {
                        channel,
                        bytes: bytes.clone(),
                    },
                    &mut framed,
                )
                .unwrap();
                let mut direct = vec![7];
                encode_data(channel, &bytes, &mut direct).unwrap();
                assert_eq!(direct, framed, "len {len}, channel {channel}");
            }
        }
        let mut out = vec![1, 2];
        let over = vec![0; LINK_FRAME_BYTES];
        assert!(matches!(
            encode_data(1, &over, &mut out),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(out, [1, 2], "a refused frame leaves nothing");
    }

    fn ready() -> Ready {
        Ready {
            magic: crate::MAGIC,
            version: crate::PROTOCOL_VERSION,
            agent_version: "1".into(),
            boot_id: "b".into(),
            uptime_ms: 5,
        }
    }

    fn decode_all(decoder: &mut LinkDecoder, mut buf: &[u8]) -> Vec<LinkItem> {
        let mut items = Vec::new();
        loop {
            let (used, item) = decoder.decode(buf);
            buf = &buf[used..];
            match item {
                Some(item) => items.push(item),
                None if used == 0 => return items,
                None => {}
            }
        }
    }

    #[test]
    fn frames_are_pinned_on_the_wire() {
        let mut out = Vec::new();
        encode_frame(&LinkFrame::Open { channel: 3 }, &mut out).unwrap();
        encode_frame(
            &LinkFrame::Data {
                channel: 3,
                bytes: vec![7, 8],
            },
            &mut out,
        )
        .unwrap();
        encode_frame(
            &LinkFrame::Credit {
                channel: 1,
                bytes: 65536,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [2, 0, 0, 0, 2, 3, 5, 0, 0, 0, 3, 3, 2, 7, 8, 5, 0, 0, 0, 4, 1, 128, 128, 4]
        );
        let mut out = Vec::new();
        encode_session_start(&LinkFrame::Attach { session: 1 }, &mut out).unwrap();
        assert_eq!(out, b"\xffSBXLNK\x01\x02\x00\x00\x00\x00\x01");
    }

    #[test]
    fn egress_frames_are_pinned_on_the_wire() {
        let mut out = Vec::new();
        encode_frame(&LinkFrame::Network { egress: true }, &mut out).unwrap();
        encode_frame(
            &LinkFrame::Dial {
                channel: egress::EGRESS_CHANNEL_BIT | 1,
                host: "a.io".into(),
                port: 443,
            },
            &mut out,
        )
        .unwrap();
        encode_frame(
            &LinkFrame::Dialed {
                channel: 2,
                outcome: egress::DialOutcome::Refused {
                    kind: egress::DialRefusal::Denied,
                    message: "no".into(),
                },
            },
            &mut out,
        )
        .unwrap();
        encode_frame(&LinkFrame::ProxyRefused { note: "x".into() }, &mut out).unwrap();
        assert_eq!(
            out,
            [
                2, 0, 0, 0, 7, 1, // Network
                13, 0, 0, 0, 8, 129, 128, 128, 128, 8, 4, b'a', b'.', b'i', b'o', 187,
                3, // Dial
                7, 0, 0, 0, 9, 2, 1, 0, 2, b'n', b'o', // Dialed
                3, 0, 0, 0, 10, 1, b'x', // ProxyRefused
            ]
        );
    }

    #[test]
    fn a_session_start_then_frames_decode_in_order() {
        let mut out = Vec::new();
        encode_session_start(
            &LinkFrame::Attached {
                session: 9,
                ready: ready(),
            },
            &mut out,
        )
        .unwrap();
        encode_frame(&LinkFrame::Eof { channel: 1 }, &mut out).unwrap();
        let mut decoder = LinkDecoder::new();
        assert_eq!(
            decode_all(&mut decoder, &out),
            [
                LinkItem::Sync,
                LinkItem::Frame(LinkFrame::Attached {
                    session: 9,
                    ready: ready()
                }),
                LinkItem::Frame(LinkFrame::Eof { channel: 1 }),
            ]
        );
        // Byte by byte: the same, and nothing is consumed before it is complete.
        let mut decoder = LinkDecoder::new();
        let mut buf = Vec::new();
        let mut items = Vec::new();
        for &b in &out {
            buf.push(b);
            loop {
                let (used, item) = decoder.decode(&buf);
                buf.drain(..used);
                match item {
                    Some(item) => items.push(item),
                    None => break,
                }
            }
        }
        assert_eq!(items.len(), 3);
        assert!(buf.is_empty());
    }

    #[test]
    fn garbage_desyncs_once_then_the_next_marker_resyncs() {
        let mut decoder = LinkDecoder::new();
        // Padding, then a length over the limit.
        let mut stream = vec![0, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3];
        stream.extend_from_slice(&[0xff, b'S', b'B']); // a marker's start, not a marker
        let mut start = Vec::new();
        encode_session_start(&LinkFrame::Attach { session: 4 }, &mut start).unwrap();
        stream.extend_from_slice(&start);
        assert_eq!(
            decode_all(&mut decoder, &stream),
            [
                LinkItem::Desync,
                LinkItem::Sync,
                LinkItem::Frame(LinkFrame::Attach { session: 4 })
            ]
        );
    }

    #[test]
    fn a_half_frame_before_a_padded_restart_is_swallowed_then_resynced() {
        // The agent was restored holding the start of a large frame.
        let mut old = Vec::new();
        encode_frame(
            &LinkFrame::Data {
                channel: 1,
                bytes: vec![1; LINK_DATA_BYTES],
            },
            &mut old,
        )
        .unwrap();
        let mut stream = old[..100].to_vec();
        // The new host's first Attach disappears into that frame's body...
        encode_session_start(&LinkFrame::Attach { session: 1 }, &mut stream).unwrap();
        // ...so it pads and tries again.
        stream.extend(std::iter::repeat_n(0, ATTACH_PADDING_BYTES));
        encode_session_start(&LinkFrame::Attach { session: 2 }, &mut stream).unwrap();
        let items = decode_all(&mut LinkDecoder::new(), &stream);
        assert_eq!(
            items.last(),
            Some(&LinkItem::Frame(LinkFrame::Attach { session: 2 }))
        );
        assert!(items.contains(&LinkItem::Desync));
    }

    #[test]
    fn a_marker_split_across_reads_is_found_while_hunting() {
        let mut decoder = LinkDecoder::new();
        assert_eq!(
            decoder.decode(&[0, 0, 0, 0]),
            (4, None),
            "padding is skipped"
        );
        assert_eq!(
            decoder.decode(&[0xff, 0xff, 0xff, 0x0f]),
            (0, Some(LinkItem::Desync))
        );
        let mut buf = vec![9; 20];
        buf.extend_from_slice(&LINK_SYNC[..5]);
        let (used, item) = decoder.decode(&buf);
        assert_eq!(item, None);
        let mut rest = buf[used..].to_vec();
        rest.extend_from_slice(&LINK_SYNC[5..]);
        assert_eq!(decoder.decode(&rest), (rest.len(), Some(LinkItem::Sync)));
        assert!(!decoder.is_hunting());
    }

    #[test]
    fn oversize_and_undecodable_frames_desync() {
        let too_long = u32::try_from(LINK_FRAME_BYTES + 1).unwrap().to_le_bytes();
        assert_eq!(
            LinkDecoder::new().decode(&too_long),
            (0, Some(LinkItem::Desync))
        );
        // Variant 200 does not exist.
        assert_eq!(
            LinkDecoder::new().decode(&[1, 0, 0, 0, 200]),
            (5, Some(LinkItem::Desync))
        );
        let mut big = Vec::new();
        let over = LinkFrame::Data {
            channel: 1,
            bytes: vec![0; LINK_FRAME_BYTES],
        };
        assert!(encode_frame(&over, &mut big).is_err());
        assert!(big.is_empty());
    }
}
