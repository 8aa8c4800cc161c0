//! The sandstorm tools that make, capture, list and end sandboxes, over the engine
//! the default profile uses: batches of claims ([`Node::claim_batch`]), branches of
//! checkpoints ([`Node::branch_into`]), checkpoints ([`Node::checkpoint`]) and the
//! registry.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandbox_vmm::launcher::snapshot::manifest::check_name;
use sandbox_vmm::launcher::snapshot::{CheckpointInfo, Manifest};
use sandbox_vmm::launcher::{Size, TemplateRef};

use super::errors;
use super::params::{BranchSandboxParams, Guarded, KillSandboxParams, SpawnSandboxesParams};
use super::render::{unix_secs, BranchInfo, KillInfo, SnapshotInfo};
use crate::error::ToolError;
use sandbox_engine::config::DEFAULT_TTL_SECS;
use sandbox_engine::node::{sandbox_id_of, Node};
use sandbox_engine::sandbox::Sandbox;
use sandbox_engine::snapshot::ops::{bytes_on_disk, RamCapture};
use sandbox_engine::snapshot::SnapshotHost;
use sandbox_engine::util::millis;

/// The modes sandstorm's branch_sandbox takes: full writes the whole memory, diff
/// and live (the same here) what changed since the sandbox's last snapshot.
const BRANCH_MODES: [&str; 3] = ["full", "diff", "live"];

/// The live sandbox `id`, or an error in this profile's words.
pub fn sandbox(node: &Node, id: &str) -> Result<Arc<Sandbox>, ToolError> {
    node.registry()
        .get(id)
        .map_err(|why| errors::lookup(id, &why, &node.registry().ids()))
}

/// The live sandbox `id` when `token` is its token. The sandbox is looked up first
/// (ids are not secret: list_sandboxes shows them); the token is compared in
/// constant time.
pub fn authorized(node: &Node, id: &str, token: Option<&str>) -> Result<Arc<Sandbox>, ToolError> {
    let sandbox = sandbox(node, id)?;
    match token.filter(|token| !token.is_empty()) {
        None => Err(errors::token_missing(id)),
        Some(given) if sandbox.token.matches(given) => Ok(sandbox),
        Some(_) => {
            tracing::warn!(sandbox = %sandbox.id, "a call with a wrong sandbox_token was refused");
            Err(errors::token_wrong(id))
        }
    }
}

/// What a snapshot tag names: a template, or a checkpoint (by name or id).
enum Source {
    Template(Size),
    Checkpoint(Box<Manifest>),
}

/// `spawn_sandboxes`: `n` sandboxes from a template (a batch of claims: warm VMs
/// first, the rest restored side by side) or from a checkpoint (branched), all or
/// none, each living one hour.
pub async fn spawn(
    node: &Node,
    params: &SpawnSandboxesParams,
) -> Result<Vec<Arc<Sandbox>>, ToolError> {
    let host = snapshot_host(node)?;
    if params.per_child_netns {
        return Err(ToolError::new(
            "per_child_netns is not available: sandboxes here have no network at all, so \
             there is no namespace to give each. Call spawn_sandboxes without it.",
        ));
    }
    let tag = params.snapshot_tag.trim();
    let source = resolve(node, host, tag)?;
    let memory_mib = match &source {
        Source::Template(size) => size.memory_mib,
        Source::Checkpoint(manifest) => manifest.machine.size.memory_mib,
    };
    if let Some(limit) = params.memory_limit_mib {
        if limit < u64::from(memory_mib) {
            return Err(ToolError::new(format!(
                "memory_limit_mib {limit} is below the {memory_mib} MiB each sandbox of \
                 {tag:?} has (its VM's memory, a hard limit already). Omit memory_limit_mib, \
                 or pass at least {memory_mib}."
            )));
        }
    }
    let ttl = Duration::from_secs(DEFAULT_TTL_SECS);
    match source {
        Source::Template(_) => node
            .claim_batch(Some(tag), None, ttl, params.n)
            .await
            .map(|batch| {
                batch
                    .sandboxes
                    .into_iter()
                    .map(|(sandbox, _)| sandbox)
                    .collect()
            })
            .map_err(|error| errors::batch(&error, tag, params.n)),
        Source::Checkpoint(manifest) => {
            let max = host.max_fork_count().min(host.pool().max());
            let n = usize::try_from(params.n)
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ToolError::new(format!(
                        "n must be between 1 and {max} for a snapshot; got {}. Call \
                         spawn_sandboxes again with a smaller n.",
                        params.n
                    ))
                })?;
            let slots = host
                .pool()
                .slots(n)
                .await
                .map_err(|error| errors::claim(&error, tag, params.n))?;
            node.branch_into(&manifest, slots)
                .await
                .map_err(|error| ToolError::branch("spawn_sandboxes", &error))
        }
    }
}

