//! The sandstorm tools on a node daemon (`--profile sandstorm` with `SANDSTORM_URL`,
//! where sandboxd plays sandstorm's controller): the same names and shapes as on
//! the embedded engine ([`super::ops`]), over the session's claims
//! ([`crate::backend::node::Session`]). A sandbox's `sandbox_token` is the token the
//! node issued for it.

use std::time::{SystemTime, UNIX_EPOCH};

use sandbox_vmm::launcher::Size;
use sandbox_vmm::node_api::wire::SandboxRow;

use super::errors;
use super::params::{BranchSandboxParams, Guarded, KillSandboxParams, SpawnSandboxesParams};
use super::render::{BranchInfo, KillInfo, SandboxInfo, SnapshotInfo, SpawnedSandbox};
use crate::backend::node::{Held, Session};
use crate::error::ToolError;

/// Unix seconds of an RFC 3339 time; 0 when it does not parse.
fn unix_of(text: &str) -> Option<u64> {
    humantime::parse_rfc3339(text)
        .ok()
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map(|since| since.as_secs())
}

fn info_of(
    id: &str,
    tag: &str,
    state: &str,
    claimed_at: Option<u64>,
    deadline: &str,
    size: &str,
) -> SandboxInfo {
    let size: Option<Size> = size.parse().ok();
    SandboxInfo {
        id: id.to_owned(),
        snapshot_tag: tag.to_owned(),
        state: state.to_owned(),
        created_at_unix: claimed_at.unwrap_or(0),
        expires_at_unix: unix_of(deadline),
        vcpus: size.map(|size| size.vcpus),
        memory_mib: size.map(|size| size.memory_mib),
    }
}

fn row_info(row: &SandboxRow) -> SandboxInfo {
    let tag = row
        .lineage
        .strip_prefix("checkpoint:")
        .unwrap_or(&row.template);
    info_of(
        &row.id,
        tag,
        &row.status,
        unix_of(&row.claimed_at),
        &row.deadline,
        &row.size,
    )
}

fn held_info(held: &Held, tag: &str) -> SpawnedSandbox {
    let claimed = held
        .claimed_at
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|since| since.as_secs());
    SpawnedSandbox {
        info: info_of(
            &held.id,
            tag,
            "running",
            claimed,
            &held.deadline,
            &held.size,
        ),
        token: held.token().to_owned(),
    }
}

/// The session's sandbox `id` when `token` is its token.
pub fn authorized(session: &Session, id: &str, token: Option<&str>) -> Result<Held, ToolError> {
    let held = session.sandbox(id).map_err(|_| unknown(session, id))?;
    match token.filter(|token| !token.is_empty()) {
        None => Err(errors::token_missing(id)),
        Some(given) if held.token_matches(given) => Ok(held),
        Some(_) => {
            tracing::warn!(sandbox = %id, "a call with a wrong sandbox_token was refused");
            Err(errors::token_wrong(id))
        }
    }
}

/// An id this session does not hold, in this profile's words.
fn unknown(session: &Session, id: &str) -> ToolError {
    match session.sandbox(id) {
        Ok(_) => ToolError::new(format!("sandbox_id {id:?} is live; try again.")),
        Err(error) => ToolError::new(
            error
                .message
                .replace("create_sandbox", "spawn_sandboxes")
                .replace("branch_checkpoint", "spawn_sandboxes with its tag"),
        ),
    }
}

/// `list_snapshots`: the node's templates, then its checkpoints, oldest first.
pub async fn snapshots(session: &Session) -> Result<Vec<SnapshotInfo>, ToolError> {
    let info = session.info("list_snapshots").await?;
    let warm = info.pool.as_ref().map_or(0, |pool| pool.warm);
    let mut rows: Vec<SnapshotInfo> = info
        .templates
        .iter()
        .map(|template| {
            let size: Option<Size> = template.size.as_deref().and_then(|size| size.parse().ok());
            SnapshotInfo {
                tag: template.name.clone(),
                kind: "template".to_owned(),
                created_at_unix: None,
                template: template.name.clone(),
                vcpus: size.map(|size| size.vcpus),
                memory_mib: size.map(|size| size.memory_mib),
                source_sandbox_id: None,
                default: template.default,
                warm: if template.default { warm } else { 0 },
                error: template.error.clone(),
            }
        })
        .collect();
    let mut checkpoints = session.checkpoint_rows("list_snapshots").await?;
    checkpoints.reverse();
    rows.extend(checkpoints.iter().map(|row| SnapshotInfo {
        tag: if row.name.is_empty() {
            row.id.clone()
        } else {
            row.name.clone()
        },
        kind: "snapshot".to_owned(),
        created_at_unix: unix_of(&row.created_at),
        template: row.template.clone(),
        vcpus: None,
        memory_mib: None,
        source_sandbox_id: Some(row.sandbox_id.clone()),
        default: false,
        warm: 0,
        error: None,
    }));
    Ok(rows)
}

