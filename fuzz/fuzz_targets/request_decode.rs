//! `decode_body` of every frame type (and of a bare `Request`) on arbitrary bytes.
//!
//! Invariants: it never panics, and whatever decodes encodes back to bytes that
//! decode to the same value (and the same bytes again).

#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_fuzz::round_trip;
use sandbox_protocol::frame::{decode_body, peek_request_id};
use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::{AgentFrame, ClientFrame, ClientMsg, Request};

fuzz_target!(|data: &[u8]| {
    let _ = peek_request_id(data);
    match decode_body::<ClientFrame>(data) {
        Ok(frame) => {
            if let ClientMsg::Request(request) = &frame.msg {
                let _ = request.name();
            }
            if let Some(again) = round_trip::check(&frame, MAX_FRAME_BYTES, data.len()) {
                assert_eq!(again, frame);
            }
        }
        Err(error) => {
            let _ = (error.to_string(), error.is_unknown_variant());
        }
    }
    if let Ok(frame) = decode_body::<AgentFrame>(data) {
        round_trip::check(&frame, MAX_FRAME_BYTES, data.len());
        // Clients print what they did not expect with `{:?}`.
        let _ = format!("{frame:?}");
    }
    if let Ok(request) = decode_body::<Request>(data) {
        if let Some(again) = round_trip::check(&request, MAX_FRAME_BYTES, data.len()) {
            assert_eq!(again, request);
        }
    }
});
