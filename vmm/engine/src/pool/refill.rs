//! The refiller: one task that keeps the warm pool at its target while capacity
//! allows.
//!
//! Each round it waits until the pool is below target (`wanted`), then for a free
//! slot (the semaphore: claims that find none evict warm VMs, so the pool only grows
//! into capacity claims leave), then boots one VM. Boots run one at a time because
//! they are CPU-bound: on a small host, parallel boots only slow each other. After a
//! failed boot it records the error for `node_info` and backs off, doubling from
//! [`REFILL_FIRST_BACKOFF_SECS`] to [`REFILL_MAX_BACKOFF_SECS`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::warm::Shared;
use super::{Lease, Machine, VmFactory, REFILL_FIRST_BACKOFF_SECS, REFILL_MAX_BACKOFF_SECS};
use crate::util::{lock, millis};

/// Runs until the pool closes (or the task is aborted).
pub(super) async fn run<F: VmFactory>(shared: Arc<Shared<F>>) {
    let mut backoff = Duration::from_secs(REFILL_FIRST_BACKOFF_SECS);
    loop {
        if !below_target(&shared).await {
            return;
        }
        // Closed at shutdown, which ends the task.
        let Ok(slot) = shared.capacity.clone().acquire_owned().await else {
            return;
        };
        {
            let mut state = lock(&shared.state);
            if state.closed {
                return;
            }
            // Only this task adds to the pool, so it is still below target.
            state.booting += 1;
        }
        let started = Instant::now();
        let result = shared.factory.boot(&shared.spec, shared.boot_timeout).await;
        // Decide under the lock, act (destroy, log, sleep) after it.
        let (failed, leftover) = {
            let mut state = lock(&shared.state);
            state.booting = state.booting.saturating_sub(1);
            match result {
                Ok(vm) if state.closed => (false, Some(Lease::new(vm, slot))),
                Ok(vm) => {
                    tracing::info!(
                        vm = vm.id(),
                        boot_ms = millis(started.elapsed()),
                        warm = state.warm.len() + 1,
                        "warm VM ready"
                    );
                    state.warm.push_back(Lease::new(vm, slot));
                    state.last_error = None;
                    (false, None)
                }
                Err(error) => {
                    // Freed before claims waiting on this boot are woken.
                    drop(slot);
                    let text = sandbox_vmm::error_chain(&error);
                    tracing::error!(error = %text, "pool boot failed");
                    state.last_error = Some(text);
                    (true, None)
                }
            }
        };
        if let Some(lease) = leftover {
            lease.destroy().await;
            return;
        }
        shared.booted.notify_waiters();
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(REFILL_MAX_BACKOFF_SECS));
        } else {
            backoff = Duration::from_secs(REFILL_FIRST_BACKOFF_SECS);
        }
    }
}

/// Waits until the pool holds fewer VMs (warm and booting) than its target; `false`
/// once it is closed.
async fn below_target<F: VmFactory>(shared: &Shared<F>) -> bool {
    loop {
        // Registered before the state is read, so a claim in between is seen.
        let wanted = shared.wanted.notified();
        tokio::pin!(wanted);
        wanted.as_mut().enable();
        {
            let state = lock(&shared.state);
            if state.closed {
                return false;
            }
            if state.warm.len() + state.booting < shared.target {
                return true;
            }
        }
        wanted.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use crate::pool::fake::{default_spec, get, started_pool, until, BOOT_MS};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pool_refills_after_a_claim() {
        let (pool, counters) = started_pool(1, 2);
        until("a warm VM", || pool.status().warm == 1).await;
        let (_claimed, origin) = pool.claim(&default_spec()).await.unwrap();
        assert!(origin.is_warm());
        until("the refill", || pool.status().warm == 1).await;
        assert_eq!(get(&counters.boots), 2);
        assert_eq!(pool.used(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_grows_only_into_free_capacity() {
        let (pool, counters) = started_pool(1, 1);
        until("a warm VM", || pool.status().warm == 1).await;
        let (claimed, _) = pool.claim(&default_spec()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        let status = pool.status();
        assert_eq!((status.warm, status.booting), (0, 0), "no room to refill");
        assert_eq!(get(&counters.boots), 1);
        drop(claimed);
        until("the refill into the freed slot", || pool.status().warm == 1).await;
        assert_eq!(get(&counters.boots), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_boots_one_vm_at_a_time() {
        let (pool, counters) = started_pool(3, 3);
        let mut most_booting = 0;
        until("three warm VMs", || {
            let status = pool.status();
            most_booting = most_booting.max(status.booting);
            status.warm == 3
        })
        .await;
        assert_eq!(most_booting, 1);
        assert_eq!(get(&counters.peak), 3);
        let started = Instant::now();
        // Full: nothing more boots.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(get(&counters.boots), 3, "after {:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pool_boot_is_reported_frees_its_slot_and_is_retried_with_backoff() {
        let started = Instant::now();
        let (pool, counters) = started_pool(1, 1);
        counters.fail_next.store(2, Ordering::SeqCst);
        until("the first failure", || pool.status().last_error.is_some()).await;
        assert_eq!(
            pool.status().last_error.as_deref(),
            Some("fake boot failed")
        );
        assert_eq!((pool.used(), get(&counters.alive)), (0, 0));
        until("a warm VM", || pool.status().warm == 1).await;
        // Boot (1 s), fail, wait 1 s, boot, fail, wait 2 s, boot: 6 s.
        let boot = Duration::from_millis(BOOT_MS);
        let expected = 3 * boot + Duration::from_secs(1 + 2);
        let took = started.elapsed();
        assert!(
            took >= expected && took < expected + Duration::from_millis(50),
            "{took:?}"
        );
        assert_eq!(get(&counters.boots), 3);
        assert_eq!(pool.status().last_error, None, "a success clears the error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_of_zero_never_boots() {
        let (pool, counters) = started_pool(0, 2);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(get(&counters.boots), 0);
        assert_eq!(pool.status().target, 0);
    }
}
