//! Claims and the verbs on one sandbox, in seed 000's shapes.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_engine::node::{ClaimRequest, NetRequest};
use sandbox_engine::sandbox::Sandbox;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState, Body};
use crate::auth::{caller, may_use, Caller};

/// `POST /v1/claim`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// A template name; empty for the node's default.
    #[serde(default)]
    pub template: String,
    /// `none` (or empty) or `egress`.
    #[serde(default)]
    pub net: String,
    /// With egress: narrow the operator's allowlist.
    #[serde(default)]
    pub allow: Vec<String>,
    /// A size preset; empty for the template's.
    #[serde(default)]
    pub size: String,
    /// Lifetime; 0 for one hour.
    #[serde(default)]
    pub ttl_seconds: u64,
    /// The caller's own label for the claim, echoed in listings.
    #[serde(default)]
    pub claim_ref: String,
    /// Seed 000's clients set these for its mesh; a single node has no peer to
    /// redirect to, so both are accepted and change nothing.
    #[serde(default)]
    pub no_redirect: bool,
    /// See `no_redirect`.
    #[serde(default)]
    pub require_promoted: bool,
    /// Volumes: not offered by this node (refused when non-empty).
    #[serde(default)]
    pub volumes: Vec<serde_json::Value>,
}

/// A claimed sandbox, as a claim, fork or branch answers it.
#[derive(Debug, Serialize)]
pub struct ClaimReply {
    /// The sandbox's id.
    pub id: String,
    /// Its token: shown once, here.
    pub token: String,
    /// When it is destroyed (RFC 3339, UTC).
    pub deadline: String,
    /// The node that holds it.
    pub owner_addr: String,
    /// Its template.
    pub template: String,
    /// Its size.
    pub size: String,
    /// Whether a warm VM was waiting.
    pub warm: bool,
    /// How long the claim took.
    pub claim_ms: u64,
    /// The checkpoint it started from, if it did.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub from_checkpoint: String,
}

impl ClaimReply {
    /// The reply for `sandbox`, newly made.
    pub fn new(state: &AppState, sandbox: &Sandbox) -> Self {
        use sandbox_engine::sandbox::Lineage;
        Self {
            id: sandbox.id.to_string(),
            token: sandbox.token.reveal().to_owned(),
            deadline: deadline(sandbox),
            owner_addr: state.advertise.clone(),
            template: sandbox.template.clone(),
            size: sandbox
                .size
                .map(|size| size.to_string())
                .unwrap_or_default(),
            warm: sandbox.warm,
            claim_ms: sandbox_engine::util::millis(sandbox.claim_duration),
            from_checkpoint: match &sandbox.lineage {
                Lineage::Checkpoint { id, .. } => id.clone(),
                _ => String::new(),
            },
        }
    }
}

/// A sandbox in a listing: never its token.
#[derive(Debug, Serialize)]
pub struct SandboxRow {
    id: String,
    /// What it was claimed as (`template` / `template:size`), seed 000's `key`.
    key: String,
    template: String,
    size: String,
    status: &'static str,
    claimed_at: String,
    deadline: String,
    lineage: String,
}

fn row(sandbox: &Sandbox) -> SandboxRow {
    use sandbox_engine::sandbox::Lineage;
    let size = sandbox
        .size
        .map(|size| size.to_string())
        .unwrap_or_default();
    SandboxRow {
        id: sandbox.id.to_string(),
        key: format!("{}:{size}", sandbox.template),
        template: sandbox.template.clone(),
        size,
        status: sandbox.status().as_str(),
        claimed_at: rfc3339(sandbox.claimed_at),
        deadline: deadline(sandbox),
        lineage: match &sandbox.lineage {
            Lineage::Template => "template".to_owned(),
            Lineage::Fork(parent) => format!("fork:{parent}"),
            Lineage::Checkpoint { id, .. } => format!("checkpoint:{id}"),
            Lineage::Attached => "attached".to_owned(),
        },
    }
}

