//! The operations of [`super::Backend`] on the engine in this process: the engine's
//! call, its typed error through [`crate::error`]'s hints, its result through the
//! `from_engine` renderers.

use std::sync::Arc;

use sandbox_engine::error::{BatchError, LookupError};
use sandbox_engine::image_build::BuildProgress;
use sandbox_engine::node::Node;
use sandbox_engine::pool::ClaimError;
use sandbox_engine::registry::Lookup;
use sandbox_engine::sandbox::Sandbox;

use super::Ended;
use crate::error::{Op, ToolError};
use crate::fleet::params::CreateSandboxesParams;
use crate::fleet::render::{
    CreateSandboxesResult, ListSandboxesResult, ListTemplatesResult, PingResult, SandboxRow,
    TemplateRow,
};
use crate::params::CreateSandboxParams;
use crate::progress::Progress;
use crate::render::{from_engine, CreateSandboxResult, NodeInfoResult, ReleaseResult};
use crate::snapshot::render::{
    from_engine as snapshots, BranchResult, CheckpointResult, DeleteCheckpointResult, ForkResult,
    HibernateResult, ListCheckpointsResult, PromoteResult,
};

/// The live sandbox `id`, or why not: an id of an ended session says so.
pub fn sandbox(node: &Node, ended: &Ended, id: &str) -> Result<Arc<Sandbox>, ToolError> {
    node.sandbox(id).map_err(|error| lookup(ended, &error))
}

/// A failed lookup in this profile's words.
pub fn lookup(ended: &Ended, error: &LookupError) -> ToolError {
    if error.why == Lookup::Unknown && ended.contains(&error.id) {
        ToolError::ended(&error.id, &error.live)
    } else {
        ToolError::unknown(error)
    }
}

pub async fn create(
    node: &Node,
    params: CreateSandboxParams,
    progress: &Progress,
) -> Result<CreateSandboxResult, ToolError> {
    // A claim that builds its template from a registry says what the build is doing.
    let reporter = progress.clone();
    let build = BuildProgress(Arc::new(move |line: &str| {
        reporter.set_status(format!("create_sandbox: {line}"));
    }));
    let claimed = node
        .create(params.claim_request(progress.is_on().then_some(build)))
        .await
        .map_err(|error| ToolError::create(&error))?;
    Ok(from_engine::created(&claimed))
}

pub async fn create_many(
    node: &Node,
    params: &CreateSandboxesParams,
    size: Option<sandbox_vmm::launcher::Size>,
    ttl_secs: u64,
) -> Result<CreateSandboxesResult, ToolError> {
    let template = params.template.as_deref();
    let batch = node
        .claim_batch(
            template,
            size,
            std::time::Duration::from_secs(ttl_secs),
            params.count,
        )
        .await
        .map_err(|error| batch_error(&error, template, params.count))?;
    Ok(CreateSandboxesResult::new(&batch, ttl_secs))
}

/// A failed batch in this profile's words.
fn batch_error(error: &BatchError, template: Option<&str>, count: u64) -> ToolError {
    match error {
        BatchError::Attached => ToolError::needs_launch_mode("create_sandboxes"),
        BatchError::Count { count, max } => ToolError::new(format!(
            "count must be between 1 and {max} (this server's sandbox limit); got {count}. \
             node_info shows how many more can be claimed now."
        )),
        BatchError::Spec(error) => ToolError::spec(error),
        BatchError::Insert(error) => ToolError::insert(error),
        BatchError::Draining => ToolError::create(&sandbox_engine::error::CreateError::Draining),
        BatchError::Claim(claim @ ClaimError::Short { .. }) => ToolError::no_room(
            "create_sandboxes",
            usize::try_from(count).unwrap_or(usize::MAX),
            claim,
        ),
        BatchError::Claim(claim) => ToolError::claim(template.unwrap_or("(default)"), claim),
    }
}

pub async fn ping(node: &Node, ended: &Ended, id: &str) -> Result<PingResult, ToolError> {
    let sandbox = sandbox(node, ended, id)?;
    let ping = node
        .ping(&sandbox)
        .await
        .map_err(|error| ToolError::unreachable(Op::Other, id, &error))?;
    Ok(PingResult::new(sandbox.id.as_str(), &ping))
}

