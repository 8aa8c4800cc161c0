//! The fleet tools on a node: `create_sandboxes` (several claims, all or nothing),
//! `ping_sandbox` (through the data plane) and `list_templates` (from the node's
//! info), answered in the same result types as the embedded engine's.

use std::sync::Arc;
use std::time::Instant;

use sandbox_engine::batch::Ping;
use sandbox_engine::sandbox::Status;
use sandbox_engine::util::millis;
use sandbox_vmm::node_api::wire::{ClaimBody, ClaimReply, InfoReply};
use sandbox_vmm::node_api::{NodeApi, NodeApiError};
use tokio::sync::Semaphore;

use super::errors::Call;
use super::{convert, Session, CLAIM_REF};
use crate::error::{Op, ToolError};
use crate::fleet::render::{CreateSandboxesResult, ListTemplatesResult, PingResult};

/// How many claims of one batch are in flight at once: enough to overlap cold
/// boots, few enough not to flood the node's listener with one session's requests.
const PARALLEL_CLAIMS: usize = 4;

/// What one batch claims: everything but the count.
#[derive(Debug, Clone, Default)]
pub struct BatchSpec {
    /// The template (`None`: this session's, else the node's default).
    pub template: Option<String>,
    /// The size preset (`None`: the template's).
    pub size: Option<String>,
    /// Each sandbox's lifetime, already bounded by the caller.
    pub ttl_secs: u64,
}

impl Session {
    /// `create_sandboxes`: `count` claims of `spec`, in parallel (at most
    /// [`PARALLEL_CLAIMS`] at once). All or nothing: the node's room is checked
    /// first, and when one claim fails, those already made are released before the
    /// failure is answered.
    pub async fn create_many(
        &self,
        spec: BatchSpec,
        count: u64,
    ) -> Result<CreateSandboxesResult, ToolError> {
        let started = Instant::now();
        let template = spec.template.clone().or_else(|| self.template.clone());
        let info = self.info("create_sandboxes").await?;
        let wanted = room(&info, count)?;
        let body = ClaimBody {
            template: template.clone().unwrap_or_default(),
            size: spec.size.clone().unwrap_or_default(),
            ttl_seconds: spec.ttl_secs,
            claim_ref: CLAIM_REF.to_owned(),
            ..ClaimBody::default()
        };
        let (made, failure) = claim_all(&self.api, &body, wanted).await;
        if let Some(failed) = failure {
            release_all(&self.api, &made).await;
            return Err(match failed {
                Failed::Node(error) => self.fail(Call::Claim(template.as_deref()), &error).await,
                Failed::Aborted(error) => ToolError::new(format!(
                    "A claim of the batch ended abnormally ({error}); none of the batch was \
                     kept. Try again."
                )),
            });
        }
        let sandboxes: Vec<_> = made
            .iter()
            .map(|reply| {
                self.keep(reply);
                convert::created(reply, spec.ttl_secs)
            })
            .collect();
        Ok(CreateSandboxesResult {
            warm: sandboxes.iter().filter(|sandbox| sandbox.warm).count(),
            sandboxes,
            batch_ms: millis(started.elapsed()),
        })
    }

    /// `ping_sandbox`: the agent's own report through the data plane. A sandbox
    /// the node lists as hibernated is reported so without being reached, since the
    /// data plane would wake it.
    pub async fn ping(&self, id: &str) -> Result<PingResult, ToolError> {
        let held = self.sandbox(id)?;
        let row = match held.api().sandbox(id).await {
            Ok(row) => row,
            Err(error) => return Err(self.fail(Call::Sandbox("ping_sandbox", id), &error).await),
        };
        if row.status == Status::Hibernated.as_str() {
            let ping = Ping {
                status: Status::Hibernated,
                info: None,
                round_trip: None,
            };
            return Ok(PingResult::new(id, &ping));
        }
        let client = held.client(Op::Other).await?;
        let asked = Instant::now();
        let info = client
            .info()
            .await
            .map_err(|error| ToolError::agent(Op::Other, id, &error))?;
        let ping = Ping {
            status: Status::Running,
            info: Some(info),
            round_trip: Some(asked.elapsed()),
        };
        Ok(PingResult::new(id, &ping))
    }

    /// `list_templates`: what the node's info says of each template.
    pub async fn list_templates(&self) -> Result<ListTemplatesResult, ToolError> {
        let info = self.info("list_templates").await?;
        Ok(ListTemplatesResult {
            templates: info.templates.iter().map(convert::template_row).collect(),
        })
    }
}

