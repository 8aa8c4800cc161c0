//! Many sandboxes at once, as methods of [`Node`]: a batch of claims (all or none),
//! and a ping that does not wake a hibernated sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_protocol::AgentInfo;
use sandbox_vmm::launcher::Size;

use crate::error::BatchError;
use crate::node::{NewVm, Node};
use crate::pool::{Lease, Origin, VmSpec};
use crate::sandbox::{Lineage, Sandbox, Status, Unreachable};
use crate::util::{join_all, millis};

/// Sandboxes made by one batch, in the order they were claimed (warm ones first).
#[derive(Debug)]
pub struct Batch {
    /// The sandboxes, each with where its VM came from.
    pub sandboxes: Vec<(Arc<Sandbox>, Origin)>,
    /// What each runs.
    pub spec: VmSpec,
    /// From the call until every VM answered.
    pub took: Duration,
}

/// What a ping found.
#[derive(Debug)]
pub struct Ping {
    /// The sandbox's state when pinged.
    pub status: Status,
    /// The agent's own report; `None` for a hibernated sandbox, which a ping does
    /// not wake.
    pub info: Option<AgentInfo>,
    /// The request's round trip.
    pub round_trip: Option<Duration>,
}

impl Node {
    /// `count` sandboxes of `template` (the default when `None`) at `size` (its
    /// default when `None`), each living `ttl`: all of them, or none.
    pub async fn claim_batch(
        &self,
        template: Option<&str>,
        size: Option<Size>,
        ttl: Duration,
        count: u64,
    ) -> Result<Batch, BatchError> {
        let Some(pool) = self.pool() else {
            return Err(BatchError::Attached);
        };
        if self.is_draining() {
            return Err(BatchError::Draining);
        }
        let max = pool.max();
        let wanted = usize::try_from(count)
            .ok()
            .filter(|wanted| (1..=max).contains(wanted))
            .ok_or(BatchError::Count { count, max })?;
        let spec = self
            .resolve_spec(pool, template, size)
            .map_err(BatchError::Spec)?;
        let started = Instant::now();
        let leases = pool.claim_many(&spec, wanted).await?;
        let took = started.elapsed();
        let mut sandboxes = Vec::with_capacity(wanted);
        let mut leases = leases.into_iter();
        while let Some((lease, origin)) = leases.next() {
            let new = NewVm {
                lease,
                template: spec.template.to_string(),
                size: spec.size,
                ttl,
                warm: origin.is_warm(),
                claim_duration: took,
                lineage: Lineage::Template,
            };
            match self.insert_vm(new).await {
                Ok(sandbox) => sandboxes.push((sandbox, origin)),
                Err(error) => {
                    join_all(leases.map(|(lease, _)| Lease::destroy(lease))).await;
                    for (sandbox, _) in sandboxes {
                        let _ = self.registry().release(sandbox.id.as_str()).await;
                    }
                    return Err(BatchError::Insert(error));
                }
            }
        }
        tracing::info!(count = wanted, template = %spec.template, batch_ms = millis(took), "batch claimed");
        Ok(Batch {
            sandboxes,
            spec,
            took,
        })
    }

    /// Asks the sandbox's agent how it is, timing the round trip. A hibernated
    /// sandbox is reported as such, not woken: a health check should not cost a
    /// restore.
    pub async fn ping(&self, sandbox: &Sandbox) -> Result<Ping, Unreachable> {
        let status = sandbox.status();
        if status == Status::Hibernated {
            return Ok(Ping {
                status,
                info: None,
                round_trip: None,
            });
        }
        let client = sandbox.client().await?;
        let started = Instant::now();
        let info = client.info().await?;
        Ok(Ping {
            status: Status::Running,
            info: Some(info),
            round_trip: Some(started.elapsed()),
        })
    }
}
