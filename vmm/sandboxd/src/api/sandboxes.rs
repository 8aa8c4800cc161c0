//! Claims and the verbs on one sandbox, in seed 000's shapes (the shapes themselves
//! are `sandbox_vmm::node_api::wire`, shared with the clients).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_engine::error::LookupError;
use sandbox_engine::image_build::BuildProgress;
use sandbox_engine::node::{ClaimRequest, NetRequest};
use sandbox_engine::registry::{Gone, Lookup};
use sandbox_engine::sandbox::{Lineage, Sandbox};
use sandbox_engine::snapshot::ops::RamCapture;
use sandbox_fleet::membership::{token_sha256, Location, SandboxRecord};
use sandbox_vmm::node_api::wire::{
    CheckpointBody, CheckpointReply, ClaimBody, ClaimReply, EgressLogQuery, EgressLogReply,
    ForkBody, ForkReply, HibernateReply, OwnerReply, PromoteBody, PromoteReply, Released,
    RenewBody, Renewed, SandboxList, SandboxRow, TemplateKey, TokenBody,
};

use super::{ApiError, AppState, Body};
use crate::auth::{bearer, caller, may_use, Caller};
use crate::placement::{self, Wanted};

/// The reply for `sandbox`, newly made: the one answer that carries its token.
pub fn claim_reply(state: &AppState, sandbox: &Sandbox) -> ClaimReply {
    ClaimReply {
        id: sandbox.id.to_string(),
        token: sandbox.token.reveal().to_owned(),
        deadline: deadline(sandbox),
        owner_addr: state.advertise.clone(),
        template: sandbox.template.clone(),
        size: size(sandbox),
        warm: sandbox.warm,
        claim_ms: sandbox_engine::util::millis(sandbox.claim_duration),
        from_checkpoint: match &sandbox.lineage {
            Lineage::Checkpoint { id, .. } => id.clone(),
            _ => String::new(),
        },
    }
}

fn size(sandbox: &Sandbox) -> String {
    sandbox
        .size
        .map(|size| size.to_string())
        .unwrap_or_default()
}

