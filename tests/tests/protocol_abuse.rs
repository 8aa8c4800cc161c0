//! Malformed, oversize and unauthorized frames over a raw socket: each gets an error,
//! and the agent lives on to serve the next connection.

// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sandbox_protocol::frame::{encode, Decoded};
use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::transport::FrameReader;
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, ErrorKind, Hello, Reply, Request, RequestId,
    WireError, MAGIC, PROTOCOL_VERSION,
};
use sandbox_tests::{exec_sh, within, AgentOptions, TestAgent};
use sandbox_vmm::client::{Client, ClientError};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::UnixStream;

/// A raw connection: frames we build by hand, frames we read back.
struct Raw {
    reader: FrameReader<ReadHalf<UnixStream>>,
    writer: WriteHalf<UnixStream>,
}

impl Raw {
    async fn connect(agent: &TestAgent) -> Self {
        let stream = UnixStream::connect(agent.socket()).await.unwrap();
        let (read, writer) = tokio::io::split(stream);
        Self {
            reader: FrameReader::new(read, MAX_FRAME_BYTES),
            writer,
        }
    }

    /// Connects and completes a valid handshake.
    async fn hello(agent: &TestAgent) -> Self {
        let mut raw = Self::connect(agent).await;
        raw.send(0, ClientMsg::Hello(Hello::new(None))).await;
        let reply = raw.read().await.expect("no hello reply");
        assert!(matches!(reply.msg, AgentMsg::Hello(_)), "{reply:?}");
        raw
    }

    async fn send(&mut self, id: u64, msg: ClientMsg) {
        let bytes = encode(
            &ClientFrame {
                id: RequestId(id),
                msg,
            },
            MAX_FRAME_BYTES,
        )
        .unwrap();
        self.write(&bytes).await;
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.unwrap();
        self.writer.flush().await.unwrap();
    }

    /// The next frame, or `None` once the agent closed the connection.
    async fn read(&mut self) -> Option<AgentFrame> {
        match within(10, self.reader.read::<AgentFrame>()).await {
            Ok(Some(Decoded::Frame(frame))) => Some(frame),
            Ok(Some(Decoded::Rejected { error, .. })) => panic!("agent sent a bad frame: {error}"),
            Ok(None) => None,
            // A reset after the agent's last frame counts as closed.
            Err(_) => None,
        }
    }