/// Finds what `tag` names: a template first (a snapshot cannot take a template's
/// name, see [`branch`]), then a checkpoint.
fn resolve(node: &Node, host: &SnapshotHost, tag: &str) -> Result<Source, ToolError> {
    // The server's default, also when --template named it by path.
    if node
        .default_template()
        .is_some_and(|default| default.to_string() == tag)
    {
        return Ok(Source::Template(host.pool().default_size()));
    }
    if check_name(tag).is_ok() {
        if let Ok(template) = host.launcher().template(&TemplateRef::Name(tag.to_owned())) {
            return Ok(Source::Template(template.default_size));
        }
        if let Ok(info) = host.launcher().checkpoint_store().find(tag) {
            return Ok(Source::Checkpoint(Box::new(info.manifest)));
        }
    }
    let tags: Vec<String> = snapshots(node)?.into_iter().map(|row| row.tag).collect();
    Err(ToolError::new(format!(
        "Unknown snapshot_tag {tag:?}. This host has: {}. list_snapshots describes them; \
         branch_sandbox makes new ones from a running sandbox.",
        if tags.is_empty() {
            "nothing".to_owned()
        } else {
            tags.join(", ")
        }
    )))
}

/// `branch_sandbox`: a checkpoint of the running sandbox, named `tag`, kept on the
/// host after the session (like sandstorm's snapshots), for spawn_sandboxes.
///
/// The source's token is required (sandstorm takes none here): a snapshot holds the
/// sandbox's memory and files, and spawn_sandboxes of its tag hands out sandboxes
/// under new tokens, so a tokenless branch would give its state to anyone.
pub async fn branch(node: &Node, params: &BranchSandboxParams) -> Result<BranchInfo, ToolError> {
    let host = snapshot_host(node)?;
    let source = authorized(node, params.sandbox_id(), params.sandbox_token())?;
    if let Some(mode) = &params.mode {
        if !BRANCH_MODES.contains(&mode.as_str()) {
            return Err(ToolError::new(format!(
                "mode {mode:?} is not one of \"full\" (the whole memory), \"diff\" (what \
                 changed since the sandbox's last snapshot: the default) or \"live\" (the \
                 same as diff here); omit it."
            )));
        }
        if params.diff {
            return Err(ToolError::new(
                "Pass mode or diff, not both (diff: true is mode \"diff\").",
            ));
        }
    }
    if params.diff && params.measure_diff {
        return Err(ToolError::new("Pass diff or measure_diff, not both."));
    }
    let tag = match params.tag.as_deref().map(str::trim) {
        Some(tag) if !tag.is_empty() => tag.to_owned(),
        _ => format!("branch-{}-{}", source.id, unix_ms()),
    };
    free_tag(host, &tag)?;
    // sandstorm's diff mode is this host's incremental image; full writes it whole.
    let ram = match params.mode.as_deref() {
        Some("full") => RamCapture::Whole,
        _ => RamCapture::Incremental,
    };
    let taken = node
        .checkpoint_with(source.id.as_str(), Some(tag.clone()), ram)
        .await
        .map_err(|error| ToolError::checkpoint(source.id.as_str(), &error))?;
    Ok(BranchInfo {
        tag,
        snapshot_id: taken.manifest.id.clone(),
        source_sandbox_id: taken.sandbox.id.to_string(),
        pause_ms: millis(taken.pause),
        took_ms: millis(taken.took),
        created_at_unix: taken.manifest.created_at_unix_ms / 1000,
        bytes_on_disk: bytes_on_disk(&taken.manifest),
        status: "ready".to_owned(),
    })
}

/// Refuses a tag that is not a name, names a template (spawn_sandboxes would find
/// the template instead), or is taken.
fn free_tag(host: &SnapshotHost, tag: &str) -> Result<(), ToolError> {
    if check_name(tag).is_err() {
        return Err(ToolError::new(format!(
            "tag {tag:?} is not a snapshot tag: use 1 to 64 letters, digits, '-', '_' or \
             '.', like \"after-setup\"."
        )));
    }
    let reference = TemplateRef::Name(tag.to_owned());
    let taken = host.launcher().template(&reference).is_ok()
        || host.launcher().checkpoint_store().find(tag).is_ok();
    if taken {
        return Err(ToolError::new(format!(
            "tag {tag:?} is taken (list_snapshots shows the tags in use): pass another, or \
             omit it for a generated one."
        )));
    }
    Ok(())
}