/// A sandbox in a listing: never its token.
fn row(sandbox: &Sandbox) -> SandboxRow {
    let size = size(sandbox);
    SandboxRow {
        id: sandbox.id.to_string(),
        key: format!("{}:{size}", sandbox.template),
        template: sandbox.template.clone(),
        size,
        status: sandbox.status().as_str().to_owned(),
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

/// The sandbox `id` when the caller may use it. An id that is not here answers,
/// in a fleet, by where the fleet says it is, to the operator and to a caller with
/// the sandbox's own token (checked against the digest in its fleet record): a 421
/// naming the node that owns it, a 410 when it is lost; a parked sandbox (handed
/// to the fleet by a draining node) is taken and woken here when this node can, or
/// redirected to a node that can. Anyone else gets the same 401 for an unknown id
/// as for a wrong token, so ids cannot be probed.
pub async fn authorized(
    state: &AppState,
    headers: &HeaderMap,
    body_token: Option<&str>,
    id: &str,
) -> Result<Arc<Sandbox>, ApiError> {
    let error = match state.node.sandbox(id) {
        Ok(sandbox) if may_use(&state.operator, headers, body_token, &sandbox) => {
            return Ok(sandbox)
        }
        Ok(_) => return Err(ApiError::unauthorized()),
        Err(error) => error,
    };
    match whereabouts(state, headers, body_token, id, error).await {
        Whereabouts::Elsewhere { node_id, addr } => Err(elsewhere(id, &node_id, &addr)),
        Whereabouts::Parked(record) if parked_here(state, &record) => {
            match crate::parking::take(state, id).await {
                Ok(sandbox) => Ok(sandbox),
                Err(crate::parking::TakeError::TakenBy { node, .. }) => Err(ApiError::new(
                    StatusCode::MISDIRECTED_REQUEST,
                    "elsewhere",
                    format!("Sandbox {id} was woken on node {node} meanwhile: ask its owner"),
                )),
                Err(error) => Err(error.into()),
            }
        }
        Whereabouts::Parked(record) => Err(match crate::placement::waker(state, &record).await {
            Some(addr) => ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "elsewhere",
                format!("Sandbox {id} is parked in the fleet; the node at {addr} wakes it: send its calls there"),
            ),
            None => no_waker(id),
        }),
        Whereabouts::Denied(error) => Err(error),
    }
}

/// Where the fleet says a sandbox that is not here is, as the caller may learn it.
enum Whereabouts {
    /// A live node owns it.
    Elsewhere { node_id: String, addr: String },
    /// Handed to the fleet, hibernated; owned by no node.
    Parked(sandbox_fleet::membership::ParkedRecord),
    /// The answer to give (unknown, lost, or not the caller's).
    Denied(ApiError),
}

/// What the fleet says of sandbox `id`, which this node does not hold
/// (`error`), to the operator or a caller holding its token.
async fn whereabouts(
    state: &AppState,
    headers: &HeaderMap,
    body_token: Option<&str>,
    id: &str,
    error: LookupError,
) -> Whereabouts {
    let operator = caller(&state.operator, headers) == Caller::Operator;
    let presented: Vec<&str> = [bearer(headers), body_token]
        .into_iter()
        .flatten()
        .filter(|token| !token.is_empty())
        .collect();
    let may = |digest: &str| {
        operator
            || (!digest.is_empty() && presented.iter().any(|token| token_sha256(token) == digest))
    };
    // Nothing to check a digest against: no fleet lookup for it.
    if !operator && presented.is_empty() {
        return Whereabouts::Denied(ApiError::unauthorized());
    }
    match fleet_location(state, id, &error).await {
        Some(Location::Owned {
            node_id,
            addr,
            token_sha256,
        }) if may(&token_sha256) => Whereabouts::Elsewhere { node_id, addr },
        Some(Location::Parked(record)) if may(&record.token_sha256) => Whereabouts::Parked(record),
        Some(Location::Lost(record)) if may(&record.token_sha256) => {
            Whereabouts::Denied(lost(id, &record))
        }
        _ if operator => Whereabouts::Denied(error.into()),
        _ => Whereabouts::Denied(ApiError::unauthorized()),
    }
}

/// Whether this node takes the parked sandbox of `record` asked of it: it keeps a
/// store and is in the fleet, is not draining, runs the QEMU and machine type that
/// made the image, and has room for one more running VM.
fn parked_here(state: &AppState, record: &sandbox_fleet::membership::ParkedRecord) -> bool {
    if !crate::parking::enabled(state) || state.node.is_draining() {
        return false;
    }
    let qemu = state.store.as_ref().and_then(|store| store.qemu_version());
    if record.machine != std::env::consts::ARCH || qemu != Some(record.qemu_version.as_str()) {
        return false;
    }
    let capacity = state.node.status().capacity;
    capacity.claimable > 0
}

/// 421 `elsewhere`: node `node_id` at `addr` owns `id`.
fn elsewhere(id: &str, node_id: &str, addr: &str) -> ApiError {
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "elsewhere",
        format!("Sandbox {id} is held by node {node_id} at {addr}: send its calls there"),
    )
}

/// 503 `no_room`: a parked sandbox no node can wake now.
fn no_waker(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_room",
        format!("Sandbox {id} is parked in the fleet and no node with room can wake it now; try again later"),
    )
}

