//! The data plane of a node daemon, server side: an authorized upgraded connection
//! joined to a local agent's byte stream.
//!
//! ```text
//! client ══ upgraded HTTP ══► forward_hello ──► agent (unix, hvsock, vsock)
//!        ◄═════════════════ splice (both ways, half-close) ═════════════►
//! ```
//!
//! The daemon, once it has authorized `GET /v1/sandboxes/{id}/agent` by its Bearer
//! token and answered `101`, calls [`bridge`] with the upgraded connection, the
//! sandbox's agent URL and the agent's token; or the three steps itself:
//! 1. [`open_agent_stream`]: a raw byte stream to the agent, nothing sent (for
//!    hybrid vsock after the `CONNECT`/`OK` exchange of [`crate::client::hvsock`]).
//! 2. [`forward_hello`]: the client's first frame, a `Hello`, passed on with the
//!    agent's token put in place of whatever the client sent. The HTTP request was
//!    the client's credential; the agent's token stays on the node, and the node's
//!    tokens never reach a guest. Every other first frame (a wrong version, a request
//!    before `Hello`, garbage) passes unchanged, so the agent answers it as it always
//!    does.
//! 3. [`splice`]: bytes both ways until both directions end.
//!
//! Apart from the one `Hello` nothing is decoded here: requests, streams and their
//! flow control are the agent's and the client's business, as on a Unix socket.
//! Memory per connection is two [`SPLICE_BUF_BYTES`] buffers and one hello frame.
//! Idle connections are not cut: a terminal or a log follow may rightly be quiet for
//! hours; a daemon that wants an idle bound wraps the streams itself.

use std::io;
use std::time::Duration;

use sandbox_protocol::frame::{decode_body, encode, LEN_PREFIX_BYTES};
use sandbox_protocol::limits::HELLO_FRAME_BYTES;
use sandbox_protocol::{ClientFrame, ClientMsg, RequestId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::connect::{dial, AgentStream, AgentUrl};
use crate::client::ClientError;

/// Size of each direction's copy buffer. tokio's default is 8 KiB; a put or get moves
/// 1 MiB chunks, so a larger buffer means fewer wake-ups per chunk.
pub const SPLICE_BUF_BYTES: usize = 64 * 1024;

/// Why a bridge between a client and an agent ended in error.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// The agent's stream could not be opened.
    #[error("Cannot open the agent's stream")]
    Open(#[source] ClientError),
    /// The client sent nothing (or not a whole first frame) in time.
    #[error("No hello from the client within {0:?}")]
    HelloTimeout(Duration),
    /// The client hung up before its first frame was whole.
    #[error("Client closed the connection before its hello")]
    ClientClosed,
    /// Reading the client's first frame failed.
    #[error("Cannot read the client's hello")]
    ReadHello(#[source] io::Error),
    /// Writing the first frame to the agent failed.
    #[error("Cannot pass the hello to the agent")]
    WriteHello(#[source] io::Error),
    /// Copying between the two streams failed (a reset on either side).
    #[error("Splice failed")]
    Splice(#[source] io::Error),
}

/// How many bytes went each way through a finished bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spliced {
    /// From the client to the agent (the forwarded hello included).
    pub to_agent: u64,
    /// From the agent to the client.
    pub to_client: u64,
}

/// Opens a raw byte stream to the local agent at `url` within `timeout`; nothing of
/// the agent protocol is sent. Node URLs are refused ([`ClientError::NotLocal`]):
/// a daemon splices to the agents of its own machine.
pub async fn open_agent_stream(
    url: &AgentUrl,
    timeout: Duration,
) -> Result<Box<dyn AgentStream>, ClientError> {
    if matches!(url, AgentUrl::Node(_)) {
        return Err(ClientError::NotLocal { url: url.clone() });
    }
    match tokio::time::timeout(timeout, dial(url, None)).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::ConnectTimeout {
            url: url.clone(),
            timeout,
        }),
    }
}

/// Reads the client's first frame and writes it to the agent: a `Hello` under id 0
/// with `agent_token` as its token, anything else unchanged. A first frame longer
/// than the agent accepts for a hello ([`HELLO_FRAME_BYTES`]) is not buffered: its
/// length prefix goes on alone and [`splice`] carries the rest, for the agent to
/// refuse. Reads exactly one frame, so nothing after it is taken from the stream.
pub async fn forward_hello<C, A>(
    client: &mut C,
    agent: &mut A,
    agent_token: Option<&str>,
) -> Result<u64, SpliceError>
where
    C: AsyncRead + Unpin,
    A: AsyncWrite + Unpin,
{
    let mut prefix = [0u8; LEN_PREFIX_BYTES];
    read_exact(client, &mut prefix).await?;
    let len = u32::from_le_bytes(prefix);
    let body_len = usize::try_from(len).unwrap_or(usize::MAX);
    let frame = if body_len > HELLO_FRAME_BYTES {
        prefix.to_vec()
    } else {
        let mut frame = vec![0u8; LEN_PREFIX_BYTES + body_len];
        frame[..LEN_PREFIX_BYTES].copy_from_slice(&prefix);
        read_exact(client, &mut frame[LEN_PREFIX_BYTES..]).await?;
        with_token(frame, agent_token)
    };
    agent
        .write_all(&frame)
        .await
        .map_err(SpliceError::WriteHello)?;
    agent.flush().await.map_err(SpliceError::WriteHello)?;
    Ok(frame.len() as u64)
}

/// `frame` (prefix and body) with its token replaced when it is a `Hello` under id 0;
/// unchanged otherwise, or when the new frame would not encode.
fn with_token(frame: Vec<u8>, agent_token: Option<&str>) -> Vec<u8> {
    let Ok(ClientFrame {
        id: RequestId::CONNECTION,
        msg: ClientMsg::Hello(mut hello),
    }) = decode_body::<ClientFrame>(&frame[LEN_PREFIX_BYTES..])
    else {
        return frame;
    };
    hello.token = agent_token.map(str::to_owned);
    let rewritten = ClientFrame {
        id: RequestId::CONNECTION,
        msg: ClientMsg::Hello(hello),
    };
    encode(&rewritten, HELLO_FRAME_BYTES).unwrap_or(frame)
}

async fn read_exact<C: AsyncRead + Unpin>(
    client: &mut C,
    buf: &mut [u8],
) -> Result<(), SpliceError> {
    match client.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            Err(SpliceError::ClientClosed)
        }
        Err(error) => Err(SpliceError::ReadHello(error)),
    }
}

