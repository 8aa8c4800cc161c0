//! The operations of [`super::Backend`] on a node daemon (`sandboxd`), through its
//! control plane ([`sandbox_vmm::node_api::NodeApi`], with the operator's token) and
//! its data plane (an agent URL per sandbox, with that sandbox's own token).
//!
//! The node holds every client's sandboxes; a [`Session`] holds the ones this MCP
//! session claimed ([`Held`], each with its token), answers only for those (another
//! client's ids are not this session's), and releases them all when the client
//! disconnects ([`Session::shutdown`]). The daemon's listings are filtered to them.
//! Results come back in the tools' own types ([`convert`]), failures through
//! [`errors`]; the fleet tools' operations are in [`fleet`].

pub mod convert;
pub mod errors;
pub mod fleet;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use sandbox_engine::config::DEFAULT_TTL_SECS;
use sandbox_engine::registry::{Gone, Lookup};
use sandbox_engine::util::lock;
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use sandbox_vmm::node_api::wire::{ClaimBody, ClaimReply};
use sandbox_vmm::node_api::{NodeApi, NodeApiError};

use super::Ended;
use crate::config::NodeConfig;
use crate::error::{Op, ToolError};
use crate::fleet::render::{ListSandboxesResult, SandboxRow};
use crate::params::{CreateSandboxParams, Net};
use crate::render::{CreateSandboxResult, NodeInfoResult, ReleaseResult};
use crate::snapshot::render::{
    BranchResult, CheckpointResult, DeleteCheckpointResult, ForkResult, HibernateResult,
    ListCheckpointsResult, PromoteResult,
};
use errors::{node_error, Call};

/// What a claim reports as its origin, for the tools' `claim_ref`.
const CLAIM_REF: &str = "sandbox-mcp";

/// A sandbox this session claimed on the node.
#[derive(Clone)]
pub struct Held {
    /// Its id on the node.
    pub id: String,
    /// Its template.
    pub template: String,
    /// Its size as the node names it.
    pub size: String,
    /// Its deadline as the node reported it (RFC 3339).
    pub deadline: String,
    /// When this session claimed it.
    pub claimed_at: SystemTime,
    token: String,
    url: AgentUrl,
    /// The control plane of the node that holds it (the claim's `owner_addr`: in a
    /// fleet, not always the node this session talks to). Shared: a handle is
    /// cloned per call.
    api: std::sync::Arc<NodeApi>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Held")
            .field("id", &self.id)
            .field("template", &self.template)
            .finish_non_exhaustive()
    }
}

impl Held {
    /// A connection to its agent through the node's data plane, with its own token
    /// (the node wakes it when it is hibernated).
    pub async fn client(&self, op: Op) -> Result<Client, ToolError> {
        self.connect()
            .await
            .map_err(|error| ToolError::agent(op, &self.id, &error))
    }

    /// [`Held::client`] with the client's own error, for tools with their own hints.
    pub async fn connect(&self) -> Result<Client, sandbox_vmm::client::ClientError> {
        let options = ConnectOptions {
            token: Some(self.token.clone()),
            ..ConnectOptions::default()
        };
        Client::connect(&self.url, &options).await
    }

