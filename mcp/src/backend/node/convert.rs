//! The node's answers (`sandbox_vmm::node_api::wire`) as the tools' results, so a
//! node session renders exactly as an embedded one.

use std::time::{Duration, SystemTime};

use sandbox_engine::util::millis;
use sandbox_vmm::launcher::Size;
use sandbox_vmm::node_api::wire::{
    CheckpointReply, CheckpointRow as WireCheckpoint, ClaimReply, ForkReply, HibernateReply,
    InfoReply, SandboxRow as WireSandbox, TemplateRow as WireTemplate,
};

use super::Held;
use crate::fleet::render::{SandboxRow, TemplateRow};
use crate::render::{
    rfc3339, CapacityInfo, ClaimInfo, CreateSandboxResult, NodeInfoResult, PoolInfo, TemplateInfo,
};
use crate::snapshot::render::{
    BranchResult, CheckpointResult, CheckpointRow, ChildRow, ForkResult, HibernateResult,
    ListCheckpointsResult,
};

/// A size the node names (a preset or `VCPUSxMIB`), taken apart when it parses.
fn size_of(name: &str) -> Option<Size> {
    name.parse().ok()
}

fn non_empty(text: &str) -> Option<String> {
    Some(text.to_owned()).filter(|text| !text.is_empty())
}

/// `create_sandbox`: a claim of `ttl_secs`.
pub fn created(reply: &ClaimReply, ttl_secs: u64) -> CreateSandboxResult {
    let size = size_of(&reply.size);
    CreateSandboxResult {
        sandbox_id: reply.id.clone(),
        deadline: non_empty(&reply.deadline),
        ttl_seconds: Some(ttl_secs),
        template: reply.template.clone(),
        size: non_empty(&reply.size),
        vcpus: size.map(|size| size.vcpus),
        memory_mib: size.map(|size| size.memory_mib),
        warm: reply.warm,
        origin: if reply.warm { "warm_pool" } else { "new_vm" }.to_owned(),
        claim_ms: reply.claim_ms,
        note: None,
    }
}

/// A row of `list_sandboxes` / `get_sandbox`.
pub fn sandbox_row(row: &WireSandbox) -> SandboxRow {
    let size = size_of(&row.size);
    let deadline = humantime::parse_rfc3339(&row.deadline).ok();
    SandboxRow {
        sandbox_id: row.id.clone(),
        state: row.status.clone(),
        template: row.template.clone(),
        forked_from: row.lineage.strip_prefix("fork:").map(str::to_owned),
        checkpoint_id: row.lineage.strip_prefix("checkpoint:").map(str::to_owned),
        size: non_empty(&row.size),
        vcpus: size.map(|size| size.vcpus),
        memory_mib: size.map(|size| size.memory_mib),
        claimed_at: row.claimed_at.clone(),
        deadline: non_empty(&row.deadline),
        seconds_left: deadline.map(|deadline| {
            deadline
                .duration_since(SystemTime::now())
                .map_or(0, |left| left.as_secs())
        }),
    }
}

/// `node_info`: the node's state, with `held` as this session's claims.
pub fn node_info(info: &InfoReply, held: &[Held]) -> NodeInfoResult {
    NodeInfoResult {
        mode: format!("node {} (sandboxd {})", info.addr, info.version),
        default_template: info.default_template.clone(),
        pool: info.pool.as_ref().map(|pool| PoolInfo {
            template: pool.template.clone(),
            size: pool.size.clone(),
            target: pool.target,
            warm: pool.warm,
            booting: pool.booting,
            last_error: pool.last_error.clone(),
        }),
        templates: info
            .templates
            .iter()
            .map(|template| TemplateInfo {
                name: template.name.clone(),
                default_size: template.size.clone(),
                default: template.default,
            })
            .collect(),
        claims: held
            .iter()
            .map(|held| ClaimInfo {
                sandbox_id: held.id.clone(),
                template: held.template.clone(),
                size: non_empty(&held.size),
                claimed_at: rfc3339(held.claimed_at),
                deadline: non_empty(&held.deadline),
            })
            .collect(),
        capacity: CapacityInfo {
            max_sandboxes: info.capacity.max_sandboxes,
            vms: info.capacity.vms,
            live_claims: held.len(),
            claimable: info.capacity.claimable,
        },
    }
}

