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
use sandbox_vmm::launcher::{Size, Vm};
use tokio::time::Instant;

use crate::pool::Slot;

/// How long a destroyed VM's QEMU gets between `SIGTERM` and `SIGKILL`. The guest is
/// being thrown away, so nothing inside it needs to shut down cleanly.
pub const VM_STOP_GRACE_MS: u64 = 500;

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

/// A booted VM and the capacity slot it occupies; dropping it kills the VM.
#[derive(Debug)]
pub struct OwnedVm {
    /// The VM.
    pub vm: Vm,
    /// Its share of `--max-sandboxes`, freed after the VM is gone.
    pub slot: Slot,
}

impl OwnedVm {
    /// Stops QEMU (`SIGTERM`, then `SIGKILL`), its vsock daemon and removes its run
    /// folder; then frees the slot.
    pub async fn destroy(self) {
        let Self { vm, slot } = self;
        let id = vm.id().clone();
        match vm.shutdown(Duration::from_millis(VM_STOP_GRACE_MS)).await {
            Ok(outcome) => tracing::info!(vm = %id, ?outcome, "vm destroyed"),
            Err(error) => tracing::warn!(vm = %id, %error, "vm stop reported an error"),
        }
        drop(slot);
    }
}

/// What a sandbox runs on.
#[derive(Debug)]
pub enum Backing {
    /// An agent this server does not own (attach mode).
    Attached,
    /// A VM this server booted; `None` once destroyed.
    Vm(Box<Mutex<Option<OwnedVm>>>),
}

/// A claimed sandbox.
#[derive(Debug)]
pub struct Sandbox {
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
    backing: Backing,
}

impl Sandbox {
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
        backing: Backing,
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

    /// Destroys the VM (an attached agent is left running). Idempotent.
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
