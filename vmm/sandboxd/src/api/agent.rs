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
//! the two streams byte for byte (`sandbox_vmm::splice`). Every bound the agent keeps (windows, budgets,
//! frame sizes) holds end to end; the daemon buffers one copy buffer per direction.

use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandbox_vmm::client::{AgentStream, NODE_UPGRADE_TOKEN};
use sandbox_vmm::splice::{self, SpliceError};

use super::sandboxes::authorized;
use super::{ApiError, AppState};
use crate::silkd::SILKD_UPGRADE;

/// The `Upgrade` token of this project's agent protocol (the client's, in one place).
pub const AGENT_UPGRADE: &str = NODE_UPGRADE_TOKEN;

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
    let sandbox = authorized(&state, &headers, None, &id).await?;
    let wanted = headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if wanted.eq_ignore_ascii_case(SILKD_UPGRADE) {
        return silkd_upgrade(&state, sandbox, request).await;
    }
    if !wanted.eq_ignore_ascii_case(AGENT_UPGRADE) {
        return Err(ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!(
                "This endpoint speaks the agent protocol: send Connection: Upgrade and \
                 Upgrade: {AGENT_UPGRADE} (or {SILKD_UPGRADE}, seed 000's frames)"
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
    let agent = splice::open_agent_stream(sandbox.agent_url(), AGENT_CONNECT_TIMEOUT)
        .await
        .map_err(|error| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "unreachable",
                format!(
                    "Cannot open a stream to the sandbox's agent: {}",
                    sandbox_vmm::error_chain(&error)
                ),
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

/// `Upgrade: silkd`: wakes the sandbox (so a failure is still an HTTP error),
/// answers `101` and serves seed 000's frames on the connection (`crate::silkd`).
async fn silkd_upgrade(
    state: &AppState,
    sandbox: std::sync::Arc<sandbox_engine::sandbox::Sandbox>,
    request: Request,
) -> Result<Response, ApiError> {
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
    let on_upgrade = hyper::upgrade::on(request);
    state.metrics.upgraded();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let client = hyper_util::rt::TokioIo::new(upgraded);
                if let Err(error) = crate::silkd::serve(&*sandbox, client).await {
                    tracing::debug!(sandbox = %sandbox.id, %error, "silkd connection ended");
                }
            }
            Err(error) => tracing::debug!(sandbox = %sandbox.id, %error, "upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let response_headers = response.headers_mut();
    response_headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response_headers.insert(header::UPGRADE, HeaderValue::from_static(SILKD_UPGRADE));
    Ok(response)
}

/// Passes the client's `Hello` to the agent with the VM's token, then splices.
async fn relay<C>(
    mut client: C,
    mut agent: Box<dyn AgentStream>,
    token: Option<String>,
) -> Result<(), SpliceError>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::time::timeout(
        HELLO_TIMEOUT,
        splice::forward_hello(&mut client, &mut agent, token.as_deref()),
    )
    .await
    .map_err(|_| SpliceError::HelloTimeout(HELLO_TIMEOUT))??;
    splice::splice(client, agent)
        .await
        .map_err(SpliceError::Splice)?;
    Ok(())
}
