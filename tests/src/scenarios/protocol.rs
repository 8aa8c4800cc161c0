//! The handshake, and malformed, oversize and out-of-order frames over a raw
//! connection: each gets an error, and the agent lives on (same boot) to serve the
//! next connection.

use sandbox_protocol::frame::encode;
use sandbox_protocol::limits::{HELLO_FRAME_BYTES, MAX_FRAME_BYTES, MAX_REQUESTS_IN_FLIGHT};
use sandbox_protocol::{
    AgentMsg, ClientFrame, ClientMsg, Command, ErrorKind, ExecRequest, Hello, ProcessSpec, Reply,
    Request, RequestId, MAGIC, PROTOCOL_VERSION,
};

use crate::transport::Target;
use crate::{exec_sh, sh, within};

/// One frame with a hand-made body.
fn frame_with_body(body: &[u8]) -> Vec<u8> {
    let mut bytes = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// The same agent (same boot id: it did not restart) still serves a fresh client.
async fn assert_agent_serves(target: &Target) {
    target.assert_serves().await;
    let client = target.connect().await;
    let info = within(20, client.info()).await.unwrap();
    assert_eq!(
        info.boot_id,
        target.client().hello().boot_id,
        "the agent restarted"
    );
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
}

pub async fn hello_reply_describes_the_agent(target: Target) {
    let client = target.client();
    let hello = client.hello();
    assert_eq!(hello.version, PROTOCOL_VERSION);
    assert!(!hello.agent_version.is_empty());
    assert!(!hello.boot_id.is_empty());
    let info = client.info().await.unwrap();
    assert_eq!(info.boot_id, hello.boot_id);
    assert_eq!(info.protocol_version, PROTOCOL_VERSION);
    assert!(info.mem_total_bytes > 0);
    assert_eq!(info.is_init, target.facts().is_pid1, "{info:?}");
    // A second connection to the same agent sees the same boot.
    let again = target.connect().await;
    assert_eq!(again.hello().boot_id, hello.boot_id);
}

pub async fn a_garbage_body_gets_an_error_and_the_connection_goes_on(target: Target) {
    let mut raw = target.raw_hello().await;
    // Id 5, Request::Spawn, then an invalid Option tag where the command starts.
    raw.write(&frame_with_body(&[5, 1, 1, 0xff, 0xff])).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(5));
    assert_eq!(error.kind, ErrorKind::BadRequest, "{error}");
    raw.assert_serves(6).await;
    assert_agent_serves(&target).await;
}

pub async fn a_frame_with_trailing_bytes_is_rejected_under_its_id(target: Target) {
    let mut raw = target.raw_hello().await;
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
    assert_agent_serves(&target).await;
}

pub async fn an_oversize_frame_is_refused_under_its_id_and_the_connection_closes(target: Target) {
    let mut raw = target.raw_hello().await;
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
    let _ = raw.try_write(&encode(&ps, MAX_FRAME_BYTES).unwrap()).await;
    assert!(raw.read().await.is_none(), "the connection stayed open");
    assert_agent_serves(&target).await;
}

pub async fn before_the_hello_a_frame_over_a_few_kib_is_refused(target: Target) {
    let mut raw = target.raw().await;
    let len = HELLO_FRAME_BYTES + 1;
    raw.write(&u32::try_from(len).unwrap().to_le_bytes()).await;
    let (_, error) = raw.expect_error().await;
    assert_eq!(error.kind, ErrorKind::BadRequest, "{error}");
    assert!(error.message.contains("Hello"), "{error}");
    assert!(raw.read().await.is_none(), "the connection stayed open");
    assert_agent_serves(&target).await;
}

pub async fn requests_past_the_in_flight_cap_are_busy_and_the_rest_are_served(target: Target) {
    let mut raw = target.raw_hello().await;
    let cap = u64::try_from(MAX_REQUESTS_IN_FLIGHT).unwrap();
    // Requests that stay in flight for a while (the second is the test), pipelined
    // past the cap.
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
    assert_agent_serves(&target).await;
}

pub async fn a_huge_length_prefix_then_hang_up_leaves_the_agent_alive(target: Target) {
    let mut raw = target.raw_hello().await;
    raw.write(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await;
    let (_, error) = raw.expect_error().await;
    assert_eq!(error.kind, ErrorKind::TooLarge, "{error}");
    assert!(raw.read().await.is_none(), "the connection stayed open");
    drop(raw);
    assert_agent_serves(&target).await;
}

pub async fn an_unknown_request_variant_is_unsupported(target: Target) {
    let mut raw = target.raw_hello().await;
    // Id 13, ClientMsg::Request (variant 1), then a Request variant from the future.
    raw.write(&frame_with_body(&[13, 1, 120])).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(id, RequestId(13));
    assert_eq!(error.kind, ErrorKind::Unsupported, "{error}");
    raw.assert_serves(14).await;
    assert_agent_serves(&target).await;
}

pub async fn a_wrong_protocol_version_gets_version_mismatch_then_close(target: Target) {
    let mut raw = target.raw().await;
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
    assert_agent_serves(&target).await;
}

pub async fn a_wrong_magic_is_refused_then_closed(target: Target) {
    let mut raw = target.raw().await;
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
    assert_agent_serves(&target).await;
}

pub async fn a_request_before_hello_is_refused_then_closed(target: Target) {
    let mut raw = target.raw().await;
    raw.send(1, ClientMsg::Request(Request::Ps)).await;
    let frame = raw.read().await.expect("closed without an error");
    assert!(
        matches!(&frame.msg, AgentMsg::Error(e) if e.kind == ErrorKind::BadRequest),
        "{frame:?}"
    );
    assert!(raw.read().await.is_none(), "connection left open");
    assert_agent_serves(&target).await;
}

pub async fn plain_text_instead_of_a_hello_does_not_hurt_the_agent(target: Target) {
    let mut raw = target.raw().await;
    raw.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    // "GET " read as a length is over the limit: an error (or a close), never a hang.
    if let Some(frame) = raw.read().await {
        assert!(matches!(frame.msg, AgentMsg::Error(_)), "{frame:?}");
    }
    drop(raw);
    assert_agent_serves(&target).await;
}

pub async fn a_connection_cut_mid_frame_does_not_hurt_the_agent(target: Target) {
    let mut raw = target.raw_hello().await;
    raw.write(&[100, 0, 0, 0, 1, 2, 3]).await;
    drop(raw);
    // No sleep before the check: nothing observable marks the agent having seen the
    // cut, and the checks below take several round trips (a shell included), during
    // which a crash on it would refuse or drop them.
    assert_agent_serves(&target).await;
}

/// Regression: an error about a frame that reuses a running request's id used to be
/// sent under that id, giving the request two final frames.
pub async fn errors_about_a_running_requests_id_go_under_id_zero(target: Target) {
    let mut raw = target.raw_hello().await;
    // The pause is the test: request 7 is still running when its id comes again.
    let exec = Request::Exec(ExecRequest {
        spec: ProcessSpec::new(Command::Shell("sleep 0.5; echo done".into())),
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