/// RFC 3339 in UTC, seconds.
pub fn rfc3339(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

fn deadline(sandbox: &Sandbox) -> String {
    sandbox
        .deadline()
        .map(|deadline| rfc3339(deadline.wall))
        .unwrap_or_default()
}

/// The sandbox `id` when the caller may use it. An unknown id and a wrong token
/// answer alike to a caller without the operator token, so ids cannot be probed.
pub fn authorized(
    state: &AppState,
    headers: &HeaderMap,
    body_token: Option<&str>,
    id: &str,
) -> Result<Arc<Sandbox>, ApiError> {
    let operator = caller(&state.operator, headers) == Caller::Operator;
    match state.node.sandbox(id) {
        Ok(sandbox) if may_use(&state.operator, headers, body_token, &sandbox) => Ok(sandbox),
        Ok(_) => Err(ApiError::unauthorized()),
        Err(error) if operator => Err(error.into()),
        Err(_) => Err(ApiError::unauthorized()),
    }
}

pub async fn claim(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body<ClaimBody>,
) -> Result<impl IntoResponse, ApiError> {
    state.require_operator(&headers)?;
    tracing::debug!(
        no_redirect = body.no_redirect,
        require_promoted = body.require_promoted,
        "mesh flags of a claim (a single node has no peer: ignored)"
    );
    if !body.volumes.is_empty() {
        return Err(ApiError::bad_request(
            "volumes are not offered by this node; claim without them",
        ));
    }
    let net = match body.net.as_str() {
        "" | "none" => NetRequest::None,
        "egress" => NetRequest::Egress,
        other => {
            return Err(ApiError::bad_request(format!(
                "net must be \"none\" or \"egress\", not {other:?}"
            )))
        }
    };
    let request = ClaimRequest {
        template: Some(body.template).filter(|t| !t.trim().is_empty()),
        size: Some(body.size).filter(|s| !s.trim().is_empty()),
        net,
        allow: body.allow,
        ttl_seconds: body.ttl_seconds,
    };
    let started = Instant::now();
    let claimed = state.node.create(request).await;
    state.metrics.claimed(&claimed, started.elapsed());
    let claimed = claimed?;
    tracing::info!(sandbox = %claimed.sandbox.id, claim_ref = %body.claim_ref, "claim served");
    Ok((
        StatusCode::CREATED,
        Json(ClaimReply::new(&state, &claimed.sandbox)),
    ))
}

#[derive(Serialize)]
pub struct ListReply {
    sandboxes: Vec<SandboxRow>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<ListReply>, ApiError> {
    let sandboxes = state.node.registry().list();
    let visible: Vec<SandboxRow> = match caller(&state.operator, &headers) {
        Caller::Operator => sandboxes.iter().map(|sandbox| row(sandbox)).collect(),
        Caller::Bearer => sandboxes
            .iter()
            .filter(|sandbox| may_use(&state.operator, &headers, None, sandbox))
            .map(|sandbox| row(sandbox))
            .collect(),
        Caller::Anonymous => return Err(ApiError::unauthorized()),
    };
    Ok(Json(ListReply { sandboxes: visible }))
}

pub async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SandboxRow>, ApiError> {
    let sandbox = authorized(&state, &headers, None, &id)?;
    Ok(Json(row(&sandbox)))
}

#[derive(Serialize)]
pub struct Released {
    id: String,
    released: bool,
}

pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Released>, ApiError> {
    authorized(&state, &headers, None, &id)?;
    let sandbox = state.node.release(&id).await?;
    Ok(Json(Released {
        id: sandbox.id.to_string(),
        released: true,
    }))
}

/// `POST /v1/sandboxes/{id}/renew`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    #[serde(default)]
    ttl_seconds: u64,
    #[serde(default)]
    token: String,
}

#[derive(Serialize)]
pub struct Renewed {
    id: String,
    deadline: String,
}

pub async fn renew(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id)?;
    let sandbox = state.node.renew(&id, body.ttl_seconds)?;
    Ok(Json(Renewed {
        id: sandbox.id.to_string(),
        deadline: deadline(&sandbox),
    }))
}