/// `list_snapshots`: the templates, then the checkpoints (a fork's own excluded),
/// oldest first.
pub fn snapshots(node: &Node) -> Result<Vec<SnapshotInfo>, ToolError> {
    let host = snapshot_host(node)?;
    let warm = host.pool().status().warm;
    let mut rows: Vec<SnapshotInfo> = node
        .template_entries()
        .into_iter()
        .map(|entry| SnapshotInfo {
            warm: if entry.default { warm } else { 0 },
            tag: entry.name.clone(),
            kind: "template".to_owned(),
            created_at_unix: entry.modified.map(unix_secs),
            template: entry.name,
            vcpus: entry.size.map(|size| size.vcpus),
            memory_mib: entry.size.map(|size| size.memory_mib),
            source_sandbox_id: None,
            default: entry.default,
            error: entry.error,
        })
        .collect();
    let checkpoints = host.launcher().checkpoints().map_err(|error| {
        ToolError::new(format!(
            "Cannot list the snapshots: {}. Try again.",
            sandbox_vmm::error_chain(&error)
        ))
    })?;
    rows.extend(
        checkpoints
            .into_iter()
            .filter(|info| !info.manifest.ephemeral)
            .map(|info| snapshot_row(&info)),
    );
    Ok(rows)
}

fn snapshot_row(info: &CheckpointInfo) -> SnapshotInfo {
    let manifest = &info.manifest;
    SnapshotInfo {
        tag: manifest.name.clone().unwrap_or_else(|| manifest.id.clone()),
        kind: "snapshot".to_owned(),
        created_at_unix: Some(manifest.created_at_unix_ms / 1000),
        template: manifest.machine.template.clone(),
        vcpus: Some(manifest.machine.size.vcpus),
        memory_mib: Some(manifest.machine.size.memory_mib),
        source_sandbox_id: Some(sandbox_id_of(&manifest.source_vm).to_string()),
        default: false,
        warm: 0,
        error: None,
    }
}

/// `kill_sandbox`, with the sandbox's token (sandstorm takes none here): ending a
/// sandbox is its holder's call alone.
pub async fn kill(node: &Node, params: &KillSandboxParams) -> Result<KillInfo, ToolError> {
    let id = params.sandbox_id();
    authorized(node, id, params.sandbox_token())?;
    let sandbox = node
        .registry()
        .release(id)
        .await
        .map_err(|why| errors::lookup(id, &why, &node.registry().ids()))?;
    Ok(KillInfo {
        id: sandbox.id.to_string(),
        killed: true,
    })
}

fn snapshot_host(node: &Node) -> Result<&SnapshotHost, ToolError> {
    node.snapshots().map(Arc::as_ref).ok_or_else(|| {
        ToolError::new("This server is attached to one existing agent and cannot do this.")
    })
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Args, Config};

    #[tokio::test]
    async fn a_call_needs_the_sandboxs_own_token() {
        // An attach-mode node holds one sandbox with a token, and reaches no guest
        // here: the check happens before any call.
        let args =
            Args::try_parse_from(["sandbox-mcp", "--agent", "unix:///nonexistent/a.sock"]).unwrap();
        let node = Node::start(
            Config::from_args(args, |_| None)
                .unwrap()
                .mode()
                .unwrap()
                .clone(),
        )
        .await;
        let id = crate::config::ATTACHED_ID;
        let token = sandbox(&node, id).unwrap().token.reveal().to_owned();

        assert!(authorized(&node, id, Some(&token)).is_ok());
        let missing = authorized(&node, id, None).unwrap_err().message;
        assert!(
            missing.starts_with("sandbox_token is required"),
            "{missing}"
        );
        let empty = authorized(&node, id, Some("")).unwrap_err().message;
        assert_eq!(empty, missing, "an empty token is a missing one");
        let wrong = authorized(&node, id, Some(&token.replace(|c: char| c != '0', "0")))
            .unwrap_err()
            .message;
        assert!(
            wrong.starts_with("sandbox_token is not the token"),
            "{wrong}"
        );
        assert!(
            !wrong.contains(&token),
            "the refusal does not echo the token"
        );
        let unknown = authorized(&node, "sbx-nope", Some(&token))
            .unwrap_err()
            .message;
        assert!(unknown.starts_with("Unknown sandbox_id"), "{unknown}");
        node.shutdown().await;
    }
}