/// `fork`: children of `ttl_secs`.
pub fn forked(reply: &ForkReply, ttl_secs: u64) -> ForkResult {
    ForkResult {
        sandbox_id: reply.id.clone(),
        children: reply
            .children
            .iter()
            .map(|child| ChildRow {
                sandbox_id: child.id.clone(),
                deadline: child.deadline.clone(),
                ttl_seconds: ttl_secs,
            })
            .collect(),
        pause_ms: reply.pause_ms,
        fork_ms: reply.fork_ms,
    }
}

/// `checkpoint`
pub fn checkpointed(reply: &CheckpointReply) -> CheckpointResult {
    let checkpoint = &reply.checkpoint;
    CheckpointResult {
        checkpoint_id: checkpoint.id.clone(),
        name: non_empty(&checkpoint.name),
        sandbox_id: checkpoint.sandbox_id.clone(),
        template: checkpoint.template.clone(),
        created_at: checkpoint.created_at.clone(),
        pause_ms: reply.pause_ms,
        took_ms: reply.took_ms,
        bytes_on_disk: checkpoint.bytes_on_disk,
    }
}

/// `branch_checkpoint`: the sandbox claimed from checkpoint `key` in `took`.
pub fn branched(reply: &ClaimReply, key: &str, ttl_secs: u64, took: Duration) -> BranchResult {
    let size = size_of(&reply.size).unwrap_or_default();
    BranchResult {
        sandbox_id: reply.id.clone(),
        checkpoint_id: non_empty(&reply.from_checkpoint).unwrap_or_else(|| key.to_owned()),
        deadline: reply.deadline.clone(),
        ttl_seconds: ttl_secs,
        template: reply.template.clone(),
        size: reply.size.clone(),
        vcpus: size.vcpus,
        memory_mib: size.memory_mib,
        branch_ms: millis(took),
    }
}

/// `list_checkpoints`
pub fn checkpoints(rows: &[WireCheckpoint]) -> ListCheckpointsResult {
    ListCheckpointsResult {
        checkpoints: rows
            .iter()
            .map(|row| CheckpointRow {
                checkpoint_id: row.id.clone(),
                name: non_empty(&row.name),
                source_sandbox_id: row.sandbox_id.clone(),
                template: row.template.clone(),
                created_at: row.created_at.clone(),
                bytes_on_disk: row.bytes_on_disk,
                in_use_by: row.in_use_by.clone(),
            })
            .collect(),
    }
}

/// `hibernate`, which took `took`.
pub fn hibernated(reply: &HibernateReply, took: Duration) -> HibernateResult {
    HibernateResult {
        sandbox_id: reply.id.clone(),
        hibernated_now: reply.hibernated_now,
        hibernated_at: rfc3339(SystemTime::now()),
        took_ms: millis(took),
        bytes_on_disk: reply.bytes_on_disk,
        deadline: non_empty(&reply.deadline),
    }
}

/// A row of `list_templates`. The node's info names no warm sessions and no build
/// time, so those stay empty; a template without a size of its own has none shown.
pub fn template_row(row: &WireTemplate) -> TemplateRow {
    let size = row.size.as_deref().and_then(size_of);
    TemplateRow {
        name: row.name.clone(),
        default: row.default,
        default_size: row.size.clone().filter(|size| !size.is_empty()),
        vcpus: size.map(|size| size.vcpus),
        memory_mib: size.map(|size| size.memory_mib),
        promoted: row.promoted,
        warm_sessions: Vec::new(),
        modified_at: None,
        error: row.error.clone().filter(|error| !error.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_template_row_reads_its_size_and_drops_empty_fields() {
        let row = template_row(&WireTemplate {
            name: "py".to_owned(),
            default: false,
            size: Some("2x1024".to_owned()),
            promoted: true,
            error: Some(String::new()),
        });
        assert_eq!(row.default_size.as_deref(), Some("2x1024"));
        assert_eq!((row.vcpus, row.memory_mib), (Some(2), Some(1024)));
        assert!(row.promoted && row.error.is_none() && row.warm_sessions.is_empty());
        let odd = template_row(&WireTemplate {
            name: "x".to_owned(),
            size: Some("not-a-size".to_owned()),
            error: Some("no rootfs".to_owned()),
            ..WireTemplate::default()
        });
        assert_eq!((odd.vcpus, odd.memory_mib), (None, None));
        assert_eq!(odd.error.as_deref(), Some("no rootfs"));
    }
}
