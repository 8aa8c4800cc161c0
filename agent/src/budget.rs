//! One agent-wide budget for the bytes the agent holds on behalf of its clients:
//! replies and events waiting for a socket, exec output collected for a reply, file
//! chunks on their way out, and large frames on their way in.
//!
//! Each connection is bounded on its own (requests in flight, queued frames, stream
//! windows), but a client may open many connections, and what one connection may
//! hold times [`MAX_CONNECTIONS`](sandbox_protocol::limits::MAX_CONNECTIONS) is far
//! more than a small guest has. So whoever is about to hold a large buffer for a
//! client first takes a [`Charge`] for its size from the [`Budget`], and the charge
//! travels with the bytes (into a reply, onto the writer's queue) until they are
//! written or dropped. When the budget is spent, producers wait: an exec's output
//! pump stops reading (its child blocks on a full pipe, its deadline still runs), a
//! `get` stops reading its file, a reader stops taking a large frame. Nothing fails
//! and nothing is lost; the bytes move on as sockets drain, and a peer that stops
//! reading is closed after the writer's stall limit, which returns its charges.
//!
//! Buffers under [`UNCHARGED_BYTES`] are not charged: they are bounded by the
//! per-connection limits times the connection limit.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes the agent may hold for clients at once, across all connections.
pub const BUDGET_BYTES: usize = 32 * 1024 * 1024;

/// Buffers smaller than this are not charged.
pub const UNCHARGED_BYTES: usize = 16 * 1024;

/// The agent's budget; clones share it.
#[derive(Debug, Clone)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(BUDGET_BYTES)
    }
}

impl Budget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        // Semaphore permits are counted in u32 per acquisition; keep the total there.
        let total = total.min(u32::MAX as usize);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Waits until `bytes` are free and takes them. A request for more than the whole
    /// budget takes all of it (it waits until nothing else is held), so it cannot wait
    /// forever. Cancel safe: a dropped wait takes nothing.
    pub async fn reserve(&self, bytes: usize) -> Charge {
        let bytes = bytes.min(self.total);
        if bytes == 0 {
            return Charge::none();
        }
        // `bytes` fits in u32: it is at most `total`.
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        match self.bytes.clone().acquire_many_owned(permits).await {
            Ok(permit) => Charge(Some(permit)),
            // The semaphore is never closed; if it were, holding nothing is the only
            // answer that cannot wedge the agent.
            Err(_closed) => Charge::none(),
        }
    }

    /// Like [`Self::reserve`] for a buffer of `bytes`, but buffers under
    /// [`UNCHARGED_BYTES`] are free.
    pub async fn reserve_large(&self, bytes: usize) -> Charge {
        if bytes < UNCHARGED_BYTES {
            Charge::none()
        } else {
            self.reserve(bytes).await
        }
    }

    /// Bytes free now (for tests and `info`).
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// Bytes taken from the [`Budget`]; given back when dropped.
#[derive(Debug, Default)]
pub struct Charge(Option<OwnedSemaphorePermit>);

impl Charge {
    /// A charge of nothing.
    pub fn none() -> Self {
        Self(None)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Adds `other`'s bytes to this charge (both must come from one budget).
    pub fn merge(&mut self, other: Charge) {
        match (&mut self.0, other.0) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_spent_budget_makes_the_next_charge_wait_until_one_is_dropped() {
        let budget = Budget::new(1000);
        let first = budget.reserve(600).await;
        assert_eq!(first.bytes(), 600);
        assert_eq!(budget.available(), 400);
        let waiting = tokio::time::timeout(Duration::from_millis(20), budget.reserve(600)).await;
        assert!(waiting.is_err(), "only 400 bytes are free");
        // The cancelled wait took nothing.
        assert_eq!(budget.available(), 400);
        drop(first);
        assert_eq!(budget.reserve(600).await.bytes(), 600);
        assert_eq!(budget.available(), 1000);
    }

    #[tokio::test]
    async fn more_than_the_whole_budget_takes_all_of_it_rather_than_waiting_forever() {
        let budget = Budget::new(1000);
        let everything = budget.reserve(5000).await;
        assert_eq!(everything.bytes(), 1000);
        assert_eq!(budget.available(), 0);
    }

    #[tokio::test]
    async fn charges_merge_and_small_buffers_are_free() {
        let budget = Budget::new(1 << 20);
        let mut charge = Charge::none();
        charge.merge(budget.reserve(100).await);
        charge.merge(budget.reserve(200).await);
        charge.merge(Charge::none());
        assert_eq!(charge.bytes(), 300);
        assert_eq!(budget.reserve_large(UNCHARGED_BYTES - 1).await.bytes(), 0);
        assert_eq!(
            budget.reserve_large(UNCHARGED_BYTES).await.bytes(),
            UNCHARGED_BYTES
        );
        drop(charge);
        assert_eq!(budget.available(), 1 << 20);
    }
}
