//! `FrameDecoder` fed arbitrary bytes in arbitrary reads, as either side decodes them.
//!
//! Invariants: it never panics; it never consumes more than it was given; it never
//! asks for more than the limit plus the prefix, so a transport never buffers more;
//! what it leaves unconsumed is less than what it asks for; once desynced it stays
//! desynced and yields nothing; and every frame that decodes re-encodes to a frame
//! that decodes to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_fuzz::round_trip;
use sandbox_fuzz::stream_split::{Plan, Side};
use sandbox_protocol::frame::{Decoded, FrameDecoder, FrameError, LEN_PREFIX_BYTES};
use sandbox_protocol::{AgentFrame, ClientFrame};
use serde::de::DeserializeOwned;
use serde::Serialize;

fuzz_target!(|data: &[u8]| {
    let (plan, stream) = Plan::parse(data);
    match plan.side {
        Side::Client => {
            for frame in drive::<ClientFrame>(&plan, stream) {
                let again = round_trip::check(&frame.0, plan.max, frame.1);
                if let Some(again) = again {
                    assert_eq!(again, frame.0, "a client frame changed on a round trip");
                }
            }
        }
        Side::Agent => {
            for frame in drive::<AgentFrame>(&plan, stream) {
                round_trip::check(&frame.0, plan.max, frame.1);
            }
        }
    }
});

/// Feeds `stream` to a decoder read by read, as a transport does, checking the
/// invariants after every call; returns the frames with their body lengths.
fn drive<T: DeserializeOwned + Serialize>(plan: &Plan, stream: &[u8]) -> Vec<(T, usize)> {
    let mut decoder = FrameDecoder::new(plan.max);
    let limit = plan.max + LEN_PREFIX_BYTES;
    let mut buf: Vec<u8> = Vec::new();
    let mut frames = Vec::new();
    for read in plan.reads(stream) {
        buf.extend_from_slice(read);
        loop {
            let was_desynced = decoder.is_desynced();
            let (used, item) = decoder.decode::<T>(&buf);
            assert!(used <= buf.len(), "consumed {used} of {} bytes", buf.len());
            if was_desynced {
                assert!(decoder.is_desynced(), "a desynced decoder resynced");
                assert!(item.is_none(), "a desynced decoder produced a frame");
                assert_eq!(used, buf.len(), "a desynced decoder kept bytes");
            }
            match &item {
                Some(Decoded::Frame(_)) => {
                    assert!(!decoder.is_desynced(), "a good frame desynced");
                    assert!(used >= LEN_PREFIX_BYTES && used <= limit, "frame of {used}");
                }
                Some(Decoded::Rejected { error, .. }) => {
                    let oversize = matches!(error, FrameError::TooLarge { .. });
                    assert_eq!(oversize, decoder.is_desynced(), "{error}");
                    if !oversize {
                        assert!(used >= LEN_PREFIX_BYTES && used <= limit);
                    }
                    // Error messages are built from input: they must not panic either.
                    let _ = (error.to_string(), error.is_unknown_variant());
                }
                None => {}
            }
            buf.drain(..used);
            if let Some(Decoded::Frame(frame)) = item {
                frames.push((frame, used - LEN_PREFIX_BYTES));
            } else if item.is_none() && used == 0 {
                break;
            }
        }
        let wanted = decoder.bytes_wanted(&buf);
        assert!(wanted <= limit, "wants {wanted} bytes, limit {limit}");
        if decoder.is_desynced() {
            assert!(buf.is_empty() && wanted == 0);
        } else {
            // Whatever is left is an incomplete frame: less than the decoder asks for.
            assert!(
                buf.len() < wanted,
                "{} bytes left, wants {wanted}",
                buf.len()
            );
            assert_eq!(decoder.is_mid_frame(&buf), !buf.is_empty());
        }
    }
    frames
}
