//! Where a claim goes: the freer of two nodes sampled from those that can take it.
//!
//! Sampling two and keeping the freer ("the power of two choices") spreads claims
//! nearly as evenly as always picking the emptiest node, without every front end
//! that reads a slightly stale catalogue piling onto the same one. A node can take
//! a claim when it is alive (refreshed its record lately), not draining, has a free
//! slot, and holds the template (or can fetch the checkpoint); among those, the ones
//! that already hold what the claim needs locally are preferred, so a checkpoint or
//! template is downloaded only when no node with it has room.

use crate::membership::{NodeRecord, Peer};

/// What a claim needs from the node it lands on.
#[derive(Clone, Copy)]
pub enum Need<'a> {
    /// A sandbox of this template: only nodes that list it can take the claim.
    Template(&'a str),
    /// A sandbox from this checkpoint; `held` says which nodes hold it already.
    /// Those are preferred; a node on an object store (`store` in its record) can
    /// take it too, downloading it; any other node cannot.
    Checkpoint {
        /// Whether a node holds the checkpoint locally.
        held: &'a dyn Fn(&NodeRecord) -> bool,
    },
}

impl std::fmt::Debug for Need<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Template(name) => f.debug_tuple("Template").field(name).finish(),
            Self::Checkpoint { .. } => f.debug_struct("Checkpoint").finish_non_exhaustive(),
        }
    }
}

/// Free slots on `record`'s node.
fn free(record: &NodeRecord) -> usize {
    record.capacity.saturating_sub(record.used)
}

/// Whether `peer` can take a claim at all.
fn can_take(peer: &Peer) -> bool {
    peer.alive && !peer.record.draining && free(&peer.record) > 0
}

/// Picks the node for a claim needing `need` among `nodes`, sampling with `random`
/// (any source of `u64`s; a node's pick needs no cryptographic randomness). `None`
/// when no node can take it.
pub fn place<'p>(
    nodes: &'p [Peer],
    need: Need<'_>,
    random: impl FnMut() -> u64,
) -> Option<&'p Peer> {
    candidates(nodes, need, random).into_iter().next()
}

/// Every node that can take a claim needing `need`, best first: [`place`]'s pick,
/// then the others of its pool (the holders, when some hold what the claim needs)
/// freest first, then the remaining able nodes freest first. A client told to go
/// elsewhere tries them in order, so a catalogue that is a moment stale (a node
/// filled or drained since) costs one refusal, not the claim.
pub fn candidates<'p>(
    nodes: &'p [Peer],
    need: Need<'_>,
    mut random: impl FnMut() -> u64,
) -> Vec<&'p Peer> {
    let able: Vec<&Peer> = nodes
        .iter()
        .filter(|peer| can_take(peer))
        .filter(|peer| match need {
            Need::Template(name) => peer.record.templates.iter().any(|t| t == name),
            Need::Checkpoint { held } => peer.record.store || held(&peer.record),
        })
        .collect();
    let holds = |peer: &Peer| match need {
        Need::Template(_) => true,
        Need::Checkpoint { held } => held(&peer.record),
    };
    let (mut pool, mut rest): (Vec<&Peer>, Vec<&Peer>) =
        able.into_iter().partition(|peer| holds(peer));
    if pool.is_empty() {
        std::mem::swap(&mut pool, &mut rest);
    }
    let pick = match pool.len() {
        0 => return Vec::new(),
        1 => 0,
        len => {
            let first = index(random(), len);
            // The second is another node: an offset of 1..len from the first.
            let second = (first + 1 + index(random(), len - 1)) % len;
            if free(&pool[second].record) > free(&pool[first].record) {
                second
            } else {
                first
            }
        }
    };
    let mut ranked = vec![pool.remove(pick)];
    for mut group in [pool, rest] {
        group.sort_by_key(|peer| std::cmp::Reverse(free(&peer.record)));
        ranked.extend(group);
    }
    ranked
}

/// `value` mapped onto `0..len` (`len` > 0).
fn index(value: u64, len: usize) -> usize {
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    usize::try_from(value % len).unwrap_or(0)
}

