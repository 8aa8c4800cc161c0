//! The HTTP API: routes, the shared state, and the JSON extractor whose rejections
//! are typed JSON errors like every other failure.
//!
//! | method and path | who | what |
//! | --- | --- | --- |
//! | `POST /v1/claim` | operator | a sandbox: `{template, net, size, ttl_seconds, no_redirect}` → `{id, token, deadline, owner_addr, ...}`; in a fleet, 200 `{redirect: [ADDR...]}` when placement picks another node ([`crate::placement`]) |
//! | `GET /v1/sandboxes` | operator: all; sandbox token: its own | the live sandboxes (never tokens) |
//! | `GET /v1/sandboxes/{id}` | operator or its token | one sandbox |
//! | `POST /v1/sandboxes/{id}/release` | operator or its token | destroy it |
//! | `POST /v1/sandboxes/{id}/renew` | operator or its token | `{ttl_seconds}` → `{deadline}` |
//! | `POST /v1/sandboxes/{id}/fork` | operator or its token | `{count, ttl_seconds}` → `{children: [claim...]}` |
//! | `POST /v1/sandboxes/{id}/checkpoint` | operator or its token | `{name}` → `{checkpoint: {id, name, sandbox_id, created_at, stored}}`; with `--store`, answered once uploaded |
//! | `POST /v1/sandboxes/{id}/hibernate` | operator or its token | snapshot and stop; the next agent connection wakes it |
//! | `POST /v1/sandboxes/{id}/promote` | operator or its token | `{template}` → `{key: {template}, content_digest}` |
//! | `GET /v1/sandboxes/{id}/egress-log?tail=N` | operator or its token | `{id, allowlist, records}`: its egress connections |
//! | `GET /v1/sandboxes/{id}/owner` | operator or its token | `{id, owner_addr}`: which node holds it |
//! | `GET /v1/sandboxes/{id}/agent` | operator or its token | `Upgrade: sandbox-agent`: the agent protocol; `Upgrade: silkd`: seed 000's frames (`crate::silkd`) |
//! | `POST /v1/sandboxes/{id}/preview` | operator or its token | `{port, ttl_seconds}` → `{url, port, expires_at}` |
//! | any `/preview/{secret}/...` | whoever holds the URL | HTTP and WebSocket to the guest port |
//! | `GET /v1/checkpoints` | operator | the checkpoints; with `--store`, `stored` on each, and those only in the store (`remote`) |
//! | `POST /v1/checkpoints/{id}/claim` | operator | a sandbox from it: `{ttl_seconds, no_redirect}` → claim (or a redirect, as `/v1/claim`); with `--store`, one this node lacks is downloaded first |
//! | `DELETE /v1/checkpoints/{id}` | operator | delete it (refused while used); with `--store`, from the store and etcd too |
//! | `DELETE /v1/templates?template=NAME` | operator | delete a promoted template (refused while used); with `--store`, from the store too |
//! | `POST /v1/store/gc` | operator | `{grace_seconds, dry_run}`: delete the store's blobs no manifest names, older than the grace (a day; at least an hour) |
//! | `POST /v1/templates/{name}/publish` | operator | put a local template in the object store; a claim of a template a node lacks downloads it from there |
//! | `GET /v1/info` | operator | pool, templates, capacity, claims, drain |
//! | `POST` / `DELETE /v1/drain` | operator | refuse claims / take them again; `{hibernate}`; in a fleet with a store, hibernated sandboxes are parked for other nodes to wake (`{parked, not_parked}`) |
//! | `GET /v1/peers` | operator | `{peers: [ADDR...], nodes: [record + alive...], lost: [...], parked: [...]}`; `{peers: []}` on a single node |
//! | `GET /healthz` | anyone | `ok` |
//! | `GET /metrics` | anyone on the listen address | Prometheus text |
//!
//! Seed 000's clients send a sandbox's token in the body of fork, checkpoint and
//! promote (`"token"`): accepted like the bearer. The JSON shapes are
//! `sandbox_vmm::node_api::wire`, which the clients share.

