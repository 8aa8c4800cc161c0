//! Counters and latency histograms for `GET /metrics`, in Prometheus' text format.
//! Plain atomics: a handful of series do not need a metrics crate.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sandbox_engine::error::CreateError;
use sandbox_engine::node::{Claimed, NodeStatus};
use sandbox_engine::pool::boot_times::{BootSnapshot, BOOT_BUCKETS_SECS};

/// Histogram bucket bounds, in seconds.
const BUCKETS_SECS: [f64; 10] = [0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A latency histogram.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS_SECS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_SECS) {
            if secs <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_SECS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The egress of the live sandboxes, as their logs hold it (each log is capped,
/// so this is what a scrape can see, not a lifetime total).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EgressTotals {
    /// Connections made (or tried and allowed), by verdict: allowed, denied,
    /// failed, refused.
    pub by_verdict: [u64; 4],
    /// Bytes the guests sent out.
    pub bytes_out: u64,
    /// Bytes the guests received.
    pub bytes_in: u64,
}

impl EgressTotals {
    /// Adds `records`.
    pub fn add(&mut self, records: &[sandbox_vmm::egress::EgressRecord]) {
        use sandbox_vmm::egress::Verdict;
        for record in records {
            let slot = match record.verdict {
                Verdict::Allowed => 0,
                Verdict::Denied => 1,
                Verdict::Failed => 2,
                Verdict::Refused => 3,
            };
            self.by_verdict[slot] += 1;
            self.bytes_out = self.bytes_out.saturating_add(record.bytes_out);
            self.bytes_in = self.bytes_in.saturating_add(record.bytes_in);
        }
    }
}

/// `sandboxd_boot_seconds` (a histogram of VM boots, pool refills and cold claims
/// alike) and `sandboxd_boots_failed_total`.
fn render_boots(out: &mut String, boots: &BootSnapshot) {
    let name = "sandboxd_boot_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} MicroVM boots (cold or from a ready snapshot), start to agent ready.\n# TYPE {name} histogram"
    );
    for (count, bound) in boots.buckets.iter().zip(BOOT_BUCKETS_SECS) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
    }
    let sum = boots.sum_micros as f64 / 1e6;
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}",
        count = boots.count
    );
    let _ = writeln!(
        out,
        "# HELP sandboxd_boots_failed_total MicroVM boots that failed.\n# TYPE sandboxd_boots_failed_total counter\nsandboxd_boots_failed_total {}",
        boots.failed
    );
}

/// The labels of [`EgressTotals::by_verdict`].
const VERDICTS: [&str; 4] = ["allowed", "denied", "failed", "refused"];

/// What the daemon counts.
#[derive(Debug, Default)]
pub struct Metrics {
    claims: AtomicU64,
    claims_failed: AtomicU64,
    warm_hits: AtomicU64,
    forks: AtomicU64,
    fork_children: AtomicU64,
    upgrades: AtomicU64,
    claim_latency: Histogram,
    restore_latency: Histogram,
}

