//! One at a time per key: a download of one checkpoint or template, a take of one
//! parked sandbox. A second caller with the same key waits for the first and then
//! runs (and usually finds the work done); callers with other keys do not wait.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// The keys in flight.
#[derive(Debug, Default)]
pub struct Flights {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Flights {
    /// Runs `work` once no other work of `key` runs.
    pub async fn one_at_a_time<T>(&self, key: &str, work: impl Future<Output = T>) -> T {
        let flight = sandbox_engine::util::lock(&self.keys)
            .entry(key.to_owned())
            .or_default()
            .clone();
        let result = {
            let _one = flight.lock().await;
            work.await
        };
        let mut keys = sandbox_engine::util::lock(&self.keys);
        // The last waiter forgets the key (the map holds one reference, this
        // caller another).
        if Arc::strong_count(&flight) <= 2 {
            keys.remove(key);
        }
        result
    }

    /// Whether work of `key` runs or waits now.
    pub fn under_way(&self, key: &str) -> bool {
        sandbox_engine::util::lock(&self.keys).contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_of_one_key_runs_one_at_a_time_and_the_key_is_forgotten_after() {
        let flights = Arc::new(Flights::default());
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (flights, running, most) = (flights.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    flights
                        .one_at_a_time("k", async {
                            let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        })
                        .await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(!flights.under_way("k"));
    }
}
