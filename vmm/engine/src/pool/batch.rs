//! Batches: many VMs of one kind in one claim, all or none (`create_sandboxes`,
//! and `spawn_sandboxes` of a template).
//!
//! A batch is not a loop of [`Pool::claim`]: claims that find the pool empty wait
//! for the refiller, which boots one VM at a time. A batch takes the warm VMs there
//! are, then the slots for the rest at once ([`Pool::slots`]: free ones first, then
//! warm VMs of other kinds), and boots the rest side by side. Only then is the
//! refiller told the pool shrank, so it does not take a slot the batch counted on.

use tokio::task::JoinSet;

use super::warm::Pool;
use super::{ClaimError, Lease, Machine, Origin, VmFactory, VmSpec};
use crate::util::{join_all, lock};

impl<F: VmFactory> Pool<F> {
    /// `count` VMs of `spec` at once, each with where it came from; all or none.
    /// Warm VMs go first (when the pool keeps that kind), the rest boot side by side
    /// on slots taken as [`Pool::slots`] takes them. The room is checked before
    /// anything is taken, so a batch that cannot fit fails at once with nothing
    /// evicted. On a failed boot every VM of the batch is destroyed, the warm ones
    /// too: only the refiller adds to the pool, which it refills. Dropping the future
    /// kills the boots in flight (a `JoinSet` aborts its tasks on drop).
    pub async fn claim_many(
        &self,
        spec: &VmSpec,
        count: usize,
    ) -> Result<Vec<(Lease<F::Vm>, Origin)>, ClaimError<F::Error>> {
        let shared = &self.shared;
        let (warm, dead) = {
            let mut state = lock(&shared.state);
            if state.closed {
                return Err(ClaimError::Closed);
            }
            let room = shared.capacity.available_permits() + state.warm.len() + state.booting;
            if room < count {
                return Err(ClaimError::Short {
                    wanted: count,
                    room,
                    max: shared.max,
                });
            }
            let (mut warm, mut dead) = (Vec::new(), Vec::new());
            while shared.target > 0 && *spec == shared.spec && warm.len() < count {
                let Some(lease) = state.warm.pop_front() else {
                    break;
                };
                match lease.vm().lost() {
                    None => warm.push(lease),
                    Some(reason) => {
                        tracing::warn!(vm = lease.vm().id(), %reason, "a warm VM lost its agent; discarding it");
                        dead.push(lease);
                    }
                }
            }
            (warm, dead)
        };
        // Their slots count as room for the cold boots: free them first.
        join_all(dead.into_iter().map(Lease::destroy)).await;
        let slots = match self.slots(count - warm.len()).await {
            Ok(slots) => slots,
            Err(error) => {
                join_all(warm.into_iter().map(Lease::destroy)).await;
                shared.wanted.notify_one();
                return Err(error);
            }
        };
        // Only now may the refiller compete for capacity.
        shared.wanted.notify_one();
        let mut boots = JoinSet::new();
        for (index, slot) in slots.into_iter().enumerate() {
            let (shared, spec) = (self.shared.clone(), spec.clone());
            boots.spawn(async move {
                let booted = shared.factory.boot(&spec, shared.boot_timeout).await;
                (index, booted.map(|vm| Lease::new(vm, slot)))
            });
        }
        let mut booted = Vec::with_capacity(boots.len());
        let mut failure = None;
        while let Some(joined) = boots.join_next().await {
            match joined {
                Ok((index, Ok(lease))) => booted.push((index, lease)),
                Ok((_, Err(error))) => failure = failure.or(Some(ClaimError::Boot(error))),
                // Tasks are only aborted by dropping the set, and a boot does not
                // panic; were one to, its slot went with it.
                Err(error) => tracing::error!(%error, "a batch boot task failed"),
            }
        }
        if failure.is_some() || booted.len() + warm.len() < count {
            let booted = booted.into_iter().map(|(_, lease)| lease);
            join_all(warm.into_iter().chain(booted).map(Lease::destroy)).await;
            return Err(failure.unwrap_or(ClaimError::Closed));
        }
        booted.sort_by_key(|(index, _)| *index);
        let warm = warm.into_iter().map(|lease| (lease, Origin::WarmPool));
        Ok(warm
            .chain(booted.into_iter().map(|(_, lease)| (lease, Origin::NewVm)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::pool::fake::{default_spec, get, other_spec, started_pool, until, BOOT_MS};

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_the_warm_vm_and_boots_the_rest_side_by_side() {
        let (pool, counters) = started_pool(1, 4);
        until("a warm VM", || pool.status().warm == 1).await;
        let started = Instant::now();
        let batch = pool.claim_many(&default_spec(), 3).await.unwrap();
        let origins: Vec<Origin> = batch.iter().map(|(_, origin)| *origin).collect();
        assert_eq!(origins, [Origin::WarmPool, Origin::NewVm, Origin::NewVm]);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(BOOT_MS),
            "the two cold boots overlap"
        );
        assert_eq!(batch[0].0.vm().id(), "fake-1");
        assert_eq!(pool.used(), 4, "three claimed, and the refill of the pool");
        assert!(get(&counters.boots) >= 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_does_not_fit_fails_at_once_and_keeps_the_pool() {
        let (pool, counters) = started_pool(1, 3);
        until("a warm VM", || pool.status().warm == 1).await;
        let (_held, _) = pool.claim(&other_spec()).await.unwrap();
        let short = pool.claim_many(&default_spec(), 3).await.unwrap_err();
        assert!(
            matches!(
                short,
                ClaimError::Short {
                    wanted: 3,
                    room: 2,
                    max: 3
                }
            ),
            "{short}"
        );
        assert_eq!(pool.status().warm, 1, "the warm VM is still there");
        assert_eq!(get(&counters.destroyed), 0);
        // Two fit: the warm one and one booted.
        let batch = pool.claim_many(&default_spec(), 2).await.unwrap();
        assert_eq!(batch.len(), 2);
        assert_eq!(pool.used(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_boot_fails_the_whole_batch_and_leaves_no_vm_of_it() {
        // The batch fills the capacity, so both failing and succeeding boots are its.
        let (pool, counters) = started_pool(1, 3);
        until("a warm VM", || pool.status().warm == 1).await;
        counters.fail_next.store(1, Ordering::SeqCst);
        let error = pool.claim_many(&default_spec(), 3).await.unwrap_err();
        assert!(matches!(error, ClaimError::Boot(_)), "{error}");
        assert_eq!(
            get(&counters.destroyed),
            2,
            "the warm VM and the booted one are destroyed"
        );
        until("the pool to refill", || pool.status().warm == 1).await;
        assert_eq!((pool.used(), get(&counters.alive)), (1, 1));
    }
}
