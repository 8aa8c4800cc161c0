//! The link (`sandbox_protocol::link`) as the host relay reads it from a hostile
//! guest: arbitrary bytes in arbitrary reads through `LinkDecoder`, every frame
//! delivered to a channel table with a few channels open.
//!
//! Invariants: nothing panics; the decoder never consumes more than it was given, and
//! when it asks for more bytes it has consumed nothing; a marker ends hunting; every
//! frame re-encodes to a frame that decodes to the same value; the table never holds
//! more than `MAX_CHANNELS` channels, and a channel that breaks its window or credit
//! is closed, never grown.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_fuzz::stream_split::Plan;
use sandbox_protocol::link::mux::{Channels, Delivery, Outbox};
use sandbox_protocol::link::{encode_frame, LinkDecoder, LinkFrame, LinkItem, MAX_CHANNELS};

fuzz_target!(|data: &[u8]| {
    let (plan, stream) = Plan::parse(data);
    let (outbox, _writes) = Outbox::new();
    let channels = Channels::new(outbox);
    // A few clients connected, as on a relay in use.
    let open: Vec<_> = (1..=3).filter_map(|id| channels.open(id).ok()).collect();
    let mut decoder = LinkDecoder::new();
    decoder.hunt();
    let mut buf: Vec<u8> = Vec::new();
    for read in plan.reads(stream) {
        buf.extend_from_slice(read);
        loop {
            let (used, item) = decoder.decode(&buf);
            assert!(used <= buf.len(), "consumed {used} of {} bytes", buf.len());
            buf.drain(..used);
            match item {
                None if used == 0 => break,
                None => {}
                Some(LinkItem::Sync) => assert!(!decoder.is_hunting(), "a marker left it hunting"),
                Some(LinkItem::Desync) => assert!(decoder.is_hunting(), "a desync did not hunt"),
                Some(LinkItem::Frame(frame)) => {
                    check_round_trip(&frame);
                    let delivery = channels.deliver(frame);
                    if delivery == Delivery::Violation {
                        assert!(channels.len() < open.len() + 1);
                    }
                }
            }
            assert!(channels.len() <= MAX_CHANNELS);
        }
    }
});

fn check_round_trip(frame: &LinkFrame) {
    let mut bytes = Vec::new();
    encode_frame(frame, &mut bytes).expect("a decoded frame does not re-encode");
    let mut decoder = LinkDecoder::new();
    match decoder.decode(&bytes) {
        (used, Some(LinkItem::Frame(again))) => {
            assert_eq!(used, bytes.len());
            assert_eq!(&again, frame, "a frame changed on a round trip");
        }
        other => panic!("a re-encoded frame decoded as {other:?}"),
    }
}
