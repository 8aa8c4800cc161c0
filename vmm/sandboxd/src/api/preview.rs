//! Preview URLs over HTTP: minting (`POST /v1/sandboxes/{id}/preview`) and serving
//! (`/preview/{secret}/...`, any method), see [`crate::preview`] for the links.
//!
//! A request to a link is proxied on a connection of its own to the guest port
//! ([`sandbox_vmm::Client::dial_port`]): the `/preview/{secret}` prefix is stripped,
//! `Host` becomes `localhost:PORT` (what a dev server expects to be called), and the
//! answer streams back. An `Upgrade` (a WebSocket) that the guest accepts with `101`
//! joins the two upgraded connections byte for byte. Bounds: hyper's own limits on
//! the request head, [`MAX_PREVIEW_CONNECTIONS_PER_SANDBOX`] connections per
//! sandbox, and the agent's idle bound on every port pipe.

use std::time::Duration;

use axum::body::Body as HttpBody;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use sandbox_vmm::node_api::wire::{PreviewBody, PreviewReply};

use super::sandboxes::{authorized, rfc3339};
use super::{ApiError, AppState, Body};
use crate::preview::{MintError, MAX_PREVIEW_CONNECTIONS_PER_SANDBOX};

/// The longest TTL a link may ask for (the claim's end bounds it anyway).
pub const MAX_PREVIEW_TTL_SECS: u64 = 30 * 24 * 3600;

/// The path prefix of every link.
pub const PREVIEW_PREFIX: &str = "/preview/";

/// `POST /v1/sandboxes/{id}/preview`
pub async fn mint(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<PreviewBody>,
) -> Result<Json<PreviewReply>, ApiError> {
    let sandbox = authorized(&state, &headers, Some(&body.token), &id).await?;
    if body.ttl_seconds > MAX_PREVIEW_TTL_SECS {
        return Err(ApiError::bad_request(format!(
            "ttl_seconds must be at most {MAX_PREVIEW_TTL_SECS}"
        )));
    }
    let ttl = (body.ttl_seconds > 0).then(|| Duration::from_secs(body.ttl_seconds));
    let minted = state
        .previews
        .mint(&sandbox, body.port, ttl)
        .map_err(|error| match error {
            MintError::Port => ApiError::bad_request(error.to_string()),
            MintError::TooMany => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many", error.to_string())
            }
            MintError::Random(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                sandbox_vmm::error_chain(&error),
            ),
        })?;
    Ok(Json(PreviewReply {
        url: minted.url,
        port: body.port,
        expires_at: minted.expires_at.map(rfc3339).unwrap_or_default(),
    }))
}

/// The one answer for a secret that is wrong, expired or whose sandbox is gone.
fn no_such_preview() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "No such preview")
}

/// `/preview/{secret}` and `/preview/{secret}/{*rest}`, any method.
pub async fn proxy(State(state): State<AppState>, mut request: Request) -> Response {
    match forward(&state, &mut request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn forward(state: &AppState, request: &mut Request) -> Result<Response, ApiError> {
    let (secret, rest) = split_preview_path(request.uri()).ok_or_else(no_such_preview)?;
    let (link, sandbox) = state
        .previews
        .resolve(secret, |id| state.node.sandbox(id).ok())
        .ok_or_else(no_such_preview)?;
    let slot = state.previews.slot(&link.sandbox).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!(
                "This sandbox's preview URLs have {MAX_PREVIEW_CONNECTIONS_PER_SANDBOX} \
                 connections open; try again"
            ),
        )
    })?;
    let guest = unreachable(&link.port, async {
        sandbox
            .client()
            .await
            .map_err(|error| sandbox_vmm::error_chain(&error))?
            .dial_port(link.port)
            .await
            .map_err(|error| sandbox_vmm::error_chain(&error))
    })
    .await?;
    // The request as the guest server sees it: no prefix, its own Host.
    let path_and_query = rest.to_owned();
    *request.uri_mut() = Uri::try_from(path_and_query)
        .map_err(|_| ApiError::bad_request("The path after the preview secret is not a URI"))?;
    let host = HeaderValue::try_from(format!("localhost:{}", link.port))
        .map_err(|_| ApiError::bad_request("bad port"))?;
    request.headers_mut().insert(header::HOST, host);
    let client_upgrade = hyper::upgrade::on(&mut *request);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(guest))
        .await
        .map_err(|error| bad_gateway(&format!("HTTP to guest port {}: {error}", link.port)))?;
    let conn_slot = std::sync::Arc::new(slot);
    let held = conn_slot.clone();
    tokio::spawn(async move {
        // Held while the guest connection lives (the body streams through it).
        let _slot = held;
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "preview connection ended");
        }
    });
    let outgoing = std::mem::replace(request, Request::new(HttpBody::empty()));
    let mut response = sender
        .send_request(outgoing)
        .await
        .map_err(|error| bad_gateway(&format!("guest port {}: {error}", link.port)))?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let guest_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let _slot = conn_slot;
            let (Ok(client), Ok(guest)) = tokio::join!(client_upgrade, guest_upgrade) else {
                tracing::debug!("a preview upgrade did not complete");
                return;
            };
            let mut client = TokioIo::new(client);
            let mut guest = TokioIo::new(guest);
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut guest).await {
                tracing::debug!(%error, "preview upgrade ended");
            }
        });
    }
    Ok(response.map(HttpBody::new))
}

/// `(secret, rest)` of `/preview/{secret}[/rest][?query]`; `rest` starts with `/`.
fn split_preview_path(uri: &Uri) -> Option<(&str, String)> {
    let path = uri.path().strip_prefix(PREVIEW_PREFIX)?;
    let (secret, rest) = match path.find('/') {
        Some(at) => (&path[..at], &path[at..]),
        None => (path, "/"),
    };
    if secret.is_empty() {
        return None;
    }
    let rest = match uri.query() {
        Some(query) => format!("{rest}?{query}"),
        None => rest.to_owned(),
    };
    Some((secret, rest))
}

async fn unreachable(
    port: &u16,
    dial: impl std::future::Future<Output = Result<sandbox_vmm::client::PortStream, String>>,
) -> Result<sandbox_vmm::client::PortStream, ApiError> {
    dial.await
        .map_err(|why| bad_gateway(&format!("Cannot reach guest port {port}: {why}")))
}

fn bad_gateway(message: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "unreachable", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_and_secret_are_stripped_and_the_query_kept() {
        let uri: Uri = "/preview/abc/x/y?q=1".parse().unwrap();
        assert_eq!(
            split_preview_path(&uri),
            Some(("abc", "/x/y?q=1".to_owned()))
        );
        let uri: Uri = "/preview/abc".parse().unwrap();
        assert_eq!(split_preview_path(&uri), Some(("abc", "/".to_owned())));
        let uri: Uri = "/preview/abc?x".parse().unwrap();
        assert_eq!(split_preview_path(&uri), Some(("abc", "/?x".to_owned())));
        let uri: Uri = "/preview//x".parse().unwrap();
        assert_eq!(split_preview_path(&uri), None);
        let uri: Uri = "/v1/info".parse().unwrap();
        assert_eq!(split_preview_path(&uri), None);
    }
}