/// `POST /v1/sandboxes/{id}/fork`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    #[serde(default)]
    token: String,
    #[serde(default = "one")]
    count: u64,
    #[serde(default)]
    ttl_seconds: u64,
}

fn one() -> u64 {
    1
}

#[derive(Serialize)]
pub struct ForkReply {
    id: String,
    children: Vec<ClaimReply>,
    pause_ms: u64,
    fork_ms: u64,
}

pub async fn fork(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<ForkBody>,
) -> Result<Json<ForkReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id)?;
    // An empty body is `Default`, whose count is 0: one child, as for no count.
    let count = body.count.max(1);
    if body.ttl_seconds > 0 {
        sandbox_engine::node::claim_ttl_secs(body.ttl_seconds)
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
    }
    let forked = state.node.fork(&id, count).await?;
    let mut children = Vec::with_capacity(forked.children.len());
    for child in &forked.children {
        let child = if body.ttl_seconds > 0 {
            state.node.renew(child.id.as_str(), body.ttl_seconds)?
        } else {
            child.clone()
        };
        children.push(ClaimReply::new(&state, &child));
    }
    state.metrics.forked(children.len());
    Ok(Json(ForkReply {
        id: forked.parent.id.to_string(),
        children,
        pause_ms: sandbox_engine::util::millis(forked.pause),
        fork_ms: sandbox_engine::util::millis(forked.took),
    }))
}

/// `POST /v1/sandboxes/{id}/checkpoint`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    #[serde(default)]
    token: String,
    #[serde(default)]
    name: String,
}

#[derive(Serialize)]
pub struct CheckpointReply {
    checkpoint: super::checkpoints::CheckpointRow,
    pause_ms: u64,
    took_ms: u64,
}

pub async fn checkpoint(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<CheckpointBody>,
) -> Result<Json<CheckpointReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id)?;
    let name = Some(body.name).filter(|name| !name.trim().is_empty());
    let taken = state.node.checkpoint(&id, name).await?;
    Ok(Json(CheckpointReply {
        checkpoint: super::checkpoints::CheckpointRow::new(&taken.manifest, Vec::new()),
        pause_ms: sandbox_engine::util::millis(taken.pause),
        took_ms: sandbox_engine::util::millis(taken.took),
    }))
}

/// `POST /v1/sandboxes/{id}/hibernate`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    #[serde(default)]
    token: String,
}

#[derive(Serialize)]
pub struct HibernateReply {
    id: String,
    hibernated_now: bool,
    bytes_on_disk: u64,
    deadline: String,
}

pub async fn hibernate(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<TokenBody>,
) -> Result<Json<HibernateReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id)?;
    let done = state.node.hibernate(&id).await?;
    Ok(Json(HibernateReply {
        id: done.sandbox.id.to_string(),
        hibernated_now: done.now,
        bytes_on_disk: done.image.bytes_on_disk,
        deadline: deadline(&done.sandbox),
    }))
}

/// `POST /v1/sandboxes/{id}/promote`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromoteBody {
    #[serde(default)]
    token: String,
    #[serde(default)]
    template: String,
}

#[derive(Serialize)]
pub struct TemplateKey {
    template: String,
}

#[derive(Serialize)]
pub struct PromoteReply {
    key: TemplateKey,
    replaced: bool,
    pause_ms: u64,
    took_ms: u64,
}

pub async fn promote(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<PromoteBody>,
) -> Result<Json<PromoteReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id)?;
    let done = state.node.promote(&id, &body.template).await?;
    Ok(Json(PromoteReply {
        key: TemplateKey {
            template: done.name,
        },
        replaced: done.replaced,
        pause_ms: sandbox_engine::util::millis(done.pause),
        took_ms: sandbox_engine::util::millis(done.took),
    }))
}
