//! One claimed sandbox: its id, where its agent is, the VM behind it (none when
//! attached) and when it expires.
//!
//! Lifecycle: `Live` (in the registry, reachable by tools) → `Destroyed` by
//! [`Sandbox::destroy`] (release, TTL expiry, or server shutdown). An attached
//! sandbox is only forgotten: the agent belongs to someone else.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};
use sandbox_vmm::launcher::Size;
use tokio::time::Instant;

use crate::pool::launcher::LaunchedVm;
use crate::pool::{Lease, Machine};

/// A sandbox id as the tools see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    /// Wraps an id.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// When a sandbox is destroyed, on both clocks.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// For the timer.
    pub instant: Instant,
    /// For people.
    pub wall: SystemTime,
}

impl Deadline {
    /// `ttl` from now.
    pub fn after(ttl: Duration) -> Self {
        Self {
            instant: Instant::now() + ttl,
            wall: SystemTime::now() + ttl,
        }
    }
}

/// What a sandbox runs on. Generic over the VM only so that unit tests can back a
/// sandbox with a fake VM; the server uses [`LaunchedVm`].
#[derive(Debug)]
pub enum Backing<V = LaunchedVm> {
    /// An agent this server does not own (attach mode).
    Attached,
    /// A VM this server booted, with its capacity slot; `None` once destroyed.
    Vm(Box<Mutex<Option<Lease<V>>>>),
}

impl<V: Machine> Backing<V> {
    /// The backing of a claimed VM.
    pub fn vm(lease: Lease<V>) -> Self {
        Self::Vm(Box::new(Mutex::new(Some(lease))))
    }
}

/// A claimed sandbox.
#[derive(Debug)]
pub struct Sandbox<V = LaunchedVm> {
    /// Its id.
    pub id: SandboxId,
    /// The template it was booted from (`"attached"` in attach mode).
    pub template: String,
    /// vCPUs and memory (unknown when attached).
    pub size: Option<Size>,
    /// When it was claimed.
    pub claimed_at: SystemTime,
    /// When it is destroyed; `None` for an attached agent.
    pub deadline: Option<Deadline>,
    /// Whether the claim came from the warm pool.
    pub warm: bool,
    /// How long the claim took.
    pub claim_duration: Duration,
    agent: Agent,
    backing: Backing<V>,
}

impl<V: Machine> Sandbox<V> {
    /// A sandbox over `backing`, reached at `url` (`client` is an open connection to
    /// reuse, if any).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: SandboxId,
        template: String,
        size: Option<Size>,
        deadline: Option<Deadline>,
        warm: bool,
        claim_duration: Duration,
        agent: (AgentUrl, ConnectOptions, Option<Client>),
        backing: Backing<V>,
    ) -> Self {
        let (url, options, client) = agent;
        Self {
            id,
            template,
            size,
            claimed_at: SystemTime::now(),
            deadline,
            warm,
            claim_duration,
            agent: Agent {
                url,
                options,
                client: tokio::sync::Mutex::new(client),
            },
            backing,
        }
    }

    /// True for the attached agent.
    pub fn is_attached(&self) -> bool {
        matches!(self.backing, Backing::Attached)
    }

    /// A connection to the sandbox's agent, reconnecting if the last one dropped.
    pub async fn client(&self) -> Result<Client, ClientError> {
        self.agent.client().await
    }

    /// Destroys the VM and then frees its slot (an attached agent is left running).
    /// Idempotent.
    pub async fn destroy(&self) {
        let vm = match &self.backing {
            Backing::Attached => None,
            Backing::Vm(vm) => vm.lock().unwrap_or_else(|p| p.into_inner()).take(),
        };
        // Drop the connection first so nothing waits on a dying VM.
        self.agent.client.lock().await.take();
        if let Some(vm) = vm {
            vm.destroy().await;
        }
    }
}

/// Where a sandbox's agent is, and the connection to it.
#[derive(Debug)]
struct Agent {
    url: AgentUrl,
    options: ConnectOptions,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl Agent {
    async fn client(&self) -> Result<Client, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            if client.closed_reason().is_none() {
                return Ok(client.clone());
            }
            tracing::info!(url = %self.url, "agent connection lost; reconnecting");
        }
        let client = Client::connect(&self.url, &self.options).await?;
        *slot = Some(client.clone());
        Ok(client)
    }
}