    /// Whether `given` is its token, compared in constant time.
    pub fn token_matches(&self, given: &str) -> bool {
        let (a, b) = (self.token.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Its token (sandstorm's `sandbox_token`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The control plane of its node.
    pub fn api(&self) -> &NodeApi {
        &self.api
    }
}

/// One MCP session's use of a node.
#[derive(Debug)]
pub struct Session {
    api: NodeApi,
    template: Option<String>,
    held: Mutex<BTreeMap<String, Held>>,
    gone: Mutex<HashMap<String, Gone>>,
    ended: Ended,
    closed: std::sync::atomic::AtomicBool,
}

impl Session {
    /// A session on the node `config` names; nothing is asked of the node yet.
    pub fn new(config: &NodeConfig, ended: Ended) -> Result<Self, NodeApiError> {
        let api =
            NodeApi::new(&config.base, config.token.clone())?.with_timeout(config.http_timeout);
        Ok(Self {
            api,
            template: config.template.clone(),
            held: Mutex::default(),
            gone: Mutex::default(),
            ended,
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The node's base URL.
    pub fn base(&self) -> &str {
        self.api.base()
    }

    /// The ids this session holds.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.held).keys().cloned().collect()
    }

    /// The sandboxes this session holds, by id.
    pub fn held(&self) -> Vec<Held> {
        lock(&self.held).values().cloned().collect()
    }

    /// The sandbox `id` when this session holds it; otherwise what became of it.
    pub fn sandbox(&self, id: &str) -> Result<Held, ToolError> {
        if let Some(held) = lock(&self.held).get(id) {
            return Ok(held.clone());
        }
        let live = self.ids();
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ToolError::lookup(id, &Lookup::Closed, &live));
        }
        if let Some(why) = lock(&self.gone).get(id) {
            return Err(ToolError::lookup(id, &Lookup::Gone(*why), &live));
        }
        if self.ended.contains(id) {
            return Err(ToolError::ended(id, &live));
        }
        Err(ToolError::lookup(id, &Lookup::Unknown, &live))
    }

    /// Forgets `id` as `why`.
    fn bury(&self, id: &str, why: Gone) -> Option<Held> {
        let held = lock(&self.held).remove(id);
        lock(&self.gone).insert(id.to_owned(), why);
        held
    }

    /// The control plane of the node that made `reply` (this session's node when
    /// the reply names none, or names it in a form that does not parse).
    fn owner_api(&self, reply: &ClaimReply) -> NodeApi {
        self.api.at(&reply.owner_addr).unwrap_or_else(|error| {
            tracing::warn!(owner = %reply.owner_addr, %error, "unusable owner_addr: using the session's node");
            self.api.clone()
        })
    }

    /// Keeps a sandbox the node made for this session.
    fn keep(&self, reply: &ClaimReply) -> Held {
        let api = self.owner_api(reply);
        let held = Held {
            id: reply.id.clone(),
            template: reply.template.clone(),
            size: reply.size.clone(),
            deadline: reply.deadline.clone(),
            claimed_at: SystemTime::now(),
            token: reply.token.clone(),
            url: api.agent_url(&reply.id),
            api: std::sync::Arc::new(api),
        };
        lock(&self.held).insert(held.id.clone(), held.clone());
        held
    }

    /// A failure of `call`, in this server's words; a sandbox the node no longer
    /// has is forgotten.
    async fn fail(&self, call: Call<'_>, error: &NodeApiError) -> ToolError {
        // A sandbox's own calls went to the node that holds it.
        let base = match call {
            Call::Sandbox(_, id) => lock(&self.held)
                .get(id)
                .map(|held| held.api.base().to_owned()),
            _ => None,
        };
        if let (Call::Sandbox(_, id), Some("not_found" | "gone")) = (call, error.code()) {
            self.bury(id, Gone::Expired(SystemTime::now()));
        }
        let templates = match (call, error.code()) {
            (Call::Claim(Some(_)), Some("bad_request")) => match self.api.info().await {
                Ok(info) => info.templates.into_iter().map(|t| t.name).collect(),
                Err(_) => Vec::new(),
            },
            _ => Vec::new(),
        };
        node_error(
            base.as_deref().unwrap_or(self.api.base()),
            call,
            error,
            &templates,
        )
    }

    /// `create_sandbox`
    pub async fn create(
        &self,
        params: CreateSandboxParams,
    ) -> Result<CreateSandboxResult, ToolError> {
        let template = params.template.clone().or_else(|| self.template.clone());
        let body = ClaimBody {
            template: template.clone().unwrap_or_default(),
            net: match params.net {
                Net::None => String::new(),
                Net::Egress => "egress".to_owned(),
            },
            allow: params.allow,
            size: params
                .size
                .map(|size| size.as_str().to_owned())
                .unwrap_or_default(),
            ttl_seconds: params.ttl_seconds,
            claim_ref: CLAIM_REF.to_owned(),
            ..ClaimBody::default()
        };
        let reply = match self.api.claim(&body).await {
            Ok(reply) => reply,
            Err(error) => return Err(self.fail(Call::Claim(template.as_deref()), &error).await),
        };
        self.keep(&reply);
        let ttl = if params.ttl_seconds == 0 {
            DEFAULT_TTL_SECS
        } else {
            params.ttl_seconds
        };
        Ok(convert::created(&reply, ttl))
    }

    /// `release`
    pub async fn release(&self, id: &str) -> Result<ReleaseResult, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.release(id).await {
            Ok(_) => {
                self.bury(id, Gone::Released);
                Ok(ReleaseResult {
                    sandbox_id: id.to_owned(),
                    outcome: "the VM and everything in it was destroyed".to_owned(),
                })
            }
            Err(error) => Err(self.fail(Call::Sandbox("release", id), &error).await),
        }
    }

    /// `node_info`: the node's pool, templates and capacity; this session's claims.
    pub async fn node_info(&self) -> Result<NodeInfoResult, ToolError> {
        let info = match self.api.info().await {
            Ok(info) => info,
            Err(error) => return Err(self.fail(Call::Node("node_info"), &error).await),
        };
        Ok(convert::node_info(&info, &self.held()))
    }

    /// This session's sandboxes as the node lists them now; those the node no
    /// longer has (their deadline passed) are forgotten. `tool` names the caller.
    pub async fn list_rows(
        &self,
        tool: &str,
    ) -> Result<Vec<sandbox_vmm::node_api::wire::SandboxRow>, ToolError> {
        let mut rows = match self.api.sandboxes().await {
            Ok(rows) => rows,
            Err(error) => return Err(self.fail(Call::Node(tool), &error).await),
        };
        // In a fleet some are on other nodes: each of those is asked once. One that
        // does not answer leaves its sandboxes out of the listing, not forgotten.
        let mut others: BTreeMap<String, NodeApi> = BTreeMap::new();
        for held in self.held() {
            if held.api.base() != self.api.base() {
                others.insert(held.api.base().to_owned(), NodeApi::clone(&held.api));
            }
        }
        let mut unanswered = Vec::new();
        for (base, api) in others {
            match api.sandboxes().await {
                Ok(more) => rows.extend(more),
                Err(error) => {
                    tracing::warn!(node = %base, %error, "cannot list a peer's sandboxes");
                    unanswered.push(base);
                }
            }
        }
        // One node reached under two spellings answers twice: one row per id.
        let mut seen = std::collections::BTreeSet::new();
        rows.retain(|row| seen.insert(row.id.clone()));
        let mine = self.ids();
        for held in self.held() {
            let listed = rows.iter().any(|row| row.id == held.id);
            if !listed && !unanswered.iter().any(|base| base == held.api.base()) {
                self.bury(&held.id, Gone::Expired(SystemTime::now()));
            }
        }
        Ok(rows
            .into_iter()
            .filter(|row| mine.contains(&row.id))
            .collect())
    }

    /// `list_sandboxes`: this session's, as the node sees them now.
    pub async fn list_sandboxes(&self) -> Result<ListSandboxesResult, ToolError> {
        let sandboxes = self
            .list_rows("list_sandboxes")
            .await?
            .iter()
            .map(convert::sandbox_row)
            .collect();
        let claimable = match self.api.info().await {
            Ok(info) => info.capacity.claimable,
            Err(error) => return Err(self.fail(Call::Node("list_sandboxes"), &error).await),
        };
        Ok(ListSandboxesResult {
            sandboxes,
            claimable,
        })
    }

    /// `get_sandbox`
    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxRow, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.sandbox(id).await {
            Ok(row) => Ok(convert::sandbox_row(&row)),
            Err(error) => Err(self.fail(Call::Sandbox("get_sandbox", id), &error).await),
        }
    }

    /// `fork`: the children are this session's.
    pub async fn fork(&self, id: &str, count: u64) -> Result<ForkResult, ToolError> {
        let held = self.sandbox(id)?;
        let reply = match held.api.fork(id, count.max(1), 0).await {
            Ok(reply) => reply,
            Err(error) => return Err(self.fail(Call::Sandbox("fork", id), &error).await),
        };
        for child in &reply.children {
            self.keep(child);
        }
        Ok(convert::forked(&reply, DEFAULT_TTL_SECS))
    }

    /// `checkpoint`
    pub async fn checkpoint(
        &self,
        id: &str,
        name: Option<String>,
    ) -> Result<CheckpointResult, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.checkpoint(id, name.as_deref()).await {
            Ok(reply) => Ok(convert::checkpointed(&reply)),
            Err(error) => Err(self.fail(Call::Sandbox("checkpoint", id), &error).await),
        }
    }

