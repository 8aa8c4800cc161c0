//! Templates: `DELETE /v1/templates?template=NAME` (operator only) deletes a
//! promoted one, in seed 000's shape (its clients send `net` and `size` too, and
//! `no_redirect=1`), from the object store too with `--store`;
//! `POST /v1/templates/{name}/publish` puts a local one in the object store, for
//! any node of the fleet to claim.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use sandbox_vmm::node_api::wire::{TemplateDeleted, TemplatePublished, TemplateQuery};

use super::{ApiError, AppState};

pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<TemplateQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TemplateDeleted>, ApiError> {
    state.require_operator(&headers)?;
    let Query(query) = query.map_err(|rejection| {
        ApiError::bad_request(format!(
            "Bad query: {} (expected ?template=NAME)",
            rejection.body_text()
        ))
    })?;
    if query.template.trim().is_empty() {
        return Err(ApiError::bad_request(
            "Name the template: DELETE /v1/templates?template=NAME",
        ));
    }
    let name = query.template.trim();
    // Only in the store (published from another node): deleted there.
    if let Some(store) = &state.store {
        if !state.node.template_names().iter().any(|t| t == name)
            && store.delete_template(name).await?
        {
            return Ok(Json(TemplateDeleted {
                template: name.to_owned(),
                freed_bytes: 0,
                redirect: Vec::new(),
            }));
        }
    }
    let done = state.node.delete_template(name)?;
    if let Some(store) = &state.store {
        store.delete_template(&done.name).await?;
    }
    Ok(Json(TemplateDeleted {
        template: done.name,
        freed_bytes: done.freed_bytes,
        redirect: Vec::new(),
    }))
}

/// `POST /v1/templates/{name}/publish`: the local template `name` (built or
/// promoted) goes to the object store; answered once it is there.
pub async fn publish(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<TemplatePublished>, ApiError> {
    state.require_operator(&headers)?;
    let Some(store) = &state.store else {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "no_store",
            "This node has no object store (--store): there is nowhere to publish to",
        ));
    };
    if !sandbox_fleet::store::manifest::safe_name(&name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is not a template name that can be published"
        )));
    }
    let dir = local_template_dir(&state, &name)?;
    let report = store.publish_template(&name, &dir).await?;
    tracing::info!(template = %name, data_bytes = report.data_bytes, sent_bytes = report.sent_bytes, took_ms = report.took_ms, "template published to the store");
    Ok(Json(TemplatePublished {
        template: name,
        data_bytes: report.data_bytes,
        uploaded_bytes: report.sent_bytes,
        upload_ms: report.took_ms,
    }))
}

/// The folder of this node's template `name`: 404 when it has none by that name.
pub fn local_template_dir(state: &AppState, name: &str) -> Result<std::path::PathBuf, ApiError> {
    let host = state.node.snapshots().ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "conflict",
            "This node is attached to one agent outside any VM: it has no templates",
        )
    })?;
    let reference = sandbox_vmm::launcher::template::TemplateRef::Name(name.trim().to_owned());
    host.launcher()
        .template(&reference)
        .map(|template| template.dir)
        .map_err(|error| {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "No template {name:?} on this node: {}",
                    sandbox_vmm::error_chain(&error)
                ),
            )
        })
}

/// `POST /v1/store/gc`: deletes the object store's blobs that no manifest
/// (checkpoint, parked image, template) names, sparing those younger than the
/// grace (a day by default, never under an hour: uploads under way write their
/// blobs before their manifest).
pub async fn store_gc(
    State(state): State<AppState>,
    headers: HeaderMap,
    super::Body(body): super::Body<sandbox_vmm::node_api::wire::StoreGcBody>,
) -> Result<Json<sandbox_fleet::store::gc::GcReport>, ApiError> {
    state.require_operator(&headers)?;
    let Some(store) = &state.store else {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "no_store",
            "This node has no object store (--store): there is nothing to collect",
        ));
    };
    let grace = match body.grace_seconds {
        0 => std::time::Duration::from_secs(24 * 60 * 60),
        secs => std::time::Duration::from_secs(secs),
    };
    let floor = sandbox_fleet::store::gc::MIN_GRACE;
    if grace < floor {
        return Err(ApiError::bad_request(format!(
            "grace_seconds must be at least {} (uploads under way write their blobs before their manifest)",
            floor.as_secs()
        )));
    }
    Ok(Json(store.collect_garbage(grace, body.dry_run).await?))
}
