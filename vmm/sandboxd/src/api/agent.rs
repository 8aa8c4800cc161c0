//! The data plane: `GET /v1/sandboxes/{id}/agent` with `Connection: Upgrade` and
//! `Upgrade: sandbox-agent` turns the HTTP connection into this project's agent
//! protocol to that sandbox, so every client feature (streamed exec, terminals,
//! put/get with flow control, eval, waits) works from another machine as it does
//! over the VM's own socket.
//!
//! The daemon authenticates the HTTP request (the operator's token or the sandbox's),
//! wakes a hibernated sandbox, and opens a raw stream to the agent before it answers
//! `101`, so a failure is an HTTP error with a JSON body, never a dead socket. Then
//! it reads the client's `Hello` (at most the agent's pre-`Hello` frame size, within
//! the agent's own `Hello` deadline), puts the VM's agent token in it (the remote
//! client never sees that token: it is the node's, per VM), forwards it, and splices
//! the two streams byte for byte. Every bound the agent keeps (windows, budgets,
//! frame sizes) holds end to end; the daemon buffers one copy buffer per direction.

use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandbox_protocol::frame::{decode_body, encode, LEN_PREFIX_BYTES};
use sandbox_protocol::limits::HELLO_FRAME_BYTES;
use sandbox_protocol::message::{ClientFrame, ClientMsg};
use sandbox_vmm::client::{AgentStream, AgentUrl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::sandboxes::authorized;
use super::{ApiError, AppState};

/// The `Upgrade` token of this project's agent protocol.
pub const AGENT_UPGRADE: &str = "sandbox-agent";

/// How long the client has to send its `Hello` after the `101` (the agent's own
/// pre-`Hello` deadline).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long opening the raw stream to the agent may take.
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let sandbox = authorized(&state, &headers, None, &id)?;
    let wanted = headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !wanted.eq_ignore_ascii_case(AGENT_UPGRADE) {
        return Err(ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!(
                "This endpoint speaks the agent protocol: send Connection: Upgrade and \
                 Upgrade: {AGENT_UPGRADE}"
            ),
        ));
    }
    // Wakes a hibernated sandbox, and proves its agent answers.
    sandbox.client().await.map_err(|error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "unreachable",
            format!(
                "The sandbox's agent cannot be reached: {}",
                sandbox_vmm::error_chain(&error)
            ),
        )
    })?;
    let agent = tokio::time::timeout(AGENT_CONNECT_TIMEOUT, open_raw(sandbox.agent_url()))
        .await
        .map_err(|_| std::io::Error::other("timed out"))
        .and_then(|opened| opened)
        .map_err(|error| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "unreachable",
                format!("Cannot open a stream to the sandbox's agent: {error}"),
            )
        })?;
    let token = sandbox.agent_token().map(str::to_owned);
    let on_upgrade = hyper::upgrade::on(request);
    state.metrics.upgraded();
    let sandbox_id = sandbox.id.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let client = hyper_util::rt::TokioIo::new(upgraded);
                if let Err(error) = relay(client, agent, token).await {
                    tracing::debug!(sandbox = %sandbox_id, %error, "agent connection ended");
                }
            }
            Err(error) => tracing::debug!(sandbox = %sandbox_id, %error, "upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let response_headers = response.headers_mut();
    response_headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response_headers.insert(header::UPGRADE, HeaderValue::from_static(AGENT_UPGRADE));
    Ok(response)
}

/// A raw byte stream to the agent at `url`, nothing sent yet.
async fn open_raw(url: &AgentUrl) -> std::io::Result<Box<dyn AgentStream>> {
    match url {
        AgentUrl::Unix(path) => Ok(Box::new(tokio::net::UnixStream::connect(path).await?)),
        AgentUrl::Hvsock { path, port } => {
            let mut stream = tokio::net::UnixStream::connect(path).await?;
            sandbox_vmm::client::hvsock::handshake(&mut stream, *port)
                .await
                .map_err(std::io::Error::other)?;
            Ok(Box::new(stream))
        }
        // The launcher's VMs are reached through their run folders' sockets; a raw
        // vsock agent is attach mode's, which the daemon does not serve.
        AgentUrl::Vsock { cid, port } => Err(std::io::Error::other(format!(
            "vsock://{cid}:{port}: the node reaches its VMs over their run folders' sockets only"
        ))),
    }
}

/// Why a relayed connection ended early.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    /// The client's first frame is not a `Hello` of the agent protocol.
    #[error("The first frame is not a Hello")]
    NotHello,
    /// The client sent no `Hello` in time.
    #[error("No Hello within {0:?}")]
    HelloTimeout(Duration),
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Forwards the client's `Hello` with the VM's token in it, then splices.
async fn relay<C>(
    mut client: C,
    mut agent: Box<dyn AgentStream>,
    token: Option<String>,
) -> Result<(), RelayError>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut client))
        .await
        .map_err(|_| RelayError::HelloTimeout(HELLO_TIMEOUT))??;
    let ClientFrame {
        id,
        msg: ClientMsg::Hello(mut hello),
    } = hello
    else {
        return Err(RelayError::NotHello);
    };
    hello.token = token;
    let frame = ClientFrame {
        id,
        msg: ClientMsg::Hello(hello),
    };
    let bytes = encode(&frame, HELLO_FRAME_BYTES).map_err(|_| RelayError::NotHello)?;
    agent.write_all(&bytes).await?;
    tokio::io::copy_bidirectional(&mut client, &mut agent).await?;
    Ok(())
}

/// One frame of at most [`HELLO_FRAME_BYTES`], decoded.
async fn read_hello<C>(client: &mut C) -> Result<ClientFrame, RelayError>
where
    C: tokio::io::AsyncRead + Unpin,
{
    let mut prefix = [0u8; LEN_PREFIX_BYTES];
    client.read_exact(&mut prefix).await?;
    let len = usize::try_from(u32::from_le_bytes(prefix)).map_err(|_| RelayError::NotHello)?;
    if len > HELLO_FRAME_BYTES {
        return Err(RelayError::NotHello);
    }
    let mut body = vec![0u8; len];
    client.read_exact(&mut body).await?;
    decode_body(&body).map_err(|_| RelayError::NotHello)
}
