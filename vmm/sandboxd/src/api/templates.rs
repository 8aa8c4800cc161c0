//! Promoted templates: `DELETE /v1/templates?template=NAME` (operator only), in seed
//! 000's shape (its clients send `net` and `size` too, and `no_redirect=1`).

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use sandbox_vmm::node_api::wire::{TemplateDeleted, TemplateQuery};

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
    let done = state.node.delete_template(&query.template)?;
    Ok(Json(TemplateDeleted {
        template: done.name,
        freed_bytes: done.freed_bytes,
        redirect: Vec::new(),
    }))
}
