//! Small helpers shared by modules that otherwise do not depend on each other (the
//! registry, the pool, the tools). They lived in the pool, which made every module
//! that needed a lock or a millisecond count import it.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Runs futures concurrently, each on its own task, and waits for all of them.
/// Used to destroy many VMs at once: each stop waits up to its grace period, so in
/// sequence they would add up.
pub async fn join_all<F>(futures: impl IntoIterator<Item = F>)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    while set.join_next().await.is_some() {}
}

/// Milliseconds, saturating (results report durations in whole milliseconds).
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Locks a mutex, recovering from poisoning. Every critical section in this crate
/// leaves its state consistent before anything that could panic, so a poisoned lock
/// still guards valid data.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