mod agent;
mod checkpoints;
pub mod error;
mod node;
mod preview;
mod sandboxes;
mod templates;

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, Uri};
use axum::routing::{any, delete, get, post};
use axum::Router;
use sandbox_engine::Node;
use serde::de::DeserializeOwned;

use crate::auth::{caller, Caller, OperatorToken};
use crate::metrics::Metrics;
pub use error::ApiError;

/// The largest request body accepted: every body here is a few fields.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What every handler reaches.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The engine.
    pub node: Arc<Node>,
    /// The operator's token.
    pub operator: OperatorToken,
    /// What claims report as `owner_addr`.
    pub advertise: String,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The preview URLs minted (see [`crate::preview`]).
    pub previews: Arc<crate::preview::Previews>,
    /// Fleet membership, when the node is in one (`--etcd`).
    pub membership: Option<sandbox_fleet::membership::Membership>,
    /// The object store checkpoints go to (`--store`).
    pub store: Option<Arc<crate::store::NodeStore>>,
    /// Parked sandboxes being taken by this node (see [`crate::parking`]).
    pub takes: Arc<crate::parking::Takes>,
}

impl AppState {
    /// Tells the fleet this node's use changed (a claim, a release), so its record
    /// is re-published now rather than at the next refresh: placement elsewhere
    /// reads it.
    pub fn use_changed(&self) {
        if let Some(membership) = &self.membership {
            membership.changed();
        }
    }

    /// Refuses anything but the operator.
    pub fn require_operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match caller(&self.operator, headers) {
            Caller::Operator => Ok(()),
            Caller::Bearer => Err(ApiError::operator_only()),
            Caller::Anonymous => Err(ApiError::unauthorized()),
        }
    }
}

/// The routes over `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/claim", post(sandboxes::claim))
        .route("/v1/sandboxes", get(sandboxes::list))
        .route("/v1/sandboxes/{id}", get(sandboxes::show))
        .route("/v1/sandboxes/{id}/release", post(sandboxes::release))
        .route("/v1/sandboxes/{id}/renew", post(sandboxes::renew))
        .route("/v1/sandboxes/{id}/fork", post(sandboxes::fork))
        .route("/v1/sandboxes/{id}/checkpoint", post(sandboxes::checkpoint))
        .route("/v1/sandboxes/{id}/hibernate", post(sandboxes::hibernate))
        .route("/v1/sandboxes/{id}/promote", post(sandboxes::promote))
        .route("/v1/sandboxes/{id}/owner", get(sandboxes::owner))
        .route("/v1/sandboxes/{id}/egress-log", get(sandboxes::egress_log))
        .route("/v1/sandboxes/{id}/agent", get(agent::upgrade))
        .route("/v1/sandboxes/{id}/preview", post(preview::mint))
        .route("/preview/{secret}", any(preview::proxy))
        .route("/preview/{secret}/", any(preview::proxy))
        .route("/preview/{secret}/{*rest}", any(preview::proxy))
        .route("/v1/checkpoints", get(checkpoints::list))
        .route("/v1/checkpoints/{id}", delete(checkpoints::delete))
        .route("/v1/checkpoints/{id}/claim", post(checkpoints::claim))
        .route("/v1/templates", delete(templates::delete))
        .route("/v1/templates/{name}/publish", post(templates::publish))
        .route("/v1/store/gc", post(templates::store_gc))
        .route("/v1/info", get(node::info))
        .route("/v1/drain", post(node::drain).delete(node::uncordon))
        .route("/v1/peers", get(node::peers))
        .route("/healthz", get(node::healthz))
        .route("/metrics", get(node::metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::no_route(uri.path())
}

async fn wrong_method(uri: Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take this method", uri.path()),
    )
}

/// A JSON body whose every rejection (not JSON, malformed, unknown fields, too
/// large, wrong content type) is an [`ApiError`]. An empty body is `T::default()`:
/// seed 000's clients send none when every field is at its default.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S, T> FromRequest<S> for Body<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rejection| {
                ApiError::new(
                    rejection.status(),
                    "bad_request",
                    format!("Cannot read the request body: {}", rejection.body_text()),
                )
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(Self)
            .map_err(|error| ApiError::bad_request(format!("Invalid JSON body: {error}")))
    }
}
