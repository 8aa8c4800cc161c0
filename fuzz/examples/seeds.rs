//! Writes the seed corpus of every fuzz target into `corpus/<target>/`, next to this
//! crate's manifest: valid frames of every kind, plus a few malformed ones that reach
//! each decoder's error paths. Run it after a change to the wire types:
//! `cargo +nightly run --example seeds` from the fuzz directory.

use std::fs;
use std::path::Path;

use sandbox_fuzz::seeds;
use sandbox_fuzz::stream_split::{Plan, Side};
use sandbox_protocol::frame::encode;
use sandbox_protocol::limits::MAX_FRAME_BYTES;

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = corpus.join(target);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(format!("seed-{name}")), bytes)
    };
    let body = |msg: &dyn erased::Body| msg.body();

    // request_decode: bare bodies.
    for (name, frame) in seeds::client_frames() {
        write("request_decode", &format!("client-{name}"), &body(&frame))?;
    }
    for (name, frame) in seeds::agent_frames() {
        write("request_decode", &format!("agent-{name}"), &body(&frame))?;
    }
    for (name, request) in seeds::requests() {
        write(
            "request_decode",
            &format!("request-{name}"),
            &body(&request),
        )?;
    }
    // Malformed: an unknown request variant, a truncated body, a bad bool.
    write("request_decode", "bad-unknown-variant", &[3, 1, 0xC8, 0x01])?;
    write("request_decode", "bad-truncated", &[3, 1])?;
    write("request_decode", "bad-bool", &[3, 1, 2, 7, 0, 2])?;

    // frame_decode: a header, then frames; whole streams and byte-by-byte reads.
    let client_stream: Vec<u8> = seeds::client_frames()
        .iter()
        .flat_map(|(_, frame)| frame_bytes(frame))
        .collect();
    let agent_stream: Vec<u8> = seeds::agent_frames()
        .iter()
        .flat_map(|(_, frame)| frame_bytes(frame))
        .collect();
    for (name, side, max, reads, stream) in [
        (
            "client-all",
            Side::Client,
            MAX_FRAME_BYTES,
            [0; 5],
            &client_stream,
        ),
        (
            "client-bytewise",
            Side::Client,
            MAX_FRAME_BYTES,
            [1, 3, 7, 2, 5],
            &client_stream,
        ),
        (
            "client-small-limit",
            Side::Client,
            40,
            [9, 0, 0, 0, 0],
            &client_stream,
        ),
        (
            "agent-all",
            Side::Agent,
            MAX_FRAME_BYTES,
            [0; 5],
            &agent_stream,
        ),
        (
            "agent-bytewise",
            Side::Agent,
            MAX_FRAME_BYTES,
            [1, 2, 3, 4, 5],
            &agent_stream,
        ),
        ("agent-small-limit", Side::Agent, 60, [0; 5], &agent_stream),
    ] {
        let mut bytes = Plan { side, max, reads }.header().to_vec();
        bytes.extend_from_slice(stream);
        write("frame_decode", name, &bytes)?;
    }
    // Malformed: an oversize prefix followed by a request id, and a garbage body.
    let mut oversize = Plan {
        side: Side::Client,
        max: 16,
        reads: [7; 5],
    }
    .header()
    .to_vec();
    oversize.extend(1000u32.to_le_bytes());
    oversize.extend([5, 0xAA, 0xAA]);
    write("frame_decode", "bad-oversize", &oversize)?;
    let mut garbage = Plan {
        side: Side::Agent,
        max: MAX_FRAME_BYTES,
        reads: [0; 5],
    }
    .header()
    .to_vec();
    garbage.extend([3, 0, 0, 0, 0x07, 0xFF, 0xFF]);
    write("frame_decode", "bad-garbage-body", &garbage)?;

    // agent_dispatch: the script of every request, and each request alone.
    write("agent_dispatch", "script", &seeds::dispatch_script())?;
    for (name, request) in seeds::requests() {
        write("agent_dispatch", name, &body(&request))?;
    }

    // client_frames: what an agent writes after the handshake. Ids 1, 2, 3 are the
    // pending ps, exec and logs.
    for (name, frame) in seeds::agent_frames() {
        for id in 1..=3 {
            let mut frame = frame.clone();
            frame.id = sandbox_protocol::RequestId(id);
            write(
                "client_frames",
                &format!("{name}-{id}"),
                &frame_bytes(&frame),
            )?;
        }
    }
    write("client_frames", "all", &agent_stream)?;
    write(
        "client_frames",
        "bad-oversize",
        &[0xFF, 0xFF, 0xFF, 0x7F, 1],
    )?;
    write("client_frames", "bad-cut-short", &[10, 0, 0, 0, 1])?;
    write(
        "client_frames",
        "bad-garbage-body",
        &[3, 0, 0, 0, 0x02, 0xFF, 0xFF],
    )?;
    Ok(())
}

fn frame_bytes<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    encode(msg, MAX_FRAME_BYTES).expect("encoding a seed")
}

/// Postcard bodies of values of different types through one closure.
mod erased {
    pub trait Body {
        fn body(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Body for T {
        fn body(&self) -> Vec<u8> {
            postcard::to_allocvec(self).expect("encoding a seed")
        }
    }
}
