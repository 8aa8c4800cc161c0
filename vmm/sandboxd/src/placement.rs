//! Where a claim sent to this node lands, in a fleet: here, or on the peers the
//! fleet's catalogue names (`sandbox_fleet::placement`), which the client is told
//! to claim on instead (a [`ClaimRedirect`], seed 000's shape).
//!
//! The node answers with the addresses rather than forwarding the claim itself:
//! the sandbox's token then goes from the node that made it straight to the
//! client, and a node that cannot reach a peer does not turn into a relay for it.
//! Placement never blocks a claim: without a fleet, with etcd slow or down, or
//! when no node can take it by the catalogue, the claim is served here, and this
//! node's own answer (made, full, draining, no such template) stands.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_fleet::membership::Peer;
use sandbox_fleet::placement::{candidates, Need, SplitMix};
use sandbox_vmm::node_api::wire::ClaimRedirect;

use crate::api::AppState;

/// How long placement waits for the catalogue before claiming here.
const CATALOGUE_WITHIN: Duration = Duration::from_secs(1);

/// The most nodes a redirect names: the pick and two to fall back on.
const MAX_REDIRECT: usize = 3;

/// What a claim needs, as placement asks it.
#[derive(Debug, Clone, Copy)]
pub enum Wanted<'a> {
    /// A template by name (`None`: the node's default).
    Template(Option<&'a str>),
    /// A checkpoint by id.
    Checkpoint(&'a str),
}

/// The fleet's nodes, read within [`CATALOGUE_WITHIN`]; `None` without a fleet or
/// when etcd fails (logged).
async fn catalogue(state: &AppState) -> Option<Vec<Peer>> {
    let membership = state.membership.as_ref()?;
    match tokio::time::timeout(CATALOGUE_WITHIN, membership.nodes()).await {
        Ok(Ok(nodes)) => Some(with_own_state(nodes, state)),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "cannot read the fleet's catalogue: placing here");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the fleet's catalogue did not answer within {CATALOGUE_WITHIN:?}: placing here"
            );
            None
        }
    }
}

/// `nodes` with this node's entry as the node knows itself now. Its record in etcd
/// lags its claims and releases by a publish (an etcd put, seconds when etcd's disk
/// is slow): placement read from it alone would keep a node that has just filled
/// picking itself, and its claims would fail `at_capacity` while peers had room.
fn with_own_state(mut nodes: Vec<Peer>, state: &AppState) -> Vec<Peer> {
    let load = crate::fleet::load_of(&state.node);
    for peer in nodes.iter_mut().filter(|peer| peer.this_node) {
        peer.record.capacity = load.capacity;
        peer.record.used = load.used;
        peer.record.draining = load.draining;
    }
    nodes
}

/// Another node that can wake the parked sandbox of `parked` (for a node that
/// cannot: draining, full, another QEMU): the freer of two sampled nodes with an
/// object store, room, and the QEMU version and machine type that made the image.
pub async fn waker(
    state: &AppState,
    parked: &sandbox_fleet::membership::ParkedRecord,
) -> Option<String> {
    let nodes = catalogue(state).await?;
    let mut random = SplitMix::new(seed());
    let none_held = |_: &sandbox_fleet::membership::NodeRecord| false;
    let ranked = candidates(&nodes, Need::Checkpoint { held: &none_held }, || {
        random.next_u64()
    });
    ranked
        .iter()
        .filter(|peer| {
            let qemu =
                sandbox_vmm::launcher::snapshot::restore::parse_qemu_version(&peer.record.qemu);
            peer.record.machine == parked.machine
                && !parked.qemu_version.is_empty()
                && qemu.as_deref() == Some(parked.qemu_version.as_str())
        })
        .find(|peer| {
            !peer.this_node && reachable_from_elsewhere(&peer.record.addr, &state.advertise)
        })
        .map(|peer| peer.record.addr.clone())
}

/// Where the claim should be made: `None` for here, else the redirect to answer.
pub async fn elsewhere(state: &AppState, wanted: Wanted<'_>) -> Option<ClaimRedirect> {
    let nodes = catalogue(state).await?;
    let default_template = state.node.default_template().map(ToString::to_string);
    let mut random = SplitMix::new(seed());
    let ranked = match wanted {
        Wanted::Template(name) => {
            let name = name
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .or(default_template)?;
            candidates(&nodes, Need::Template(&name), || random.next_u64())
        }
        Wanted::Checkpoint(id) => {
            let id = id.trim();
            let held = |record: &sandbox_fleet::membership::NodeRecord| {
                record.checkpoints.iter().any(|held| held == id)
            };
            candidates(&nodes, Need::Checkpoint { held: &held }, || {
                random.next_u64()
            })
        }
    };
    let usable = |peer: &sandbox_fleet::membership::Peer| {
        peer.this_node || reachable_from_elsewhere(&peer.record.addr, &state.advertise)
    };
    let pick = ranked.iter().find(|peer| usable(peer))?;
    if pick.this_node {
        return None;
    }
    let redirect: Vec<String> = ranked
        .iter()
        .filter(|peer| !peer.this_node && usable(peer))
        .take(MAX_REDIRECT)
        .map(|peer| peer.record.addr.clone())
        .collect();
    if redirect.is_empty() {
        return None;
    }
    tracing::info!(to = ?redirect, ?wanted, "claim placed on a peer");
    Some(ClaimRedirect { redirect })
}

/// Whether a client of this node can reach a peer at `addr`: not empty, not an
/// unspecified address (`0.0.0.0`, `[::]`: a node listening on every interface
/// without `--advertise`), and loopback only when this node's own address is
/// loopback too (a fleet on one machine); anything else would send the client,
/// with its token, to its own machine.
fn reachable_from_elsewhere(addr: &str, own: &str) -> bool {
    let host = |addr: &str| -> Option<String> {
        let rest = addr.split_once("://").map_or(addr, |(_, rest)| rest);
        let authority = rest.split('/').next()?;
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
            _ => authority,
        };
        Some(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        )
    };
    let Some(peer) = host(addr).filter(|host| !host.is_empty()) else {
        return false;
    };
    let ip = |host: &str| host.parse::<std::net::IpAddr>().ok();
    let loopback = |host: &str| host == "localhost" || ip(host).is_some_and(|ip| ip.is_loopback());
    if ip(&peer).is_some_and(|ip| ip.is_unspecified()) {
        return false;
    }
    !loopback(&peer) || host(own).is_some_and(|own| loopback(&own))
}

/// A seed for one placement's samples: two claims at once draw different pairs.
fn seed() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let clock = since_epoch.as_secs() ^ u64::from(since_epoch.subsec_nanos()).rotate_left(32);
    clock ^ CALLS.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::reachable_from_elsewhere as reachable;

    #[test]
    fn addresses_a_client_elsewhere_could_not_use_are_never_handed_out() {
        let own = "https://node-1.internal:7777";
        assert!(reachable("https://node-2.internal:7777", own));
        assert!(reachable("10.0.0.6:7777", own));
        assert!(reachable("[fd00::6]:7777", own));
        for bad in [
            "",
            "0.0.0.0:7777",
            "[::]:7777",
            "127.0.0.1:7777",
            "localhost:7777",
            "http://[::1]:7777",
        ] {
            assert!(!reachable(bad, own), "{bad}");
        }
        // A fleet on one machine: loopback peers are fine.
        assert!(reachable("127.0.0.1:7778", "127.0.0.1:7777"));
        assert!(!reachable("0.0.0.0:7778", "127.0.0.1:7777"));
    }
}