/// Copies bytes both ways between `a` and `b` until both directions have ended.
/// When one side stops sending (EOF), the other side's write half is shut down and
/// the opposite direction goes on, so a client that half-closes still gets the
/// agent's last frames. Returns the bytes copied a→b and b→a.
pub async fn splice<A, B>(mut a: A, mut b: B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, SPLICE_BUF_BYTES, SPLICE_BUF_BYTES)
        .await
}

/// The whole data plane of one connection: opens the agent at `agent_url`, passes
/// the client's hello with `agent_token`, then splices until both sides are done.
/// `timeout` bounds opening the agent and waiting for the client's hello, each.
pub async fn bridge<C>(
    mut client: C,
    agent_url: &AgentUrl,
    agent_token: Option<&str>,
    timeout: Duration,
) -> Result<Spliced, SpliceError>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut agent = open_agent_stream(agent_url, timeout)
        .await
        .map_err(SpliceError::Open)?;
    let hello = tokio::time::timeout(timeout, forward_hello(&mut client, &mut agent, agent_token))
        .await
        .map_err(|_| SpliceError::HelloTimeout(timeout))??;
    let (to_agent, to_client) = splice(client, agent).await.map_err(SpliceError::Splice)?;
    Ok(Spliced {
        to_agent: hello + to_agent,
        to_client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::limits::MAX_FRAME_BYTES;
    use sandbox_protocol::{Hello, Request};
    use tokio::io::duplex;

    fn frame(id: u64, msg: ClientMsg) -> Vec<u8> {
        encode(
            &ClientFrame {
                id: RequestId(id),
                msg,
            },
            MAX_FRAME_BYTES,
        )
        .unwrap()
    }

    fn body(frame: &[u8]) -> ClientFrame {
        decode_body(&frame[LEN_PREFIX_BYTES..]).unwrap()
    }

    /// Runs `forward_hello` over what a client sent; returns what the agent got, what
    /// stayed unread on the client's stream, and the result.
    async fn forward(
        sent: &[u8],
        token: Option<&str>,
    ) -> (Vec<u8>, Vec<u8>, Result<u64, SpliceError>) {
        let (mut client, mut client_far) = duplex(64 * 1024);
        client_far.write_all(sent).await.unwrap();
        drop(client_far);
        let mut agent = Vec::new();
        let result = forward_hello(&mut client, &mut agent, token).await;
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        (agent, rest, result)
    }

    #[tokio::test]
    async fn the_hello_gets_the_agents_token_and_nothing_after_it_is_read() {
        let mut sent = frame(0, ClientMsg::Hello(Hello::new(Some("node-bearer".into()))));
        let next = frame(1, ClientMsg::Request(Request::Ps));
        sent.extend_from_slice(&next);
        let (agent, rest, result) = forward(&sent, Some("agent-token")).await;
        assert_eq!(result.unwrap(), agent.len() as u64);
        let ClientFrame {
            id,
            msg: ClientMsg::Hello(hello),
        } = body(&agent)
        else {
            panic!("not a hello: {agent:?}");
        };
        assert_eq!(id, RequestId::CONNECTION);
        assert_eq!(hello.token.as_deref(), Some("agent-token"));
        assert_eq!(
            hello,
            Hello {
                token: Some("agent-token".into()),
                ..Hello::new(None)
            }
        );
        assert_eq!(rest, next);
    }

    #[tokio::test]
    async fn a_hello_of_another_version_keeps_it_and_loses_the_clients_token() {
        let hello = Hello {
            version: 999,
            ..Hello::new(Some("mine".into()))
        };
        let (agent, _, result) = forward(&frame(0, ClientMsg::Hello(hello.clone())), None).await;
        result.unwrap();
        let ClientFrame {
            msg: ClientMsg::Hello(got),
            ..
        } = body(&agent)
        else {
            panic!("not a hello");
        };
        assert_eq!(
            got,
            Hello {
                token: None,
                ..hello
            }
        );
    }

    #[tokio::test]
    async fn other_first_frames_pass_unchanged() {
        let request = frame(1, ClientMsg::Request(Request::Ps));
        let garbage = [3, 0, 0, 0, 0xff, 0xfe, 0xfd].to_vec();
        // A hello under another id is not the handshake.
        let hello_at_7 = frame(7, ClientMsg::Hello(Hello::new(Some("t".into()))));
        for sent in [request, garbage, hello_at_7] {
            let (agent, rest, result) = forward(&sent, Some("agent-token")).await;
            result.unwrap();
            assert_eq!(agent, sent);
            assert!(rest.is_empty());
        }
    }

    #[tokio::test]
    async fn an_oversize_first_frame_is_not_buffered() {
        let mut sent = u32::try_from(MAX_FRAME_BYTES)
            .unwrap()
            .to_le_bytes()
            .to_vec();
        sent.extend_from_slice(&[7u8; 100]);
        let (agent, rest, result) = forward(&sent, Some("agent-token")).await;
        assert_eq!(result.unwrap(), LEN_PREFIX_BYTES as u64);
        assert_eq!(agent, sent[..LEN_PREFIX_BYTES]);
        assert_eq!(rest, sent[LEN_PREFIX_BYTES..]);
    }

    #[tokio::test]
    async fn a_client_gone_before_its_hello_is_reported() {
        for sent in [&[][..], &[9, 0][..], &[9, 0, 0, 0, 1, 2][..]] {
            let (_, _, result) = forward(sent, None).await;
            assert!(
                matches!(result, Err(SpliceError::ClientClosed)),
                "{sent:?}: {result:?}"
            );
        }
    }

    #[tokio::test]
    async fn splice_carries_a_half_close_and_the_answer_after_it() {
        let (mut client, client_end) = duplex(1024);
        let (agent_end, mut agent) = duplex(1024);
        let spliced = tokio::spawn(splice(client_end, agent_end));
        client.write_all(b"last request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        agent.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last request");
        // The client stopped sending; the agent's answer still reaches it.
        agent.write_all(b"final reply").await.unwrap();
        agent.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"final reply");
        assert_eq!(spliced.await.unwrap().unwrap(), (12, 11));
    }

    #[tokio::test]
    async fn node_urls_are_not_local_agents() {
        let url: AgentUrl = "http://127.0.0.1:1/v1/sandboxes/a/agent".parse().unwrap();
        let err = open_agent_stream(&url, Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, ClientError::NotLocal { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn hvsock_agents_are_opened_after_the_connect_exchange() {
        let dir = std::env::temp_dir().join(format!("sandbox-splice-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.vsock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let vmm = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut line = [0u8; 13];
            conn.read_exact(&mut line).await.unwrap();
            assert_eq!(&line, b"CONNECT 1024\n");
            conn.write_all(b"OK 5\nfrom the agent").await.unwrap();
            conn
        });
        let url = AgentUrl::Hvsock { path, port: 1024 };
        let mut stream = open_agent_stream(&url, Duration::from_secs(10))
            .await
            .unwrap();
        let mut got = [0u8; 14];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"from the agent");
        drop(vmm.await.unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
