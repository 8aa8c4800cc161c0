//! How long real boots take: a latency histogram the node daemon serves as
//! `sandboxd_boot_seconds`. Counted where every boot goes (the launcher factory), so
//! pool refills, batches and cold claims are all in it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket bounds in seconds: a restore from a ready snapshot takes a fraction of a
/// second, a cold boot under emulation tens of seconds.
pub const BOOT_BUCKETS_SECS: [f64; 9] = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Boot durations so far.
#[derive(Debug, Default)]
pub struct BootTimes {
    buckets: [AtomicU64; BOOT_BUCKETS_SECS.len()],
    count: AtomicU64,
    failed: AtomicU64,
    sum_micros: AtomicU64,
}

/// A copy of [`BootTimes`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BootSnapshot {
    /// Boots at or under each of [`BOOT_BUCKETS_SECS`] (cumulative, as Prometheus).
    pub buckets: [u64; BOOT_BUCKETS_SECS.len()],
    /// Boots that produced a VM.
    pub count: u64,
    /// Boots that failed (not in the histogram).
    pub failed: u64,
    /// Total time of the successful boots, in microseconds.
    pub sum_micros: u64,
}

impl BootTimes {
    /// One boot that took `took`; `ok` when it produced a VM.
    pub fn observe(&self, took: Duration, ok: bool) {
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let secs = took.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BOOT_BUCKETS_SECS) {
            if secs <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// What has been counted.
    pub fn snapshot(&self) -> BootSnapshot {
        BootSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boots_land_in_cumulative_buckets_and_failures_apart() {
        let times = BootTimes::default();
        times.observe(Duration::from_millis(300), true);
        times.observe(Duration::from_secs(40), true);
        times.observe(Duration::from_secs(1), false);
        let seen = times.snapshot();
        assert_eq!(seen.count, 2);
        assert_eq!(seen.failed, 1);
        assert_eq!(seen.buckets[0], 0, "0.25 s");
        assert_eq!(seen.buckets[1], 1, "0.5 s");
        assert_eq!(seen.buckets[6], 1, "30 s");
        assert_eq!(seen.buckets[7], 2, "60 s");
        assert_eq!(seen.sum_micros, 40_300_000);
    }
}