/// A small, fast, non-cryptographic generator (SplitMix64) for [`place`]'s samples,
/// seeded per call site.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use super::*;

    fn peer(id: &str, capacity: usize, used: usize) -> Peer {
        Peer {
            record: NodeRecord {
                id: id.to_owned(),
                capacity,
                used,
                templates: vec!["default".to_owned()],
                ..NodeRecord::default()
            },
            alive: true,
            this_node: false,
        }
    }

    fn stored(mut peer: Peer) -> Peer {
        peer.record.store = true;
        peer
    }

    fn counts(nodes: &[Peer], need: Need<'_>, rounds: usize) -> BTreeMap<String, usize> {
        let mut rng = SplitMix::new(7);
        let mut counts = BTreeMap::new();
        for _ in 0..rounds {
            let picked = place(nodes, need, || rng.next_u64()).unwrap();
            *counts.entry(picked.record.id.clone()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn draining_full_dead_and_templateless_nodes_never_get_a_claim() {
        let mut draining = peer("draining", 8, 0);
        draining.record.draining = true;
        let mut dead = peer("dead", 8, 0);
        dead.alive = false;
        let mut other = peer("other-template", 8, 0);
        other.record.templates = vec!["python".to_owned()];
        let nodes = [draining, dead, other, peer("full", 2, 2), peer("ok", 8, 7)];
        let counts = counts(&nodes, Need::Template("default"), 200);
        assert_eq!(counts, BTreeMap::from([("ok".to_owned(), 200)]));
        assert!(place(&nodes[..4], Need::Template("default"), || 0).is_none());
    }

    #[test]
    fn the_freer_of_two_wins_so_an_empty_node_gets_most_claims() {
        let nodes = [peer("empty", 8, 0), peer("busy", 8, 6), peer("half", 8, 4)];
        let counts = counts(&nodes, Need::Template("default"), 3000);
        // "empty" wins every pair it is in (2/3 of pairs), "half" wins its pair with "busy".
        assert!(counts["empty"] > 1800, "{counts:?}");
        assert!(counts["half"] > 800, "{counts:?}");
        assert!(!counts.contains_key("busy"), "{counts:?}");
    }

    #[test]
    fn equal_nodes_share_claims_evenly() {
        let nodes = [peer("a", 8, 0), peer("b", 8, 0), peer("c", 8, 0)];
        let counts = counts(&nodes, Need::Template("default"), 3000);
        for id in ["a", "b", "c"] {
            assert!((700..1300).contains(&counts[id]), "{counts:?}");
        }
    }

    #[test]
    fn a_node_that_holds_the_checkpoint_is_preferred_while_it_has_room() {
        let held = |record: &NodeRecord| record.id == "holder";
        let need = Need::Checkpoint { held: &held };
        let nodes = [stored(peer("holder", 8, 7)), stored(peer("empty", 8, 0))];
        assert_eq!(counts(&nodes, need, 100)["holder"], 100);
        // Full, it is skipped: another node on the store downloads the checkpoint.
        let nodes = [stored(peer("holder", 8, 8)), stored(peer("empty", 8, 0))];
        assert_eq!(counts(&nodes, need, 100)["empty"], 100);
        // A checkpoint needs no template on the node.
        let mut bare = stored(peer("bare", 8, 0));
        bare.record.templates.clear();
        assert!(place(&[bare], need, || 3).is_some());
    }

    #[test]
    fn without_a_store_only_a_holder_can_take_a_checkpoint() {
        let held = |record: &NodeRecord| record.id == "holder";
        let need = Need::Checkpoint { held: &held };
        let nodes = [peer("holder", 8, 7), peer("empty", 8, 0)];
        assert_eq!(counts(&nodes, need, 100)["holder"], 100);
        let nodes = [peer("holder", 8, 8), peer("empty", 8, 0)];
        assert!(place(&nodes, need, || 1).is_none());
        // A node on the store can; one without cannot, even when emptier.
        let nodes = [
            peer("holder", 8, 8),
            stored(peer("stored", 8, 4)),
            peer("empty", 8, 0),
        ];
        assert_eq!(counts(&nodes, need, 100)["stored"], 100);
    }

    #[test]
    fn candidates_start_with_the_pick_then_go_freest_first() {
        let nodes = [
            peer("a", 8, 6),
            peer("b", 8, 1),
            peer("c", 8, 3),
            peer("full", 8, 8),
        ];
        let mut rng = SplitMix::new(3);
        for _ in 0..50 {
            let ranked = candidates(&nodes, Need::Template("default"), || rng.next_u64());
            let ids: Vec<&str> = ranked.iter().map(|p| p.record.id.as_str()).collect();
            assert_eq!(ids.len(), 3, "{ids:?}");
            let mut rest = ids[1..].to_vec();
            let frees: Vec<usize> = rest
                .iter()
                .map(|id| nodes.iter().find(|p| p.record.id == *id).unwrap())
                .map(|p| free(&p.record))
                .collect();
            assert!(frees.windows(2).all(|w| w[0] >= w[1]), "{ids:?}");
            rest.push(ids[0]);
            rest.sort_unstable();
            assert_eq!(rest, ["a", "b", "c"]);
        }
        // Holders first; a node that must download comes after them.
        let held = |record: &NodeRecord| record.id == "a";
        let need = Need::Checkpoint { held: &held };
        let nodes = nodes.map(stored);
        let ranked = candidates(&nodes, need, || 0);
        let ids: Vec<&str> = ranked.iter().map(|p| p.record.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
