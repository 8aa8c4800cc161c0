//! The seam between the tools and where sandboxes live: [`Backend`] is the embedded
//! engine (`sandbox_engine::Node` in this process, the default: one machine needs
//! no daemon) or a node daemon (`sandboxd`) driven over its REST control plane and
//! agent data plane. The tools are written once against it.
//!
//! Each operation answers with the tool's own result type (the renderers' input:
//! [`crate::render`], [`crate::snapshot::render`], [`crate::fleet::render`]) or a
//! [`ToolError`] that says what to do next: the embedded side maps the engine's
//! typed errors ([`crate::error`]), the node side the daemon's typed JSON
//! `{"error", "code"}` to the same hints ([`node::errors`]).
//!
//! What a session holds is the session's own, in both: the embedded engine's
//! registry is this process's; on a node, [`node::Session`] keeps the claims this
//! session made (ids and their tokens), lists only those, and releases them when the
//! client disconnects ([`Backend::shutdown`]). Either way the ended session's ids
//! are written to [`ended::Ended`], so that a later session handed one says so
//! instead of "Unknown sandbox_id".
//!
//! # Layout
//! - this file: [`Backend`], [`Handle`] (one sandbox, enough to reach its agent).
//! - [`embedded`]: the operations on the engine.
//! - [`node`]: the operations on a node daemon, its session, its error mapping.
//! - [`ended`]: the record of ended sessions' ids.

pub mod embedded;
pub mod ended;
pub mod node;

use std::sync::Arc;

use sandbox_engine::node::Node;
use sandbox_engine::sandbox::Sandbox;

use crate::error::{Op, ToolError};
use crate::fleet::params::CreateSandboxesParams;
use crate::fleet::render::{
    CreateSandboxesResult, ListSandboxesResult, ListTemplatesResult, PingResult, SandboxRow,
};
use crate::params::CreateSandboxParams;
use crate::render::{CreateSandboxResult, NodeInfoResult, ReleaseResult};
use crate::snapshot::render::{
    BranchResult, CheckpointResult, DeleteCheckpointResult, ForkResult, HibernateResult,
    ListCheckpointsResult, PromoteResult,
};
pub use ended::Ended;

/// Where sandboxes live, and the record of ended sessions.
#[derive(Debug, Clone)]
pub struct Backend {
    kind: Kind,
    ended: Ended,
    /// The embedded engine's `expose_port` listeners.
    exposed: Arc<crate::ports::Exposed>,
}

#[derive(Debug, Clone)]
enum Kind {
    /// The engine in this process.
    Embedded(Arc<Node>),
    /// A node daemon.
    Node(Arc<node::Session>),
}

/// One sandbox of this session: enough to name it and reach its agent.
#[derive(Debug, Clone)]
pub enum Handle {
    /// A sandbox of the embedded engine.
    Embedded(Arc<Sandbox>),
    /// A sandbox on a node.
    Node(node::Held),
}

impl Handle {
    /// Its id.
    pub fn id(&self) -> &str {
        match self {
            Self::Embedded(sandbox) => sandbox.id.as_str(),
            Self::Node(held) => &held.id,
        }
    }

    /// Its template's name.
    pub fn template(&self) -> &str {
        match self {
            Self::Embedded(sandbox) => &sandbox.template,
            Self::Node(held) => &held.template,
        }
    }

    /// A connection to its agent (waking it when hibernated), or an error saying how
    /// to recover; `op` names the tool for the hint.
    pub async fn client(&self, op: Op) -> Result<sandbox_vmm::Client, ToolError> {
        match self {
            Self::Embedded(sandbox) => sandbox
                .client()
                .await
                .map_err(|error| ToolError::unreachable(op, sandbox.id.as_str(), &error)),
            Self::Node(held) => held.client(op).await,
        }
    }
}

impl Backend {
    /// The engine in this process; `ended` records the session's ids when it ends.
    pub fn embedded(node: Arc<Node>, ended: Ended) -> Self {
        Self {
            kind: Kind::Embedded(node),
            ended,
            exposed: Arc::default(),
        }
    }

    /// A session on a node daemon; its ids go to `ended` when it ends.
    pub fn node(session: node::Session, ended: Ended) -> Self {
        Self {
            kind: Kind::Node(Arc::new(session)),
            ended,
            exposed: Arc::default(),
        }
    }

    /// The node session, for the tools that speak to a node in their own way
    /// (sandstorm's); `None` for the embedded engine.
    pub fn node_session(&self) -> Option<&Arc<node::Session>> {
        match &self.kind {
            Kind::Node(session) => Some(session),
            Kind::Embedded(_) => None,
        }
    }

    /// Whether the snapshot tools (and the fleet tools that claim) are offered: not
    /// for an attached agent, which cannot be snapshotted and is the only sandbox.
    pub fn snapshots(&self) -> bool {
        match &self.kind {
            Kind::Embedded(node) => node.snapshots().is_some(),
            Kind::Node(_) => true,
        }
    }