/// How long a lookup of an unknown id waits for the fleet before answering as a
/// single node would.
const LOCATE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Where the fleet says sandbox `id`, unknown here, is: `None` on a single node,
/// for an id that was here (released, expired), or when etcd does not answer in
/// time (the local answer stands).
async fn fleet_location(state: &AppState, id: &str, error: &LookupError) -> Option<Location> {
    let membership = state.membership.as_ref()?;
    if !matches!(error.why, Lookup::Unknown | Lookup::Gone(Gone::Moved)) {
        return None;
    }
    match tokio::time::timeout(LOCATE_WITHIN, membership.locate(id)).await {
        Ok(Ok(Location::Owned { node_id, .. })) if node_id == membership.node_id() => {
            // Owned here but not here: a take of a parked sandbox that failed and
            // could not give it back. Given back now, so that it can be taken.
            if state.takes.under_way(id) {
                return None;
            }
            let healed = async {
                membership.untake(id).await?;
                membership.locate(id).await
            };
            match tokio::time::timeout(LOCATE_WITHIN, healed).await {
                Ok(Ok(location @ Location::Parked(_))) => {
                    tracing::info!(%id, "a parked sandbox this node failed to take is given back");
                    Some(location)
                }
                _ => None,
            }
        }
        Ok(Ok(location)) => Some(location),
        Ok(Err(error)) => {
            tracing::warn!(%id, error = %error, "cannot locate a sandbox in the fleet");
            None
        }
        Err(_) => None,
    }
}

/// 410 `sandbox_lost`: the node that held `id` vanished with it.
fn lost(id: &str, record: &SandboxRecord) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "sandbox_lost",
        format!(
            "Sandbox {id} is lost: its node {} left the fleet without releasing it \
             (template {}, claimed at Unix time {})",
            record.node_id, record.template, record.created_unix
        ),
    )
}

pub async fn claim(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body<ClaimBody>,
) -> Result<impl IntoResponse, ApiError> {
    state.require_operator(&headers)?;
    if !body.volumes.is_empty() || body.volumes_attach_only {
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
    if !body.no_redirect {
        let wanted = Wanted::Template(Some(body.template.as_str()));
        if let Some(redirect) = placement::elsewhere(&state, wanted).await {
            return Ok((StatusCode::OK, Json(redirect)).into_response());
        }
    }
    // A template this node lacks comes from the store when it is there (the
    // download is checked by digest); otherwise the claim's own answer stands.
    if let Some(store) = &state.store {
        let name = body.template.trim();
        if !name.is_empty() && !state.node.template_names().iter().any(|t| t == name) {
            crate::store::fetch_template_detached(store, name).await?;
        }
    }
    let request = ClaimRequest {
        progress: Some(build_log(&body.claim_ref)),
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
    state.use_changed();
    tracing::info!(sandbox = %claimed.sandbox.id, claim_ref = %body.claim_ref, "claim served");
    Ok((
        StatusCode::CREATED,
        Json(claim_reply(&state, &claimed.sandbox)),
    )
        .into_response())
}

/// A claim-time build's progress as log events of the claim (an HTTP claim gets
/// one answer, at the end): every line at debug, one every
/// [`BUILD_LOG_EVERY_SECS`] at info.
fn build_log(claim_ref: &str) -> BuildProgress {
    let claim_ref = claim_ref.to_owned();
    let last = std::sync::Mutex::new(None::<Instant>);
    BuildProgress(std::sync::Arc::new(move |line: &str| {
        let mut last = sandbox_engine::util::lock(&last);
        let due = last.is_none_or(|at| at.elapsed().as_secs() >= BUILD_LOG_EVERY_SECS);
        if due {
            *last = Some(Instant::now());
            tracing::info!(claim_ref = %claim_ref, progress = %line, "claim-time build");
        } else {
            tracing::debug!(claim_ref = %claim_ref, progress = %line, "claim-time build");
        }
    }))
}

/// How often a claim-time build's progress is logged at info.
pub const BUILD_LOG_EVERY_SECS: u64 = 2;

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<SandboxList>, ApiError> {
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
    Ok(Json(SandboxList { sandboxes: visible }))
}

pub async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SandboxRow>, ApiError> {
    let sandbox = authorized(&state, &headers, None, &id).await?;
    Ok(Json(row(&sandbox)))
}

/// `GET /v1/sandboxes/{id}/owner`: seed 000's clients ask each node which one holds
/// a sandbox; on one node it is this one. A parked sandbox's owner is the node
/// that would wake it: this one when it can.
pub async fn owner(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<OwnerReply>, ApiError> {
    let error = match state.node.sandbox(&id) {
        Ok(sandbox) if may_use(&state.operator, &headers, None, &sandbox) => {
            return Ok(Json(OwnerReply {
                id: sandbox.id.to_string(),
                owner_addr: state.advertise.clone(),
            }))
        }
        Ok(_) => return Err(ApiError::unauthorized()),
        Err(error) => error,
    };
    let owner_addr = match whereabouts(&state, &headers, None, &id, error).await {
        Whereabouts::Elsewhere { addr, .. } => addr,
        Whereabouts::Parked(record) if parked_here(&state, &record) => state.advertise.clone(),
        Whereabouts::Parked(record) => crate::placement::waker(&state, &record)
            .await
            .ok_or_else(|| no_waker(&id))?,
        Whereabouts::Denied(error) => return Err(error),
    };
    Ok(Json(OwnerReply { id, owner_addr }))
}

/// Most records one egress-log request returns.
const MAX_EGRESS_TAIL: usize = 10_000;

/// `GET /v1/sandboxes/{id}/egress-log?tail=N`
pub async fn egress_log(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<EgressLogQuery>, QueryRejection>,
) -> Result<Json<EgressLogReply>, ApiError> {
    let sandbox = authorized(&state, &headers, None, &id).await?;
    let Query(query) = query.map_err(|rejection| {
        ApiError::bad_request(format!(
            "Bad query: {} (expected ?tail=N)",
            rejection.body_text()
        ))
    })?;
    let tail = query.tail.unwrap_or(100).min(MAX_EGRESS_TAIL);
    // The log is a file: read it off the async threads.
    let node = state.node.clone();
    let read = tokio::task::spawn_blocking(move || {
        let records = node.egress_log(&sandbox, tail);
        (sandbox, records)
    })
    .await
    .map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("The egress log read failed: {error}"),
        )
    })?;
    let (sandbox, records) = read;
    let records = match records {
        None => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                "This node is attached to one agent outside any VM: it has no egress log",
            ))
        }
        Some(Err(error)) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!(
                    "Cannot read the egress log of {}: {}",
                    sandbox.id,
                    sandbox_vmm::error_chain(&error)
                ),
            ))
        }
        Some(Ok(records)) => records,
    };
    Ok(Json(EgressLogReply {
        id: sandbox.id.to_string(),
        allowlist: state.node.egress_allow(),
        records,
    }))
}

pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<TokenBody>,
) -> Result<Json<Released>, ApiError> {
    if let Err(error) = state.node.sandbox(&id) {
        // Parked: released where it lies, without waking it anywhere.
        if let Whereabouts::Parked(_) =
            whereabouts(&state, &headers, Some(&body.token), &id, error).await
        {
            return release_parked(&state, &id).await;
        }
    }
    authorized(&state, &headers, Some(&body.token), &id).await?;
    let sandbox = state.node.release(&id).await?;
    state.use_changed();
    Ok(Json(Released {
        id: sandbox.id.to_string(),
        released: true,
    }))
}

/// Releases the parked sandbox `id`: its parked record, then its image's manifest.
async fn release_parked(state: &AppState, id: &str) -> Result<Json<Released>, ApiError> {
    let (Some(membership), Some(store)) = (&state.membership, &state.store) else {
        return Err(ApiError::unauthorized());
    };
    if !membership.drop_parked(id).await? {
        return Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "elsewhere",
            format!("Sandbox {id} was woken on another node meanwhile: release it there"),
        ));
    }
    if let Err(error) = store.delete_parked(id).await {
        tracing::warn!(sandbox = %id, error = %error, "cannot remove a released parked sandbox's image manifest");
    }
    tracing::info!(sandbox = %id, "parked sandbox released");
    Ok(Json(Released {
        id: id.to_owned(),
        released: true,
    }))
}

pub async fn renew(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id).await?;
    let sandbox = state.node.renew(&id, body.ttl_seconds)?;
    Ok(Json(Renewed {
        id: sandbox.id.to_string(),
        deadline: deadline(&sandbox),
    }))
}