    /// The next frame, which must be an error; returns it with its id.
    async fn expect_error(&mut self) -> (RequestId, WireError) {
        let frame = self
            .read()
            .await
            .expect("connection closed instead of an error");
        match frame.msg {
            AgentMsg::Error(error) => (frame.id, error),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// Sends `ps` under `id` and asserts the connection still serves it.
    async fn assert_serves(&mut self, id: u64) {
        self.send(id, ClientMsg::Request(Request::Ps)).await;
        let frame = self.read().await.expect("connection closed");
        assert_eq!(frame.id, RequestId(id));
        assert!(
            matches!(frame.msg, AgentMsg::Reply(Reply::Ps(_))),
            "{frame:?}"
        );
    }
}

/// One frame with a hand-made body.
fn frame_with_body(body: &[u8]) -> Vec<u8> {
    let mut bytes = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// The agent is still up and a fresh client works.
async fn assert_agent_serves(agent: &mut TestAgent) {
    agent.assert_alive();
    let client = agent.client().await;
    within(10, client.ps()).await.unwrap();
}

#[tokio::test]
async fn a_garbage_body_gets_an_error_and_the_connection_goes_on() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    // Id 5, Request::Spawn, then an invalid Option tag where the command starts.
    raw.write(&frame_with_body(&[5, 1, 1, 0xff, 0xff])).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(5));
    assert_eq!(error.kind, ErrorKind::BadRequest, "{error}");
    raw.assert_serves(6).await;
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_frame_with_trailing_bytes_is_rejected_under_its_id() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    let valid = encode(
        &ClientFrame {
            id: RequestId(9),
            msg: ClientMsg::Request(Request::Ps),
        },
        MAX_FRAME_BYTES,
    )
    .unwrap();
    let mut body = valid[4..].to_vec();
    body.push(0);
    raw.write(&frame_with_body(&body)).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(9));
    assert_eq!(error.kind, ErrorKind::BadRequest, "{error}");
    raw.assert_serves(10).await;
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn an_oversize_frame_is_refused_under_its_id_and_the_connection_closes() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    let len = MAX_FRAME_BYTES + 1;
    let mut bytes = u32::try_from(len).unwrap().to_le_bytes().to_vec();
    bytes.push(11); // the id, so the agent can say which request was too large
    raw.write(&bytes).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(11));
    assert_eq!(error.kind, ErrorKind::TooLarge, "{error}");
    // Frame sync is lost: a valid frame after it is never answered, the agent closes
    // (the write itself may already fail).
    let ps = ClientFrame {
        id: RequestId(12),
        msg: ClientMsg::Request(Request::Ps),
    };
    let _ = raw
        .writer
        .write_all(&encode(&ps, MAX_FRAME_BYTES).unwrap())
        .await;
    assert!(raw.read().await.is_none(), "the connection stayed open");
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn before_the_hello_a_frame_over_a_few_kib_is_refused() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::connect(&agent).await;
    let len = sandbox_protocol::limits::HELLO_FRAME_BYTES + 1;
    raw.write(&u32::try_from(len).unwrap().to_le_bytes()).await;
    let (_, error) = raw.expect_error().await;
    assert_eq!(error.kind, ErrorKind::BadRequest, "{error}");
    assert!(error.message.contains("Hello"), "{error}");
    assert!(raw.read().await.is_none(), "the connection stayed open");
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn requests_past_the_in_flight_cap_are_busy_and_the_rest_are_served() {
    use sandbox_protocol::limits::MAX_REQUESTS_IN_FLIGHT;
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    let cap = u64::try_from(MAX_REQUESTS_IN_FLIGHT).unwrap();
    // Requests that stay in flight for a while, pipelined past the cap.
    for id in 1..=cap + 3 {
        raw.send(id, ClientMsg::Request(Request::Exec(exec_sh("sleep 1"))))
            .await;
    }
    let mut busy = Vec::new();
    let mut done = Vec::new();
    while busy.len() + done.len() < usize::try_from(cap + 3).unwrap() {
        let frame = raw.read().await.expect("connection closed");
        match frame.msg {
            AgentMsg::Error(error) if error.kind == ErrorKind::Busy => busy.push(frame.id.0),
            AgentMsg::Reply(Reply::Exec(_)) => done.push(frame.id.0),
            other => panic!("{other:?}"),
        }
    }
    busy.sort_unstable();
    assert_eq!(busy, vec![cap + 1, cap + 2, cap + 3]);
    assert_eq!(done.len(), MAX_REQUESTS_IN_FLIGHT);
    // Slots free as requests finish.
    raw.assert_serves(cap + 4).await;
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_huge_length_prefix_then_hang_up_leaves_the_agent_alive() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    raw.write(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await;
    let (_, error) = raw.expect_error().await;
    assert_eq!(error.kind, ErrorKind::TooLarge, "{error}");
    assert!(raw.read().await.is_none(), "the connection stayed open");
    drop(raw);
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn an_unknown_request_variant_is_unsupported() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    // Id 13, ClientMsg::Request (variant 1), then a Request variant from the future.
    raw.write(&frame_with_body(&[13, 1, 120])).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(13));
    assert_eq!(error.kind, ErrorKind::Unsupported, "{error}");
    raw.assert_serves(14).await;
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_wrong_protocol_version_gets_version_mismatch_then_close() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::connect(&agent).await;
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION + 1,
        token: None,
    };
    raw.send(0, ClientMsg::Hello(hello)).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(0));
    assert_eq!(error.kind, ErrorKind::VersionMismatch, "{error}");
    assert!(raw.read().await.is_none(), "connection left open");
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_wrong_magic_is_refused_then_closed() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::connect(&agent).await;
    let hello = Hello {
        magic: *b"HTTP",
        version: PROTOCOL_VERSION,
        token: None,
    };
    raw.send(0, ClientMsg::Hello(hello)).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(0));
    assert!(
        matches!(
            error.kind,
            ErrorKind::BadRequest | ErrorKind::VersionMismatch
        ),
        "{error}"
    );
    assert!(raw.read().await.is_none(), "connection left open");
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_request_before_hello_is_refused_then_closed() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::connect(&agent).await;
    raw.send(1, ClientMsg::Request(Request::Ps)).await;
    let frame = raw.read().await.expect("closed without an error");
    assert!(
        matches!(&frame.msg, AgentMsg::Error(e) if e.kind == ErrorKind::BadRequest),
        "{frame:?}"
    );
    assert!(raw.read().await.is_none(), "connection left open");
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn plain_text_instead_of_a_hello_does_not_hurt_the_agent() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::connect(&agent).await;
    raw.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    // "GET " read as a length is over the limit: an error (or a close), never a hang.
    let closed_or_error = raw.read().await;
    if let Some(frame) = closed_or_error {
        assert!(matches!(frame.msg, AgentMsg::Error(_)), "{frame:?}");
    }
    drop(raw);
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn a_connection_cut_mid_frame_does_not_hurt_the_agent() {
    let mut agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    raw.write(&[100, 0, 0, 0, 1, 2, 3]).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn tokens_are_required_when_configured() {
    let mut agent = TestAgent::start_with(AgentOptions {
        token: Some("s3cret".into()),
        ..AgentOptions::default()
    });
    for token in [None, Some("wrong".to_owned())] {
        let mut raw = Raw::connect(&agent).await;
        raw.send(0, ClientMsg::Hello(Hello::new(token.clone())))
            .await;
        let (id, error) = raw.expect_error().await;
        assert_eq!(id, RequestId(0));
        assert_eq!(error.kind, ErrorKind::Unauthorized, "{token:?}: {error}");
        assert!(raw.read().await.is_none(), "connection left open");
    }

    // The client maps the refusal to a typed error.
    let url = agent.url().parse().unwrap();
    let err = Client::connect(&url, &Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized(_)), "{err:?}");
    assert!(!err.is_retryable());

    // The right token works (the harness passes it).
    assert_agent_serves(&mut agent).await;
}