    /// The embedded engine, for the tools that only it offers; `tool` names the one
    /// asking, for the refusal elsewhere.
    pub fn engine(&self, tool: &str) -> Result<&Arc<Node>, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => Ok(node),
            Kind::Node(session) => Err(ToolError::new(format!(
                "{tool} is not available through a node daemon ({}): it needs the sandboxes \
                 in this process. The user can start sandbox-mcp without --addr and a token, \
                 on the machine that runs them, to use it.",
                session.base()
            ))),
        }
    }

    /// The record of ended sessions.
    pub fn ended(&self) -> &Ended {
        &self.ended
    }

    /// The sandbox `id` of this session.
    pub async fn sandbox(&self, id: &str) -> Result<Handle, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::sandbox(node, &self.ended, id).map(Handle::Embedded),
            Kind::Node(session) => session.sandbox(id).map(Handle::Node),
        }
    }

    /// `create_sandbox`
    pub async fn create(
        &self,
        params: CreateSandboxParams,
        progress: &crate::progress::Progress,
    ) -> Result<CreateSandboxResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::create(node, params, progress).await,
            Kind::Node(session) => session.create(params).await,
        }
    }

    /// `create_sandboxes`: `params.count` sandboxes of `size` living `ttl_secs`, all
    /// or none (the caller has checked both).
    pub async fn create_many(
        &self,
        params: &CreateSandboxesParams,
        size: Option<sandbox_vmm::launcher::Size>,
        ttl_secs: u64,
    ) -> Result<CreateSandboxesResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::create_many(node, params, size, ttl_secs).await,
            Kind::Node(session) => {
                let spec = node::fleet::BatchSpec {
                    template: params.template.clone(),
                    size: size.map(|size| size.to_string()),
                    ttl_secs,
                };
                session.create_many(spec, params.count).await
            }
        }
    }

    /// `ping_sandbox`
    pub async fn ping(&self, id: &str) -> Result<PingResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::ping(node, &self.ended, id).await,
            Kind::Node(session) => session.ping(id).await,
        }
    }

    /// `list_templates`
    pub async fn list_templates(&self) -> Result<ListTemplatesResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => Ok(embedded::list_templates(node)),
            Kind::Node(session) => session.list_templates().await,
        }
    }

    /// `release`
    pub async fn release(&self, id: &str) -> Result<ReleaseResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::release(node, &self.ended, id).await,
            Kind::Node(session) => session.release(id).await,
        }
    }

    /// `node_info`
    pub async fn node_info(&self) -> Result<NodeInfoResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => Ok(embedded::node_info(node)),
            Kind::Node(session) => session.node_info().await,
        }
    }

    /// `list_sandboxes`: this session's sandboxes only.
    pub async fn list_sandboxes(&self) -> Result<ListSandboxesResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => Ok(embedded::list_sandboxes(node)),
            Kind::Node(session) => session.list_sandboxes().await,
        }
    }

    /// `get_sandbox`
    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxRow, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => {
                embedded::sandbox(node, &self.ended, id).map(|sandbox| SandboxRow::new(&sandbox))
            }
            Kind::Node(session) => session.get_sandbox(id).await,
        }
    }

    /// `fork`
    pub async fn fork(&self, id: &str, count: u64) -> Result<ForkResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::fork(node, &self.ended, id, count).await,
            Kind::Node(session) => session.fork(id, count).await,
        }
    }

    /// `checkpoint`
    pub async fn checkpoint(
        &self,
        id: &str,
        name: Option<String>,
    ) -> Result<CheckpointResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::checkpoint(node, &self.ended, id, name).await,
            Kind::Node(session) => session.checkpoint(id, name).await,
        }
    }

    /// `branch_checkpoint`: one sandbox from checkpoint `key` (an id or a name).
    pub async fn branch(&self, key: &str) -> Result<BranchResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::branch(node, key).await,
            Kind::Node(session) => session.branch(key).await,
        }
    }

    /// `list_checkpoints`
    pub async fn list_checkpoints(&self) -> Result<ListCheckpointsResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::list_checkpoints(node),
            Kind::Node(session) => session.list_checkpoints().await,
        }
    }

    /// `delete_checkpoint`
    pub async fn delete_checkpoint(&self, key: &str) -> Result<DeleteCheckpointResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::delete_checkpoint(node, key).await,
            Kind::Node(session) => session.delete_checkpoint(key).await,
        }
    }

    /// `hibernate`
    pub async fn hibernate(&self, id: &str) -> Result<HibernateResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::hibernate(node, &self.ended, id).await,
            Kind::Node(session) => session.hibernate(id).await,
        }
    }

    /// `promote`
    pub async fn promote(&self, id: &str, template: &str) -> Result<PromoteResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => embedded::promote(node, &self.ended, id, template).await,
            Kind::Node(session) => session.promote(id, template).await,
        }
    }

    /// `expose_port`: a node's preview URL, or a local listener (see [`crate::ports`]).
    pub async fn expose_port(
        &self,
        id: &str,
        port: u16,
        ttl_secs: u64,
    ) -> Result<crate::ports::tools::ExposePortResult, ToolError> {
        match &self.kind {
            Kind::Embedded(node) => {
                embedded::expose_port(node, &self.ended, &self.exposed, id, port, ttl_secs).await
            }
            Kind::Node(session) => session.expose_port(id, port, ttl_secs).await,
        }
    }

    /// The templates that start a Python session at boot, for `eval_code`'s hint.
    pub async fn python_templates(&self) -> Vec<String> {
        match &self.kind {
            Kind::Embedded(node) => crate::eval::python_templates(&node.template_entries()),
            // The node does not say which templates start Python sessions.
            Kind::Node(_) => Vec::new(),
        }
    }

    /// Ends the session: every sandbox it holds is destroyed (warm VMs too, for the
    /// embedded engine) and its ids recorded as an ended session's.
    pub async fn shutdown(&self) {
        match &self.kind {
            Kind::Embedded(node) => {
                // The file is written after the VMs are stopped: nothing may delay
                // the stop of a warm pool whose boot is in flight.
                let ids = node.registry().ids();
                node.shutdown().await;
                self.ended.record(&ids);
            }
            Kind::Node(session) => session.shutdown().await,
        }
    }
}