pub fn list_templates(node: &Node) -> ListTemplatesResult {
    ListTemplatesResult {
        templates: node
            .template_entries()
            .iter()
            .map(TemplateRow::from)
            .collect(),
    }
}

pub async fn release(node: &Node, ended: &Ended, id: &str) -> Result<ReleaseResult, ToolError> {
    let sandbox = node
        .release(id)
        .await
        .map_err(|error| lookup(ended, &error))?;
    Ok(from_engine::released(&sandbox))
}

pub fn node_info(node: &Node) -> NodeInfoResult {
    from_engine::node_info(&node.status())
}

pub fn list_sandboxes(node: &Node) -> ListSandboxesResult {
    ListSandboxesResult {
        sandboxes: node
            .registry()
            .list()
            .iter()
            .map(|sandbox| SandboxRow::new(sandbox))
            .collect(),
        claimable: node.status().capacity.claimable,
    }
}

pub async fn fork(
    node: &Node,
    ended: &Ended,
    id: &str,
    count: u64,
) -> Result<ForkResult, ToolError> {
    sandbox(node, ended, id)?;
    let forked = node
        .fork(id, count)
        .await
        .map_err(|error| ToolError::fork(id, &error))?;
    Ok(snapshots::fork(&forked))
}

pub async fn checkpoint(
    node: &Node,
    ended: &Ended,
    id: &str,
    name: Option<String>,
) -> Result<CheckpointResult, ToolError> {
    sandbox(node, ended, id)?;
    let taken = node
        .checkpoint(id, name)
        .await
        .map_err(|error| ToolError::checkpoint(id, &error))?;
    Ok(snapshots::checkpoint(&taken))
}

pub async fn branch(node: &Node, key: &str) -> Result<BranchResult, ToolError> {
    let branched = node
        .branch(key, 1)
        .await
        .map_err(|error| ToolError::branch("branch_checkpoint", &error))?;
    snapshots::branch(&branched)
        .ok_or_else(|| ToolError::new("branch_checkpoint made no sandbox; try again."))
}

pub fn list_checkpoints(node: &Node) -> Result<ListCheckpointsResult, ToolError> {
    let entries = node
        .list_checkpoints()
        .map_err(|error| ToolError::list_checkpoints(&error))?;
    Ok(snapshots::checkpoints(&entries))
}

pub async fn delete_checkpoint(
    node: &Node,
    key: &str,
) -> Result<DeleteCheckpointResult, ToolError> {
    let manifest = node
        .delete_checkpoint(key)
        .await
        .map_err(|error| ToolError::delete_checkpoint(&error))?;
    Ok(snapshots::deleted(&manifest))
}

pub async fn hibernate(node: &Node, ended: &Ended, id: &str) -> Result<HibernateResult, ToolError> {
    sandbox(node, ended, id)?;
    let done = node
        .hibernate(id)
        .await
        .map_err(|error| ToolError::hibernate(id, &error))?;
    Ok(snapshots::hibernated(&done))
}

pub async fn promote(
    node: &Node,
    ended: &Ended,
    id: &str,
    template: &str,
) -> Result<PromoteResult, ToolError> {
    sandbox(node, ended, id)?;
    let done = node
        .promote(id, template)
        .await
        .map_err(|error| ToolError::promote(id, &error))?;
    Ok(snapshots::promoted(&done))
}

/// `expose_port`: a listener on this machine's loopback (see [`crate::ports`]).
pub async fn expose_port(
    node: &Arc<Node>,
    ended: &Ended,
    exposed: &crate::ports::Exposed,
    id: &str,
    port: u16,
    ttl_secs: u64,
) -> Result<crate::ports::tools::ExposePortResult, ToolError> {
    let sandbox = sandbox(node, ended, id)?;
    let ttl = (ttl_secs > 0).then(|| std::time::Duration::from_secs(ttl_secs));
    let opened = exposed
        .expose(node, &sandbox, port, ttl)
        .await
        .map_err(|error| ToolError::new(format!("{}.", sandbox_vmm::error_chain(&error))))?;
    Ok(crate::ports::tools::ExposePortResult {
        sandbox_id: sandbox.id.to_string(),
        port,
        url: opened.url,
        kind: "local".to_owned(),
        expires_at: opened
            .expires_at
            .map(|at| humantime::format_rfc3339_seconds(at).to_string())
            .unwrap_or_default(),
    })
}
