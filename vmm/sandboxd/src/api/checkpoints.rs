//! The checkpoint store: list, claim from, delete. Operator only: checkpoints are
//! the host's, whoever made them. With `--store` (see [`crate::store`]) the listing
//! includes the object store's, a claim downloads a checkpoint this node lacks, and
//! a delete is fleet-wide.

use std::time::{Duration, Instant, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_engine::error::{BranchError, CheckpointUser};
use sandbox_engine::node::sandbox_id_of;
use sandbox_engine::snapshot::ops::bytes_on_disk;
use sandbox_vmm::launcher::snapshot::{Manifest, SnapshotError};
use sandbox_vmm::node_api::wire::{
    CheckpointClaimBody, CheckpointDeleted, CheckpointList, CheckpointRow,
};

use super::sandboxes::{claim_reply, rfc3339};
use super::{ApiError, AppState, Body};
use crate::placement::{self, Wanted};

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
        ..CheckpointRow::default()
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
    let mut checkpoints: Vec<CheckpointRow> = entries
        .into_iter()
        .map(|entry| checkpoint_row(&entry.manifest, entry.users))
        .collect();
    let mut store_error = None;
    // The store's listing marks what is stored and adds what only it holds; a
    // store that does not answer leaves the local listing as it is, and says so.
    if let Some(store) = &state.store {
        match store.list().await {
            Ok(ids) => {
                for row in &mut checkpoints {
                    row.stored = ids.contains(&row.id);
                }
                for id in ids {
                    if !checkpoints.iter().any(|row| row.id == id) {
                        checkpoints.push(CheckpointRow {
                            id,
                            stored: true,
                            remote: true,
                            ..CheckpointRow::default()
                        });
                    }
                }
            }
            Err(error) => store_error = Some(sandbox_vmm::error_chain(&error)),
        }
    }
    Ok(Json(CheckpointList {
        checkpoints,
        store_error,
    }))
}

/// With a store, a checkpoint this node lacks is downloaded (once, however many
/// claims ask at the same time).
async fn make_local(state: &AppState, id: &str) -> Result<(), ApiError> {
    let Some(store) = &state.store else {
        return Ok(());
    };
    match state.node.find_checkpoint(id) {
        Ok(_) => Ok(()),
        Err(BranchError::Find(SnapshotError::NoCheckpoint(_))) => {
            crate::store::fetch_detached(store, id.trim()).await?;
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

pub async fn claim(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(body): Body<CheckpointClaimBody>,
) -> Result<impl IntoResponse, ApiError> {
    state.require_operator(&headers)?;
    if body.ttl_seconds > 0 {
        sandbox_engine::node::claim_ttl_secs(body.ttl_seconds)
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
    }
    if !body.no_redirect {
        if let Some(redirect) = placement::elsewhere(&state, Wanted::Checkpoint(&id)).await {
            return Ok((StatusCode::OK, Json(redirect)).into_response());
        }
    }
    let started = Instant::now();
    make_local(&state, &id).await?;
    let branched = state.node.branch(&id, 1).await?;
    state.use_changed();
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
    Ok((StatusCode::CREATED, Json(claim_reply(&state, &child))).into_response())
}

pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<CheckpointDeleted>, ApiError> {
    state.require_operator(&headers)?;
    let Some(store) = &state.store else {
        let manifest = state.node.delete_checkpoint(&id).await?;
        return Ok(Json(CheckpointDeleted {
            id: manifest.id.clone(),
            freed_bytes: bytes_on_disk(&manifest),
        }));
    };
    // Fleet-wide: refused while this node's sandboxes use it; then out of the store
    // and etcd (no node lists it any more), then off this node.
    let local = state.node.list_checkpoints()?.into_iter().find(|entry| {
        entry.manifest.id == id.trim() || entry.manifest.name.as_deref() == Some(id.trim())
    });
    let stored_id = local
        .as_ref()
        .map_or_else(|| id.trim().to_owned(), |e| e.manifest.id.clone());
    if let Some(entry) = &local {
        if !entry.users.is_empty() {
            // The engine's refusal, with its users named.
            state.node.delete_checkpoint(&entry.manifest.id).await?;
        }
    }
    let in_store = store.delete(&stored_id).await?;
    let freed_bytes = match &local {
        Some(entry) => bytes_on_disk(&state.node.delete_checkpoint(&entry.manifest.id).await?),
        None if in_store => 0,
        // Neither here nor in the store: the engine's own "no checkpoint".
        None => bytes_on_disk(&state.node.delete_checkpoint(&id).await?),
    };
    Ok(Json(CheckpointDeleted {
        id: stored_id,
        freed_bytes,
    }))
}
