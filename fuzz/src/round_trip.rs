//! Decode → encode → decode must give the same value and the same bytes.
//!
//! `AgentFrame` holds floats (the load average), so a NaN is not equal to itself;
//! comparing the re-encoded bytes instead works for every type, and `Eq` types are
//! compared by value as well.

use sandbox_protocol::frame::{decode_body, encode, FrameError};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Re-encodes `value` as a frame under `max` and checks the frame decodes to a value
/// that encodes to the same bytes; returns the decoded copy. An encode refused for
/// size is fine (a decoded body can re-encode longer only if postcard's encoding is
/// not canonical, which it is, so it is checked too).
pub fn check<T: Serialize + DeserializeOwned + std::fmt::Debug>(
    value: &T,
    max: usize,
    body_len: usize,
) -> Option<T> {
    let frame = match encode(value, max) {
        Ok(frame) => frame,
        Err(FrameError::TooLarge { len, .. }) => {
            assert!(
                len > body_len,
                "a {body_len}-byte body re-encodes to {len} bytes: {value:?}"
            );
            return None;
        }
        Err(error) => panic!("a decoded value does not encode: {error}: {value:?}"),
    };
    let body = &frame[sandbox_protocol::frame::LEN_PREFIX_BYTES..];
    assert!(
        body.len() <= body_len,
        "re-encoding grew {body_len} bytes to {}: {value:?}",
        body.len()
    );
    let again: T = match decode_body(body) {
        Ok(again) => again,
        Err(error) => panic!("an encoded value does not decode: {error}: {value:?}"),
    };
    let body_again = postcard::to_allocvec(&again).expect("re-encoding a decoded value");
    assert_eq!(body, &body_again[..], "bytes changed on a round trip");
    Some(again)
}