#[tokio::test]
async fn hello_reply_describes_the_agent() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let hello = client.hello();
    assert_eq!(hello.version, PROTOCOL_VERSION);
    assert!(!hello.agent_version.is_empty());
    assert!(!hello.boot_id.is_empty());
    let info = client.info().await.unwrap();
    assert_eq!(info.boot_id, hello.boot_id);
    assert_eq!(info.protocol_version, PROTOCOL_VERSION);
    assert!(info.mem_total_bytes > 0);
    assert!(!info.is_init);
    // A second connection to the same agent sees the same boot.
    let again = agent.client().await;
    assert_eq!(again.hello().boot_id, hello.boot_id);
}

/// Regression: an error about a frame that reuses a running request's id used to be
/// sent under that id, giving the request two final frames.
#[tokio::test]
async fn errors_about_a_running_requests_id_go_under_id_zero() {
    let agent = TestAgent::start();
    let mut raw = Raw::hello(&agent).await;
    let exec = Request::Exec(sandbox_protocol::ExecRequest {
        spec: sandbox_protocol::ProcessSpec::new(sandbox_protocol::Command::Shell(
            "sleep 0.5; echo done".into(),
        )),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    });
    raw.send(7, ClientMsg::Request(exec.clone())).await;
    // The same id again while the first is running, then a late Hello under it.
    raw.send(7, ClientMsg::Request(exec)).await;
    raw.send(7, ClientMsg::Hello(Hello::new(None))).await;
    for _ in 0..2 {
        let (id, error) = raw.expect_error().await;
        assert_eq!(id, RequestId::CONNECTION, "{error}");
        assert!(error.message.contains("request 7"), "{error}");
    }
    // The running request still gets its one reply.
    let frame = raw.read().await.expect("no reply");
    assert_eq!(frame.id, RequestId(7));
    match frame.msg {
        AgentMsg::Reply(Reply::Exec(reply)) => assert_eq!(reply.stdout, b"done\n"),
        other => panic!("{other:?}"),
    }
}