impl Metrics {
    /// A claim's outcome and duration.
    pub fn claimed(&self, result: &Result<Claimed, CreateError>, took: Duration) {
        match result {
            Ok(claimed) => {
                self.claims.fetch_add(1, Ordering::Relaxed);
                if claimed.origin.is_some_and(|origin| origin.is_warm()) {
                    self.warm_hits.fetch_add(1, Ordering::Relaxed);
                }
                self.claim_latency.observe(took);
            }
            Err(_) => {
                self.claims_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A claim from a checkpoint (a restore).
    pub fn restored(&self, took: Duration) {
        self.claims.fetch_add(1, Ordering::Relaxed);
        self.restore_latency.observe(took);
    }

    /// A fork into `children`.
    pub fn forked(&self, children: usize) {
        self.forks.fetch_add(1, Ordering::Relaxed);
        self.fork_children.fetch_add(
            u64::try_from(children).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// An agent connection through the data plane.
    pub fn upgraded(&self) {
        self.upgrades.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything, with the node's gauges from `status` and the live sandboxes'
    /// `egress`.
    pub fn render(
        &self,
        status: &NodeStatus,
        egress: &EgressTotals,
        boots: Option<&BootSnapshot>,
    ) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        };
        counter(
            &mut out,
            "sandboxd_claims_total",
            "Sandboxes claimed (templates and checkpoints).",
            &self.claims,
        );
        counter(
            &mut out,
            "sandboxd_claims_failed_total",
            "Claims refused or failed.",
            &self.claims_failed,
        );
        counter(
            &mut out,
            "sandboxd_warm_hits_total",
            "Claims served by a warm VM.",
            &self.warm_hits,
        );
        counter(
            &mut out,
            "sandboxd_forks_total",
            "Fork calls that succeeded.",
            &self.forks,
        );
        counter(
            &mut out,
            "sandboxd_fork_children_total",
            "Children made by forks.",
            &self.fork_children,
        );
        counter(
            &mut out,
            "sandboxd_agent_connections_total",
            "Agent connections through the data plane.",
            &self.upgrades,
        );
        self.claim_latency.render(
            &mut out,
            "sandboxd_claim_seconds",
            "Template claims, call to answer.",
        );
        self.restore_latency.render(
            &mut out,
            "sandboxd_checkpoint_claim_seconds",
            "Claims from a checkpoint, call to answer.",
        );
        if let Some(boots) = boots {
            render_boots(&mut out, boots);
        }
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        gauge(
            &mut out,
            "sandboxd_live_sandboxes",
            "Sandboxes claimed now.",
            status.capacity.live_claims,
        );
        gauge(
            &mut out,
            "sandboxd_vms",
            "VMs running or booting.",
            status.capacity.vms,
        );
        gauge(
            &mut out,
            "sandboxd_max_sandboxes",
            "Most VMs at once.",
            status.capacity.max_sandboxes,
        );
        if let Some(pool) = &status.pool {
            gauge(&mut out, "sandboxd_pool_warm", "Warm VMs ready.", pool.warm);
            gauge(
                &mut out,
                "sandboxd_pool_booting",
                "Pool VMs booting.",
                pool.booting,
            );
            gauge(
                &mut out,
                "sandboxd_pool_target",
                "Warm VMs the pool keeps.",
                pool.target,
            );
        }
        gauge(
            &mut out,
            "sandboxd_draining",
            "1 while claims are refused.",
            usize::from(status.draining),
        );
        let _ = writeln!(
            out,
            "# HELP sandboxd_egress_connections Egress connections of the live sandboxes, as their logs hold them.\n# TYPE sandboxd_egress_connections gauge"
        );
        for (verdict, count) in VERDICTS.iter().zip(egress.by_verdict) {
            let _ = writeln!(
                out,
                "sandboxd_egress_connections{{verdict=\"{verdict}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP sandboxd_egress_bytes Egress bytes of the live sandboxes, as their logs hold them.\n# TYPE sandboxd_egress_bytes gauge\nsandboxd_egress_bytes{{direction=\"out\"}} {}\nsandboxd_egress_bytes{{direction=\"in\"}} {}",
            egress.bytes_out, egress.bytes_in
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use sandbox_engine::node::Capacity;
    use sandbox_vmm::egress::{EgressRecord, Verdict};

    use super::*;

    fn record(verdict: Verdict, bytes_out: u64, bytes_in: u64) -> EgressRecord {
        EgressRecord {
            time_unix_ms: 0,
            host: "example.org".into(),
            port: 443,
            address: None,
            verdict,
            reason: None,
            bytes_out,
            bytes_in,
            duration_ms: 1,
        }
    }

    #[test]
    fn egress_is_counted_by_verdict_with_its_bytes() {
        let mut totals = EgressTotals::default();
        totals.add(&[
            record(Verdict::Allowed, 10, 100),
            record(Verdict::Allowed, 1, 2),
            record(Verdict::Denied, 0, 0),
        ]);
        let status = NodeStatus {
            attached: false,
            default_template: "default".into(),
            pool: None,
            templates: Vec::new(),
            sandboxes: Vec::new(),
            capacity: Capacity {
                max_sandboxes: 1,
                vms: 0,
                live_claims: 0,
                claimable: 1,
            },
            draining: false,
        };
        let boots = BootSnapshot {
            buckets: [0, 1, 1, 1, 1, 1, 1, 1, 1],
            count: 1,
            failed: 2,
            sum_micros: 400_000,
        };
        let text = Metrics::default().render(&status, &totals, Some(&boots));
        for line in [
            "sandboxd_egress_connections{verdict=\"allowed\"} 2",
            "sandboxd_egress_connections{verdict=\"denied\"} 1",
            "sandboxd_egress_connections{verdict=\"refused\"} 0",
            "sandboxd_egress_bytes{direction=\"out\"} 11",
            "sandboxd_egress_bytes{direction=\"in\"} 102",
            "sandboxd_boot_seconds_bucket{le=\"0.5\"} 1",
            "sandboxd_boot_seconds_count 1",
            "sandboxd_boots_failed_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
