//! The node itself: info, drain, peers, health and metrics.

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_vmm::node_api::wire::{
    CapacityRow, DrainReply, InfoReply, PeersReply, PoolRow, TemplateRow,
};

use super::{ApiError, AppState};

pub async fn info(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<InfoReply>, ApiError> {
    state.require_operator(&headers)?;
    let status = state.node.status();
    Ok(Json(InfoReply {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        addr: state.advertise.clone(),
        default_template: status.default_template,
        draining: status.draining,
        pool: status.pool.map(|pool| PoolRow {
            template: pool.template,
            size: pool.size.to_string(),
            target: pool.target,
            warm: pool.warm,
            booting: pool.booting,
            last_error: pool.last_error,
        }),
        templates: status
            .templates
            .into_iter()
            .map(|entry| TemplateRow {
                name: entry.name,
                default: entry.default,
                size: entry.size.map(|size| size.to_string()),
                promoted: entry.promoted,
                error: entry.error,
            })
            .collect(),
        live_claims: status.capacity.live_claims,
        capacity: CapacityRow {
            max_sandboxes: status.capacity.max_sandboxes,
            vms: status.capacity.vms,
            live_claims: status.capacity.live_claims,
            claimable: status.capacity.claimable,
        },
        peers: Vec::new(),
    }))
}

pub async fn drain(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<DrainReply>, ApiError> {
    set_drain(&state, &headers, true)
}

pub async fn uncordon(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<DrainReply>, ApiError> {
    set_drain(&state, &headers, false)
}

fn set_drain(
    state: &AppState,
    headers: &HeaderMap,
    draining: bool,
) -> Result<Json<DrainReply>, ApiError> {
    state.require_operator(headers)?;
    state.node.set_draining(draining);
    Ok(Json(DrainReply {
        draining,
        live_claims: state.node.registry().list().len(),
    }))
}

/// A single node has no peers.
pub async fn peers(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<PeersReply>, ApiError> {
    state.require_operator(&headers)?;
    Ok(Json(PeersReply { peers: Vec::new() }))
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Most records read from one sandbox's egress log per scrape.
const EGRESS_RECORDS_PER_SANDBOX: usize = 100_000;

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let status = state.node.status();
    // The logs are files: read them off the async threads.
    let node = state.node.clone();
    let egress = tokio::task::spawn_blocking(move || {
        let mut totals = crate::metrics::EgressTotals::default();
        for sandbox in node.registry().list() {
            if let Some(Ok(records)) = node.egress_log(&sandbox, EGRESS_RECORDS_PER_SANDBOX) {
                totals.add(&records);
            }
        }
        totals
    })
    .await
    .unwrap_or_default();
    let boots = state.node.pool().map(|pool| pool.factory().boot_times());
    let text = state.metrics.render(&status, &egress, boots.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