    /// `branch_checkpoint`: a new sandbox of this session from checkpoint `key`.
    pub async fn branch(&self, key: &str) -> Result<BranchResult, ToolError> {
        let started = Instant::now();
        let reply = match self.api.claim_checkpoint(key, 0).await {
            Ok(reply) => reply,
            Err(error) => return Err(self.fail(Call::Branch(key), &error).await),
        };
        self.keep(&reply);
        Ok(convert::branched(
            &reply,
            key,
            DEFAULT_TTL_SECS,
            started.elapsed(),
        ))
    }

    /// `list_checkpoints`: the node's, whoever made them (checkpoints outlive
    /// sessions).
    pub async fn list_checkpoints(&self) -> Result<ListCheckpointsResult, ToolError> {
        match self.api.checkpoints().await {
            Ok(rows) => Ok(convert::checkpoints(&rows)),
            Err(error) => Err(self.fail(Call::Node("list_checkpoints"), &error).await),
        }
    }

    /// `delete_checkpoint`
    pub async fn delete_checkpoint(&self, key: &str) -> Result<DeleteCheckpointResult, ToolError> {
        match self.api.delete_checkpoint(key).await {
            Ok(done) => Ok(DeleteCheckpointResult {
                checkpoint_id: done.id,
                name: None,
                freed_bytes: done.freed_bytes,
            }),
            Err(error) => Err(self.fail(Call::DeleteCheckpoint(key), &error).await),
        }
    }