/// `spawn_sandboxes`: `n` claims from a template, or from a checkpoint when the tag
/// names one; all or none (those made are released when one fails).
pub async fn spawn(
    session: &Session,
    params: &SpawnSandboxesParams,
) -> Result<Vec<SpawnedSandbox>, ToolError> {
    if params.per_child_netns {
        return Err(ToolError::new(
            "per_child_netns is not available: sandboxes here have no network at all, so \
             there is no namespace to give each. Call spawn_sandboxes without it.",
        ));
    }
    let tag = params.snapshot_tag.trim();
    let info = session.info("spawn_sandboxes").await?;
    let is_template = info.templates.iter().any(|template| template.name == tag);
    let checkpoint = if is_template {
        false
    } else {
        let rows = session.checkpoint_rows("spawn_sandboxes").await?;
        if !rows.iter().any(|row| row.id == tag || row.name == tag) {
            let tags: Vec<String> = snapshots(session)
                .await?
                .into_iter()
                .map(|row| row.tag)
                .collect();
            return Err(ToolError::new(format!(
                "Unknown snapshot_tag {tag:?}. The node has: {}. list_snapshots describes \
                 them; branch_sandbox makes new ones from a running sandbox.",
                if tags.is_empty() {
                    "nothing".to_owned()
                } else {
                    tags.join(", ")
                }
            )));
        }
        true
    };
    let max = info.capacity.max_sandboxes.max(1);
    let n = usize::try_from(params.n)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ToolError::new(format!(
                "n must be between 1 and {max} (the node's sandbox limit); got {}. Call \
                 spawn_sandboxes again with a smaller n.",
                params.n
            ))
        })?;
    let mut made = Vec::with_capacity(n);
    for _ in 0..n {
        let claimed = if checkpoint {
            session.claim_checkpoint(tag).await
        } else {
            session.claim(Some(tag)).await
        };
        match claimed {
            Ok(held) => made.push(held),
            Err(error) => {
                for held in &made {
                    let _ = session.release(&held.id).await;
                }
                return Err(ToolError::new(format!(
                    "{} None of the {n} sandboxes was kept.",
                    error
                        .message
                        .replace("create_sandbox", "spawn_sandboxes")
                        .replace("(release tool)", "(kill_sandbox)")
                )));
            }
        }
    }
    Ok(made.iter().map(|held| held_info(held, tag)).collect())
}

/// `branch_sandbox`: a named checkpoint of the running sandbox, kept on the node.
pub async fn branch(
    session: &Session,
    params: &BranchSandboxParams,
) -> Result<BranchInfo, ToolError> {
    // Reading a sandbox (a branch copies its memory and disk) takes its token.
    let source = authorized(session, params.sandbox_id(), params.sandbox_token())?;
    let tag = match params.tag.as_deref().map(str::trim) {
        Some(tag) if !tag.is_empty() => tag.to_owned(),
        _ => format!(
            "branch-{}-{}",
            source.id,
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis())
        ),
    };
    let reply = session.checkpoint_reply(&source.id, &tag).await?;
    Ok(BranchInfo {
        tag,
        snapshot_id: reply.checkpoint.id.clone(),
        source_sandbox_id: source.id.clone(),
        pause_ms: reply.pause_ms,
        took_ms: reply.took_ms,
        created_at_unix: unix_of(&reply.checkpoint.created_at).unwrap_or(0),
        bytes_on_disk: reply.checkpoint.bytes_on_disk,
        status: "ready".to_owned(),
    })
}

/// `list_sandboxes`: this session's.
pub async fn list(session: &Session) -> Result<Vec<SandboxInfo>, ToolError> {
    let listed = session.list_rows("list_sandboxes").await?;
    Ok(listed.iter().map(row_info).collect())
}

/// `get_sandbox`
pub async fn get(session: &Session, id: &str) -> Result<SandboxInfo, ToolError> {
    session.sandbox(id).map_err(|_| unknown(session, id))?;
    let listed = session.list_rows("get_sandbox").await?;
    listed
        .iter()
        .find(|row| row.id == id)
        .map(row_info)
        .ok_or_else(|| unknown(session, id))
}

/// `kill_sandbox`
pub async fn kill(session: &Session, params: &KillSandboxParams) -> Result<KillInfo, ToolError> {
    let id = params.sandbox_id();
    authorized(session, id, params.sandbox_token())?;
    session.release(id).await?;
    Ok(KillInfo {
        id: id.to_owned(),
        killed: true,
    })
}