/// `count` as a number of claims when the node has room for all of them now;
/// otherwise why not, before anything is claimed. A node in a fleet (it lists
/// peers) places claims on its peers too: only the bound is checked, at one node's
/// limit per node, and a batch that does not fit fails at its first refused claim
/// (all or nothing still, by releasing what was made).
fn room(info: &InfoReply, count: u64) -> Result<usize, ToolError> {
    let nodes = info.peers.len().saturating_add(1);
    let max = info.capacity.max_sandboxes.saturating_mul(nodes);
    let wanted = usize::try_from(count).unwrap_or(usize::MAX);
    if wanted == 0 || wanted > max {
        let limit = if nodes > 1 {
            "the fleet's sandbox limit: the node's times its nodes"
        } else {
            "the node's sandbox limit"
        };
        return Err(ToolError::new(format!(
            "count must be between 1 and {max} ({limit}); got {count}. \
             node_info shows how many more can be claimed now."
        )));
    }
    if nodes > 1 {
        return Ok(wanted);
    }
    if info.draining {
        return Err(ToolError::new(
            "The node is draining: it takes no new claims. The operator ends that with \
             sandboxctl node uncordon.",
        ));
    }
    let claimable = info.capacity.claimable;
    if wanted > claimable {
        return Err(ToolError::new(format!(
            "The node has room for {claimable} more sandbox(es) now, not {wanted}; nothing \
             was claimed. Release sandboxes this session no longer needs (list_sandboxes), \
             or ask for fewer."
        )));
    }
    Ok(wanted)
}

/// Why a batch's claim failed.
#[derive(Debug)]
enum Failed {
    /// The node refused it or could not be reached.
    Node(NodeApiError),
    /// Its task panicked or was cancelled.
    Aborted(tokio::task::JoinError),
}

/// `count` claims of `body`, at most [`PARALLEL_CLAIMS`] in flight: the replies of
/// those that succeeded, and the first failure if one did not. Once one fails no
/// further claim starts.
async fn claim_all(
    api: &NodeApi,
    body: &ClaimBody,
    count: usize,
) -> (Vec<ClaimReply>, Option<Failed>) {
    let permits = Arc::new(Semaphore::new(PARALLEL_CLAIMS));
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (api, body) = (api.clone(), body.clone());
        let (permits, failed) = (permits.clone(), failed.clone());
        set.spawn(async move {
            // The semaphore is never closed, so acquiring only waits.
            let _permit = permits.acquire_owned().await.ok();
            if failed.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            let claimed = api.claim(&body).await;
            if claimed.is_err() {
                failed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            Some(claimed)
        });
    }
    let (mut made, mut failure) = (Vec::new(), None);
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Some(Ok(reply))) => made.push(reply),
            Ok(Some(Err(error))) => {
                failure.get_or_insert(Failed::Node(error));
            }
            // Skipped after a failure, which is already recorded.
            Ok(None) => {}
            Err(aborted) => {
                failure.get_or_insert(Failed::Aborted(aborted));
            }
        }
    }
    (made, failure)
}

/// Releases the sandboxes a failed batch made; a release that fails is logged
/// (the node still destroys the sandbox at its deadline).
async fn release_all(api: &NodeApi, made: &[ClaimReply]) {
    let releases = made.iter().map(|reply| {
        // Each at the node that made it (placement may spread a batch).
        let api = api.at(&reply.owner_addr).unwrap_or_else(|_| api.clone());
        let id = reply.id.clone();
        async move {
            if let Err(error) = api.release(&id).await {
                tracing::warn!(sandbox = %id, %error, "cannot release a failed batch's sandbox on the node");
            }
        }
    });
    sandbox_engine::util::join_all(releases).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_vmm::node_api::wire::CapacityRow;

    fn info(max: usize, claimable: usize, draining: bool) -> InfoReply {
        InfoReply {
            draining,
            capacity: CapacityRow {
                max_sandboxes: max,
                claimable,
                ..CapacityRow::default()
            },
            ..InfoReply::default()
        }
    }

    #[test]
    fn a_batch_is_refused_before_any_claim_when_it_cannot_all_fit() {
        assert_eq!(room(&info(5, 3, false), 3).ok(), Some(3));
        for (count, why) in [
            (0, "between 1 and 5"),
            (6, "between 1 and 5"),
            (4, "room for 3"),
        ] {
            let error = room(&info(5, 3, false), count).err().map(|e| e.message);
            assert!(
                error.as_deref().is_some_and(|m| m.contains(why)),
                "{error:?}"
            );
        }
        let error = room(&info(5, 3, false), u64::MAX).err().map(|e| e.message);
        assert!(error.is_some_and(|m| m.contains("between 1 and 5")));
        let draining = room(&info(5, 5, true), 1).err().map(|e| e.message);
        assert!(draining.is_some_and(|m| m.contains("draining")));
    }

    #[test]
    fn in_a_fleet_only_the_bound_is_checked_since_peers_take_claims_too() {
        let mut drained = info(5, 0, true);
        drained.peers = vec!["10.0.0.6:7777".into(), "10.0.0.7:7777".into()];
        assert_eq!(room(&drained, 12).ok(), Some(12));
        let error = room(&drained, 16).err().map(|e| e.message);
        assert!(error.is_some_and(|m| m.contains("between 1 and 15")));
    }
}
