//! The node itself: info, drain, peers, health and metrics.

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::Json;
use sandbox_fleet::membership::{Fleet, LostSandbox, Peer};
use sandbox_vmm::node_api::wire::{
    CapacityRow, DrainBody, DrainReply, InfoReply, NotParked, PoolRow, TemplateRow,
};

use super::{ApiError, AppState, Body};

pub async fn info(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<InfoReply>, ApiError> {
    state.require_operator(&headers)?;
    let status = state.node.status();
    // Other live nodes' addresses; an unreachable etcd leaves the list empty here
    // (`GET /v1/peers` says why) rather than failing the node's own info.
    let peers = match &state.membership {
        Some(membership) => {
            match tokio::time::timeout(INFO_FLEET_WITHIN, membership.fleet()).await {
                Ok(Ok(fleet)) => other_addrs(&fleet),
                _ => Vec::new(),
            }
        }
        None => Vec::new(),
    };
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
        peers,
    }))
}

/// How long `GET /v1/info` waits for the fleet's listing.
const INFO_FLEET_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

fn other_addrs(fleet: &Fleet) -> Vec<String> {
    fleet
        .nodes
        .iter()
        .filter(|peer| peer.alive && !peer.this_node)
        .map(|peer| peer.record.addr.clone())
        .collect()
}

/// `POST /v1/drain`: claims are refused from now; in a fleet with an object store
/// the hibernated sandboxes (with `{"hibernate": true}` every sandbox, hibernated
/// first) are parked for other nodes to wake, and the answer comes once they are.
pub async fn drain(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body<DrainBody>,
) -> Result<Json<DrainReply>, ApiError> {
    let Json(mut reply) = set_drain(&state, &headers, true)?;
    let (parked, stayed) = crate::parking::evacuate(&state, body.hibernate).await;
    reply.parked = parked;
    reply.not_parked = stayed
        .into_iter()
        .map(|(id, error)| NotParked { id, error })
        .collect();
    reply.live_claims = state.node.registry().list().len();
    Ok(Json(reply))
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
    if let Some(membership) = &state.membership {
        membership.changed();
    }
    Ok(Json(DrainReply {
        draining,
        live_claims: state.node.registry().list().len(),
        ..DrainReply::default()
    }))
}

/// `GET /v1/peers`: a single node has no peers; a fleet member lists the other
/// live nodes' addresses (`peers`, seed 000's shape), every registered node's record
/// with `alive` and `this_node` (`nodes`), this node's id (`node_id`) and the lost
/// sandboxes, whose node vanished (`lost`). An unreachable etcd is a 503
/// `etcd_unreachable`.
pub async fn peers(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<FleetPeersReply>, ApiError> {
    state.require_operator(&headers)?;
    let Some(membership) = &state.membership else {
        return Ok(Json(FleetPeersReply::default()));
    };
    let fleet = membership.fleet().await?;
    Ok(Json(FleetPeersReply {
        peers: other_addrs(&fleet),
        node_id: Some(membership.node_id().to_owned()),
        registered: membership.registration().lease.is_some(),
        nodes: fleet.nodes,
        lost: fleet.lost,
        parked: fleet.parked,
    }))
}

/// `GET /v1/peers`: seed 000's `peers` plus the fleet.
#[derive(Debug, Default, serde::Serialize)]
pub struct FleetPeersReply {
    /// Other live nodes' addresses.
    pub peers: Vec<String>,
    /// This node's id in the fleet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Whether this node holds a lease now.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub registered: bool,
    /// Every registered node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<Peer>,
    /// Sandboxes whose node vanished.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostSandbox>,
    /// Hibernated sandboxes handed to the fleet, waiting for a node to wake them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parked: Vec<sandbox_fleet::membership::ParkedSandbox>,
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
