//! The checkpoint store: list, claim from, delete. Operator only: checkpoints are
//! the host's, whoever made them.

use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_engine::error::CheckpointUser;
use sandbox_engine::node::sandbox_id_of;
use sandbox_engine::snapshot::ops::bytes_on_disk;
use sandbox_vmm::launcher::snapshot::Manifest;
use sandbox_vmm::node_api::wire::{
    CheckpointClaimBody, CheckpointDeleted, CheckpointList, CheckpointRow,
};

use super::sandboxes::{claim_reply, rfc3339};
use super::{ApiError, AppState, Body};

/// The row of `manifest`, used by `users`.
pub fn checkpoint_row(manifest: &Manifest, users: Vec<CheckpointUser>) -> CheckpointRow {
    CheckpointRow {
        id: manifest.id.clone(),
        name: manifest.name.clone().unwrap_or_default(),
        sandbox_id: sandbox_id_of(&manifest.source_vm).to_string(),
        template: manifest.machine.template.clone(),
        created_at: rfc3339(UNIX_EPOCH + Duration::from_millis(manifest.created_at_unix_ms)),
        bytes_on_disk: bytes_on_disk(manifest),
        in_use_by: users.iter().map(ToString::to_string).collect(),
    }
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<CheckpointList>, ApiError> {
    state.require_operator(&headers)?;
    let mut entries = state.node.list_checkpoints()?;
    // Newest first, as seed 000's client documents.
    entries.sort_by_key(|entry| std::cmp::Reverse(entry.manifest.created_at_unix_ms));
    Ok(Json(CheckpointList {
        checkpoints: entries
            .into_iter()
            .map(|entry| checkpoint_row(&entry.manifest, entry.users))
            .collect(),
    }))
}

pub async fn claim(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<CheckpointClaimBody>,
) -> Result<impl IntoResponse, ApiError> {
    state.require_operator(&headers)?;
    let _ = body.no_redirect;
    if body.ttl_seconds > 0 {
        sandbox_engine::node::claim_ttl_secs(body.ttl_seconds)
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
    }
    let started = Instant::now();
    let branched = state.node.branch(&id, 1).await?;
    state.metrics.restored(started.elapsed());
    let child = branched
        .children
        .first()
        .ok_or_else(|| ApiError::bad_request("the branch made no sandbox"))?;
    let child = if body.ttl_seconds > 0 {
        state.node.renew(child.id.as_str(), body.ttl_seconds)?
    } else {
        child.clone()
    };
    Ok((StatusCode::CREATED, Json(claim_reply(&state, &child))))
}

pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<CheckpointDeleted>, ApiError> {
    state.require_operator(&headers)?;
    let manifest = state.node.delete_checkpoint(&id)?;
    Ok(Json(CheckpointDeleted {
        id: manifest.id.clone(),
        freed_bytes: bytes_on_disk(&manifest),
    }))
}
