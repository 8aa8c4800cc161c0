//! The host client's demultiplexer against a scripted agent on an in-memory pipe.
//!
//! The agent answers the handshake correctly, waits until the client's requests
//! (ps, exec, a followed logs stream) have reached it, then writes the input as raw
//! bytes and hangs up. Invariants: no panic, and every pending request ends, with a
//! reply or an error, soon after the hang-up: a request still waiting after that is
//! a hang.

#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sandbox_protocol::frame::Decoded;
use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, Command, ExecRequest, HelloReply, Pid, ProcessSpec, Request,
    RequestId, PROTOCOL_VERSION,
};
use sandbox_vmm::client::Client;
use tokio::io::AsyncWriteExt;

/// Requests the client has in flight when the bytes arrive (ids 1, 2, 3).
const REQUESTS: usize = 3;

/// Bound on one input: the client runs on an in-memory pipe, so anything near this
/// is a hang, not a slow machine.
const DEADLINE_SECS: u64 = 10;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the fuzzer's runtime")
});

fuzz_target!(|data: &[u8]| {
    let deadline = Duration::from_secs(DEADLINE_SECS);
    RUNTIME
        .block_on(async { tokio::time::timeout(deadline, run(data)).await })
        .unwrap_or_else(|_| panic!("the client hung for {deadline:?}"));
});

async fn run(data: &[u8]) {
    let (near, far) = tokio::io::duplex(1 << 16);
    let (read, write) = tokio::io::split(far);
    let mut reader = FrameReader::new(read, MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, MAX_FRAME_BYTES);
    let handshake = async {
        let hello = reader.read::<ClientFrame>().await;
        assert!(
            matches!(
                hello,
                Ok(Some(Decoded::Frame(ClientFrame {
                    id: RequestId(0),
                    ..
                })))
            ),
            "no hello: {hello:?}"
        );
        let reply = HelloReply {
            version: PROTOCOL_VERSION,
            agent_version: "fuzz".into(),
            boot_id: "boot".into(),
            capabilities: vec![],
        };
        let frame = AgentFrame {
            id: RequestId::CONNECTION,
            msg: AgentMsg::Hello(reply),
        };
        writer.write(&frame).await.expect("writing the hello reply");
    };
    let (client, ()) = tokio::join!(Client::over_stream(near, None), handshake);
    let client = client.expect("the handshake with a well-behaved agent");

    let ps = client.stream(Request::Ps).expect("starting ps");
    let mut exec = client
        .exec_stream(ExecRequest {
            spec: ProcessSpec::new(Command::Shell("true".into())),
            stdin: vec![],
            timeout_ms: None,
            stream: true,
        })
        .expect("starting exec");
    let mut logs = client
        .logs_follow(Pid(42), None)
        .expect("starting a followed logs stream");
    // Wait until the requests are on the agent's side, so the bytes answer them.
    for _ in 0..REQUESTS {
        let frame = reader.read::<ClientFrame>().await;
        assert!(matches!(frame, Ok(Some(Decoded::Frame(_)))), "{frame:?}");
    }

    let agent = async move {
        let stream = writer.get_mut();
        // The client may hang up first (a broken pipe here is fine).
        let _ = stream.write_all(data).await;
        let _ = stream.shutdown().await;
        // Keep reading what the client sends (cancels) until it closes its side.
        while let Ok(Some(_)) = reader.read::<ClientFrame>().await {}
    };
    let requests = async move {
        let _ = ps.reply().await;
        while !exec.is_finished() {
            if exec.next().await.is_err() {
                break;
            }
        }
        while !logs.is_finished() {
            if logs.next().await.is_err() {
                break;
            }
        }
        drop(client);
    };
    tokio::join!(agent, requests);
}