pub async fn fork(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<ForkBody>,
) -> Result<Json<ForkReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id).await?;
    // `"count": 0` is one child, as no count is.
    let count = body.count.max(1);
    if body.ttl_seconds > 0 {
        sandbox_engine::node::claim_ttl_secs(body.ttl_seconds)
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
    }
    let forked = state.node.fork(&id, count).await?;
    state.use_changed();
    let mut children = Vec::with_capacity(forked.children.len());
    for child in &forked.children {
        let child = if body.ttl_seconds > 0 {
            state.node.renew(child.id.as_str(), body.ttl_seconds)?
        } else {
            child.clone()
        };
        children.push(claim_reply(&state, &child));
    }
    state.metrics.forked(children.len());
    Ok(Json(ForkReply {
        id: forked.parent.id.to_string(),
        children,
        pause_ms: sandbox_engine::util::millis(forked.pause),
        fork_ms: sandbox_engine::util::millis(forked.took),
    }))
}

pub async fn checkpoint(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<CheckpointBody>,
) -> Result<Json<CheckpointReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id).await?;
    let name = Some(body.name).filter(|name| !name.trim().is_empty());
    // One that goes to the store at once is whole: an upload would flatten an
    // incremental one right away.
    let ram = if body.full || state.store.is_some() {
        RamCapture::Whole
    } else {
        RamCapture::Incremental
    };
    let taken = state.node.checkpoint_with(&id, name, ram).await?;
    let mut reply = CheckpointReply {
        checkpoint: super::checkpoints::checkpoint_row(&taken.manifest, Vec::new()),
        pause_ms: sandbox_engine::util::millis(taken.pause),
        took_ms: sandbox_engine::util::millis(taken.took),
        ..CheckpointReply::default()
    };
    // With a store, the answer waits for the upload: a caller told the id can
    // branch it on any node at once, and a failed upload is this call's error
    // (the checkpoint stays on this node, as the error says).
    if let Some(store) = &state.store {
        let uploaded = store.upload(&taken.manifest).await?;
        reply.checkpoint.stored = true;
        reply.upload_ms = uploaded.took_ms;
        reply.data_bytes = uploaded.data_bytes;
        reply.uploaded_bytes = uploaded.sent_bytes;
    }
    Ok(Json(reply))
}

pub async fn hibernate(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<TokenBody>,
) -> Result<Json<HibernateReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id).await?;
    let done = state.node.hibernate(&id).await?;
    let mut reply = HibernateReply {
        id: done.sandbox.id.to_string(),
        hibernated_now: done.now,
        bytes_on_disk: done.image.bytes_on_disk,
        deadline: deadline(&done.sandbox),
        parked: false,
    };
    // A draining node empties itself: the sandbox goes to the fleet, to wake on
    // another node. A failed park leaves it hibernated here (logged).
    if state.node.is_draining() && crate::parking::enabled(&state) {
        match crate::parking::park(&state, &id).await {
            Ok(_) => reply.parked = true,
            Err(error) => {
                tracing::warn!(sandbox = %id, error = %sandbox_vmm::error_chain(&error), "hibernated on a draining node, but not parked: it stays here")
            }
        }
    }
    Ok(Json(reply))
}

pub async fn promote(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<PromoteBody>,
) -> Result<Json<PromoteReply>, ApiError> {
    authorized(&state, &headers, Some(&body.token), &id).await?;
    let done = state.node.promote(&id, &body.template).await?;
    let mut reply = PromoteReply {
        key: TemplateKey {
            template: done.name,
        },
        replaced: done.replaced,
        pause_ms: sandbox_engine::util::millis(done.pause),
        took_ms: sandbox_engine::util::millis(done.took),
        content_digest: done.content_digest,
        stored: false,
    };
    // With a store, the answer waits for the upload, as a checkpoint's does: the
    // template can then be claimed on any node at once.
    if let Some(store) = &state.store {
        let dir = super::templates::local_template_dir(&state, &reply.key.template)?;
        store.publish_template(&reply.key.template, &dir).await?;
        reply.stored = true;
    }
    Ok(Json(reply))
}