    /// `hibernate`
    pub async fn hibernate(&self, id: &str) -> Result<HibernateResult, ToolError> {
        let held = self.sandbox(id)?;
        let started = Instant::now();
        match held.api.hibernate(id).await {
            Ok(reply) => Ok(convert::hibernated(&reply, started.elapsed())),
            Err(error) => Err(self.fail(Call::Sandbox("hibernate", id), &error).await),
        }
    }

    /// `egress_log`: the last `tail` records of sandbox `id`'s egress, and the node's
    /// allowlist.
    pub async fn egress_log(
        &self,
        id: &str,
        tail: usize,
    ) -> Result<sandbox_vmm::node_api::wire::EgressLogReply, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.egress_log(id, tail).await {
            Ok(reply) => Ok(reply),
            Err(error) => Err(self.fail(Call::Sandbox("egress_log", id), &error).await),
        }
    }

    /// `expose_port`: the node's preview URL for `port` of sandbox `id`.
    pub async fn expose_port(
        &self,
        id: &str,
        port: u16,
        ttl_secs: u64,
    ) -> Result<crate::ports::tools::ExposePortResult, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.preview(id, port, ttl_secs).await {
            Ok(reply) => Ok(crate::ports::tools::ExposePortResult {
                sandbox_id: id.to_owned(),
                port: reply.port,
                url: reply.url,
                kind: "preview".to_owned(),
                expires_at: reply.expires_at,
            }),
            Err(error) => Err(self.fail(Call::Sandbox("expose_port", id), &error).await),
        }
    }

    /// `promote`
    pub async fn promote(&self, id: &str, template: &str) -> Result<PromoteResult, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.promote(id, template).await {
            Ok(reply) => Ok(PromoteResult {
                template: reply.key.template,
                sandbox_id: id.to_owned(),
                replaced: reply.replaced,
                pause_ms: reply.pause_ms,
                took_ms: reply.took_ms,
            }),
            Err(error) => Err(self.fail(Call::Sandbox("promote", id), &error).await),
        }
    }

    /// The node's template names (for hints and sandstorm's list_snapshots).
    pub async fn info(
        &self,
        tool: &str,
    ) -> Result<sandbox_vmm::node_api::wire::InfoReply, ToolError> {
        match self.api.info().await {
            Ok(info) => Ok(info),
            Err(error) => Err(self.fail(Call::Node(tool), &error).await),
        }
    }

    /// Claims one sandbox from `template` (`None`: the node's default) for sandstorm's
    /// spawn_sandboxes.
    pub async fn claim(&self, template: Option<&str>) -> Result<Held, ToolError> {
        let body = ClaimBody {
            template: template.unwrap_or_default().to_owned(),
            claim_ref: CLAIM_REF.to_owned(),
            ..ClaimBody::default()
        };
        match self.api.claim(&body).await {
            Ok(reply) => Ok(self.keep(&reply)),
            Err(error) => Err(self.fail(Call::Claim(template), &error).await),
        }
    }

    /// Claims one sandbox from checkpoint `key`, for sandstorm's spawn_sandboxes.
    pub async fn claim_checkpoint(&self, key: &str) -> Result<Held, ToolError> {
        match self.api.claim_checkpoint(key, 0).await {
            Ok(reply) => Ok(self.keep(&reply)),
            Err(error) => Err(self.fail(Call::Branch(key), &error).await),
        }
    }

    /// The node's checkpoints, for sandstorm's list_snapshots.
    pub async fn checkpoint_rows(
        &self,
        tool: &str,
    ) -> Result<Vec<sandbox_vmm::node_api::wire::CheckpointRow>, ToolError> {
        match self.api.checkpoints().await {
            Ok(rows) => Ok(rows),
            Err(error) => Err(self.fail(Call::Node(tool), &error).await),
        }
    }

    /// The checkpoint of sandbox `id` named `name`, for sandstorm's branch_sandbox.
    pub async fn checkpoint_reply(
        &self,
        id: &str,
        name: &str,
    ) -> Result<sandbox_vmm::node_api::wire::CheckpointReply, ToolError> {
        let held = self.sandbox(id)?;
        match held.api.checkpoint(id, Some(name)).await {
            Ok(reply) => Ok(reply),
            Err(error) => Err(self.fail(Call::Sandbox("branch_sandbox", id), &error).await),
        }
    }

    /// Ends the session: releases every sandbox it holds on the node (checkpoints
    /// stay) and records their ids as an ended session's. Later calls are refused.
    pub async fn shutdown(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let held: Vec<Held> = std::mem::take(&mut *lock(&self.held))
            .into_values()
            .collect();
        let ids: Vec<String> = held.iter().map(|held| held.id.clone()).collect();
        self.ended.record(&ids);
        let releases = held.iter().map(|held| {
            let (api, id) = (std::sync::Arc::clone(&held.api), held.id.clone());
            async move {
                if let Err(error) = api.release(&id).await {
                    tracing::warn!(sandbox = %id, %error, "cannot release the session's sandbox on the node");
                }
            }
        });
        sandbox_engine::util::join_all(releases).await;
        if !held.is_empty() {
            tracing::info!(count = held.len(), node = %self.api.base(), "released the session's sandboxes");
        }
    }
}
