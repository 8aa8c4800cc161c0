//! One pool of memory for every process's output ring.
//!
//! Each ring holds up to [`RING_BYTES`] of its process's newest output, but a
//! workload may start thousands of chatty processes, and thousands of full rings are
//! more than a small guest has. So a ring takes the memory it grows into from this
//! pool: a ring that finds the pool empty stops growing and wraps within what it has
//! (its oldest bytes are then dropped sooner, and readers see them counted as
//! dropped, as for any ring that wrapped). The first [`RING_FLOOR_BYTES`] of every
//! ring are granted even from an empty pool, so a new process always keeps some
//! output; the workload's `pids.max` bounds how many floors there are.
//!
//! An empty pool asks for memory back ([`RingPool::shortage`]): the sweeper then
//! discards the output of processes that exited longest ago, which a running
//! process's output outranks.
//!
//! [`RING_BYTES`]: sandbox_protocol::limits::RING_BYTES

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Memory for all rings together, beyond their floors.
pub const RINGS_BUDGET_BYTES: usize = 32 * 1024 * 1024;

/// Every ring may hold this much whatever the pool has left.
pub const RING_FLOOR_BYTES: usize = 4 * 1024;

/// The pool; clones share it.
#[derive(Debug, Clone)]
pub struct RingPool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Bytes free; below zero when floors were granted from an empty pool.
    available: AtomicIsize,
    total: usize,
    short: Notify,
}

impl Default for RingPool {
    fn default() -> Self {
        Self::new(RINGS_BUDGET_BYTES)
    }
}

impl RingPool {
    /// A pool of `total` bytes.
    pub fn new(total: usize) -> Self {
        let total = total.min(isize::MAX as usize / 2);
        Self {
            shared: Arc::new(Shared {
                available: AtomicIsize::new(total as isize),
                total,
                short: Notify::new(),
            }),
        }
    }

    /// Grants `floor` bytes unconditionally and up to `more` bytes beyond them, as
    /// far as the pool has them; returns the bytes granted in all. A grant short of
    /// `floor + more` signals a [`Self::shortage`].
    pub fn grant(&self, floor: usize, more: usize) -> usize {
        let floor = floor.min(isize::MAX as usize / 4);
        let more = more.min(isize::MAX as usize / 4);
        let mut granted_more = 0;
        let _ =
            self.shared
                .available
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |available| {
                    let after_floor = available - floor as isize;
                    granted_more = usize::try_from(after_floor).unwrap_or(0).min(more);
                    Some(after_floor - granted_more as isize)
                });
        if granted_more < more {
            self.shared.short.notify_one();
        }
        floor + granted_more
    }

    /// Gives `bytes` of an earlier grant back.
    pub fn give_back(&self, bytes: usize) {
        let bytes = bytes.min(isize::MAX as usize / 4) as isize;
        self.shared.available.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Bytes free now (negative when floors overdrew the pool).
    pub fn available(&self) -> isize {
        self.shared.available.load(Ordering::Acquire)
    }

    /// The whole pool.
    pub fn total(&self) -> usize {
        self.shared.total
    }

    /// Resolves once a ring was refused memory (at once if one was since the last
    /// call).
    pub async fn shortage(&self) {
        self.shared.short.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn grants_what_is_left_and_always_the_floor() {
        let pool = RingPool::new(10_000);
        assert_eq!(pool.grant(1000, 5000), 6000);
        assert_eq!(pool.available(), 4000);
        assert_eq!(pool.grant(1000, 5000), 4000, "the floor and the 3000 left");
        assert_eq!(pool.available(), 0);
        assert_eq!(pool.grant(1000, 5000), 1000, "the floor even from nothing");
        assert_eq!(pool.available(), -1000);
        pool.give_back(11_000);
        assert_eq!(pool.available(), 10_000);
    }

    #[tokio::test]
    async fn a_refused_grant_signals_a_shortage() {
        let pool = RingPool::new(100);
        let waiting = tokio::time::timeout(Duration::from_millis(20), pool.shortage()).await;
        assert!(waiting.is_err(), "nothing was refused yet");
        pool.grant(0, 200);
        tokio::time::timeout(Duration::from_secs(5), pool.shortage())
            .await
            .expect("the short grant was signalled");
    }
}
