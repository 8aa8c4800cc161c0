//! One claimed sandbox: its id, where its agent is, the VM behind it (none when
//! attached) and when it expires.
//!
//! Lifecycle of a VM's sandbox (one tokio mutex guards it, so a wake, a hibernation,
//! a fork's capture and a destroy never overlap):
//! - `Running`: its VM runs and holds a capacity slot.
//! - `Hibernated`: [`Sandbox::hibernate`] put the VM's state on disk and freed its
//!   memory and slot; the id, files and processes are kept.
//! - back to `Running` on the next call that needs the guest: [`Sandbox::client`] and
//!   [`Sandbox::running`] wake it first (a slot from the pool, a restore), so every
//!   tool wakes a hibernated sandbox without knowing about hibernation.
//! - `Destroyed` by [`Sandbox::destroy`] (release, TTL expiry, or server shutdown),
//!   from either state: the VM is stopped, or the image removed.
//!
//! An attached sandbox is only forgotten: the agent belongs to someone else.
//!
//! Hibernation itself is behind [`Hibernator`] (the launcher and the pool, in
//! `crate::snapshot`), so this module stays generic over the VM for unit tests.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};
use sandbox_vmm::launcher::Size;
use tokio::sync::{MappedMutexGuard, MutexGuard};
use tokio::time::Instant;

use crate::pool::launcher::LaunchedVm;
use crate::pool::{Lease, Machine};
use crate::token::SandboxToken;
use crate::util::millis;

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
    /// At `wall` (a recorded deadline); one in the past is now.
    pub fn at(wall: SystemTime) -> Self {
        let left = wall.duration_since(SystemTime::now()).unwrap_or_default();
        Self {
            instant: Instant::now() + left,
            wall,
        }
    }

    /// `ttl` from now.
    pub fn after(ttl: Duration) -> Self {
        Self {
            instant: Instant::now() + ttl,
            wall: SystemTime::now() + ttl,
        }
    }
}

/// A boxed future, for the object-safe [`Hibernator`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Puts a sandbox's VM to sleep and brings it back. The real one (the launcher's
/// owned hibernation, slots from the pool) is `crate::snapshot::SnapshotHost`.
pub trait Hibernator<V>: fmt::Debug + Send + Sync {
    /// Hibernates the VM of `lease` and frees its slot. On failure, the lease back
    /// (its VM running as before) unless the VM was lost.
    fn hibernate(&self, lease: Lease<V>) -> BoxFuture<'_, Result<Image, NotSlept<V>>>;

    /// Wakes `image` into a running VM holding a slot again; on failure the image is
    /// kept for another try.
    fn wake<'a>(&'a self, image: &'a Image) -> BoxFuture<'a, Result<Lease<V>, WakeError>>;

    /// Removes `image` (its sandbox is destroyed while asleep).
    fn discard(&self, image: Image) -> BoxFuture<'_, ()>;
}

/// A hibernated VM: what the image is and when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The VM's id, kept through the wake.
    pub vm_id: String,
    /// When it went to sleep.
    pub at: SystemTime,
    /// How long the hibernation took.
    pub took: Duration,
    /// Bytes the image occupies on disk.
    pub bytes_on_disk: u64,
}

/// A hibernation that did not happen.
#[derive(Debug)]
pub struct NotSlept<V> {
    /// Why.
    pub error: HibernateError,
    /// The VM, running as before, unless it was lost.
    pub lease: Option<Lease<V>>,
}

/// Why a sandbox's guest cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    /// Its agent could not be reached.
    #[error(transparent)]
    Agent(#[from] ClientError),
    /// It was hibernated and could not be woken; its image is kept.
    #[error("Cannot wake the hibernated sandbox")]
    Wake(#[source] WakeError),
    /// It was destroyed while the call waited for it.
    #[error("The sandbox was destroyed")]
    Destroyed,
    /// An attached agent has no VM.
    #[error("The attached agent has no VM of this server's")]
    Attached,
}

/// Why a hibernated VM did not wake.
#[derive(Debug, thiserror::Error)]
pub enum WakeError {
    /// No capacity slot could be had.
    #[error("No room to run it again")]
    Capacity(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The restore failed.
    #[error("Its VM could not be restored")]
    Restore(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Why a sandbox was not hibernated.
#[derive(Debug, thiserror::Error)]
pub enum HibernateError {
    /// An attached agent, or a sandbox of a server that cannot hibernate.
    #[error("This sandbox cannot be hibernated: {0}")]
    NotCapable(&'static str),
    /// It was destroyed before it could be hibernated.
    #[error("The sandbox was destroyed")]
    Destroyed,
    /// The launcher failed; `lost` when its VM did not survive the attempt.
    #[error("Cannot hibernate its VM")]
    Capture {
        /// The VM was stopped (its state could not be recorded).
        lost: bool,
        /// The cause.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why [`Sandbox::hand_off`] did not hand the sandbox off.
#[derive(Debug, thiserror::Error)]
pub enum HandOffError<E> {
    /// Only a hibernated sandbox moves.
    #[error("Only a hibernated sandbox can be handed off: {0}")]
    NotHibernated(&'static str),
    /// The sending failed; the sandbox stays hibernated here.
    #[error(transparent)]
    Send(E),
}

/// What [`Sandbox::hibernate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slept {
    /// It hibernated now.
    Now(Image),
    /// It was hibernated already.
    Already(Image),
}

/// What a sandbox runs on. Generic over the VM only so that unit tests can back a
/// sandbox with a fake VM; the server uses [`LaunchedVm`].
#[derive(Debug)]
pub enum Backing<V = LaunchedVm> {
    /// An agent this server does not own (attach mode).
    Attached,
    /// A VM this server booted, in its lifecycle state.
    Vm(Box<VmBacking<V>>),
}

/// A VM's state, and what can put it to sleep.
#[derive(Debug)]
pub struct VmBacking<V> {
    state: tokio::sync::Mutex<VmState<V>>,
    hibernator: Option<Arc<dyn Hibernator<V>>>,
}

/// Where a sandbox's VM is (see the module docs).
#[derive(Debug)]
enum VmState<V> {
    /// Running, with its capacity slot.
    Running(Lease<V>),
    /// On disk.
    Hibernated(Image),
    /// Gone.
    Destroyed,
}

impl<V: Machine> Backing<V> {
    /// The backing of a claimed VM that cannot hibernate.
    pub fn vm(lease: Lease<V>) -> Self {
        Self::Vm(Box::new(VmBacking {
            state: tokio::sync::Mutex::new(VmState::Running(lease)),
            hibernator: None,
        }))
    }

    /// The backing of a claimed VM that `hibernator` can put to sleep.
    pub fn hibernating(lease: Lease<V>, hibernator: Arc<dyn Hibernator<V>>) -> Self {
        Self::Vm(Box::new(VmBacking {
            state: tokio::sync::Mutex::new(VmState::Running(lease)),
            hibernator: Some(hibernator),
        }))
    }

    /// The backing of a VM found hibernated (a node's earlier life put it to
    /// sleep): `hibernator` wakes it on first use.
    pub fn asleep(image: Image, hibernator: Arc<dyn Hibernator<V>>) -> Self {
        Self::Vm(Box::new(VmBacking {
            state: tokio::sync::Mutex::new(VmState::Hibernated(image)),
            hibernator: Some(hibernator),
        }))
    }
}

/// What a sandbox descends from (where its VM came from is `crate::pool::Origin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lineage {
    /// Booted or restored from its template, or claimed warm.
    Template,
    /// A child of a fork of this sandbox.
    Fork(SandboxId),
    /// Started from a checkpoint.
    Checkpoint {
        /// Its id.
        id: String,
        /// Its name, if it has one.
        name: Option<String>,
    },
    /// The attached agent.
    Attached,
}

/// What a sandbox is doing, as a listing sees it without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its VM runs (or it is the attached agent).
    Running,
    /// Its VM's state is on disk; the next call that needs the guest wakes it.
    Hibernated,
    /// Being woken, captured (fork, checkpoint, promote) or hibernated right now.
    Busy,
    /// Destroyed, and about to leave the registry.
    Destroyed,
}

impl Status {
    /// The name listings use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Hibernated => "hibernated",
            Self::Busy => "busy",
            Self::Destroyed => "destroyed",
        }
    }
}

/// What a sandbox was claimed as: everything but its agent and its VM.
#[derive(Debug)]
pub struct Claim {
    /// The template it runs (`"attached"` in attach mode).
    pub template: String,
    /// vCPUs and memory (unknown when attached).
    pub size: Option<Size>,
    /// When it is destroyed; `None` for an attached agent.
    pub deadline: Option<Deadline>,
    /// Whether it came from the warm pool.
    pub warm: bool,
    /// How long the claim took.
    pub duration: Duration,
    /// What it descends from.
    pub lineage: Lineage,
    /// Its token.
    pub token: SandboxToken,
}

#[cfg(test)]
impl Claim {
    /// A claim of the `default` template for unit tests, expiring at `deadline`.
    pub(crate) fn for_test(deadline: Option<Deadline>) -> Self {
        Self {
            template: "default".to_owned(),
            size: None,
            deadline,
            warm: false,
            duration: Duration::ZERO,
            lineage: Lineage::Template,
            token: SandboxToken::generate().expect("no random bytes"),
        }
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
    /// When it is destroyed; `None` for an attached agent. Moved by `renew`.
    deadline: std::sync::Mutex<Option<Deadline>>,
    /// Whether the claim came from the warm pool.
    pub warm: bool,
    /// How long the claim took.
    pub claim_duration: Duration,
    /// What it descends from.
    pub lineage: Lineage,
    /// Its token: handed out once by the tools that make sandboxes under
    /// `--profile sandstorm`, and required back by those that reach the guest.
    pub token: SandboxToken,
    agent: Agent,
    backing: Backing<V>,
    /// Where its record lives (its VM's run folder) and who holds it; `None` for
    /// the attached agent and in unit tests.
    record: Option<(std::path::PathBuf, crate::record::Owner)>,
}

impl<V: Machine> Sandbox<V> {
    /// A sandbox over `backing`, reached at `url` (`client` is an open connection to
    /// reuse, if any).
    pub fn new(
        id: SandboxId,
        claim: Claim,
        agent: (AgentUrl, ConnectOptions, Option<Client>),
        backing: Backing<V>,
    ) -> Self {
        let (url, options, client) = agent;
        Self {
            id,
            template: claim.template,
            size: claim.size,
            claimed_at: SystemTime::now(),
            deadline: std::sync::Mutex::new(claim.deadline),
            warm: claim.warm,
            claim_duration: claim.duration,
            lineage: claim.lineage,
            token: claim.token,
            agent: Agent {
                url,
                options,
                client: tokio::sync::Mutex::new(client),
            },
            backing,
            record: None,
        }
    }

    /// Keeps this sandbox's record in `dir` (its VM's run folder), held by
    /// `owner`; [`Sandbox::persist`] writes it.
    pub fn with_record(mut self, dir: std::path::PathBuf, owner: crate::record::Owner) -> Self {
        self.record = Some((dir, owner));
        self
    }

    /// The claim time a record gave (an adopted sandbox keeps its first claim's).
    pub fn with_claimed_at(mut self, claimed_at: SystemTime) -> Self {
        self.claimed_at = claimed_at;
        self
    }

    /// What its record says now (`None` without a record or a deadline).
    pub fn record(&self) -> Option<crate::record::SandboxRecord> {
        use crate::record::{unix_ms, ClaimRecord, LineageRecord, SandboxRecord, RECORD_VERSION};
        let (_, owner) = self.record.as_ref()?;
        Some(SandboxRecord {
            version: RECORD_VERSION,
            owner: *owner,
            claim: Some(ClaimRecord {
                id: self.id.as_str().to_owned(),
                token: self.token.reveal().to_owned(),
                template: self.template.clone(),
                size: self.size?,
                claimed_at_unix_ms: unix_ms(self.claimed_at),
                deadline_unix_ms: unix_ms(self.deadline()?.wall),
                warm: self.warm,
                lineage: LineageRecord::of(&self.lineage)?,
            }),
        })
    }

    /// Writes its record (after a claim, a renew). A sandbox without one has
    /// nothing to write.
    pub fn persist(&self) -> Result<(), crate::record::RecordError> {
        match (&self.record, self.record()) {
            (Some((dir, _)), Some(record)) => crate::record::write(dir, &record),
            _ => Ok(()),
        }
    }

    /// When it is destroyed; `None` for an attached agent.
    pub fn deadline(&self) -> Option<Deadline> {
        *crate::util::lock(&self.deadline)
    }

    /// Moves its deadline (the registry re-arms the timer).
    pub(crate) fn set_deadline(&self, deadline: Deadline) {
        *crate::util::lock(&self.deadline) = Some(deadline);
    }

    /// Where its agent listens (a relay's or the VMM's socket in the run folder).
    pub fn agent_url(&self) -> &AgentUrl {
        &self.agent.url
    }

    /// The token its agent requires: the node's, per VM, never a client's.
    pub fn agent_token(&self) -> Option<&str> {
        self.agent.options.token.as_deref()
    }

    /// True for the attached agent.
    pub fn is_attached(&self) -> bool {
        matches!(self.backing, Backing::Attached)
    }

    /// A connection to the sandbox's agent, reconnecting if the last one dropped; a
    /// hibernated sandbox is woken first.
    pub async fn client(&self) -> Result<Client, Unreachable> {
        if let Backing::Vm(vm) = &self.backing {
            drop(self.running_vm(vm).await?);
        }
        Ok(self.agent.client().await?)
    }

    /// The running VM (woken first if it sleeps), held: until the guard is dropped,
    /// nothing else can hibernate, wake or destroy it (fork, checkpoint and promote
    /// hold it through their capture; calls that need the guest wait meanwhile).
    pub async fn running(&self) -> Result<MappedMutexGuard<'_, Lease<V>>, Unreachable> {
        match &self.backing {
            Backing::Attached => Err(Unreachable::Attached),
            Backing::Vm(vm) => self.running_vm(vm).await,
        }
    }

    async fn running_vm<'a>(
        &'a self,
        vm: &'a VmBacking<V>,
    ) -> Result<MappedMutexGuard<'a, Lease<V>>, Unreachable> {
        let mut state = vm.state.lock().await;
        if let VmState::Hibernated(image) = &*state {
            // Only a backing with a hibernator is ever hibernated.
            let Some(hibernator) = &vm.hibernator else {
                return Err(Unreachable::Destroyed);
            };
            let started = Instant::now();
            let lease = hibernator.wake(image).await.map_err(|error| {
                tracing::warn!(
                    sandbox = %self.id,
                    error = %sandbox_vmm::error_chain(&error),
                    "a hibernated sandbox did not wake"
                );
                Unreachable::Wake(error)
            })?;
            tracing::info!(sandbox = %self.id, wake_ms = millis(started.elapsed()), "woken");
            *state = VmState::Running(lease);
        }
        MutexGuard::try_map(state, |state| match state {
            VmState::Running(lease) => Some(lease),
            _ => None,
        })
        .map_err(|_| Unreachable::Destroyed)
    }

    /// Hibernates the VM: its state goes to disk, its memory and capacity slot are
    /// freed; the next [`Sandbox::client`] wakes it. A hibernated one is left as it
    /// is.
    pub async fn hibernate(&self) -> Result<Slept, HibernateError> {
        let Backing::Vm(vm) = &self.backing else {
            return Err(HibernateError::NotCapable(
                "it is the attached agent, which this server does not run",
            ));
        };
        let Some(hibernator) = &vm.hibernator else {
            return Err(HibernateError::NotCapable("its VM cannot be snapshotted"));
        };
        let mut state = vm.state.lock().await;
        match std::mem::replace(&mut *state, VmState::Destroyed) {
            VmState::Running(lease) => {
                // Its relay goes with QEMU: the next call connects anew.
                self.agent.forget().await;
                match hibernator.hibernate(lease).await {
                    Ok(image) => {
                        *state = VmState::Hibernated(image.clone());
                        Ok(Slept::Now(image))
                    }
                    Err(NotSlept { error, lease }) => {
                        if let Some(lease) = lease {
                            *state = VmState::Running(lease);
                        }
                        Err(error)
                    }
                }
            }
            VmState::Hibernated(image) => {
                *state = VmState::Hibernated(image.clone());
                Ok(Slept::Already(image))
            }
            VmState::Destroyed => Err(HibernateError::Destroyed),
        }
    }

    /// Hands the hibernated VM's image to `send` while nothing can wake it (the
    /// state lock is held throughout: calls that need the guest wait, then find it
    /// destroyed). When `send` succeeds the image is someone else's copy: this
    /// sandbox is destroyed here and its image removed. When it fails, the sandbox
    /// stays hibernated, as it was.
    pub async fn hand_off<T, E, F, Fut>(&self, send: F) -> Result<T, HandOffError<E>>
    where
        F: FnOnce(Image) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let Backing::Vm(vm) = &self.backing else {
            return Err(HandOffError::NotHibernated("it is the attached agent"));
        };
        let mut state = vm.state.lock().await;
        let image = match &*state {
            VmState::Hibernated(image) => image.clone(),
            VmState::Running(_) => return Err(HandOffError::NotHibernated("it is running")),
            VmState::Destroyed => return Err(HandOffError::NotHibernated("it was destroyed")),
        };
        let sent = send(image.clone()).await.map_err(HandOffError::Send)?;
        self.agent.forget().await;
        *state = VmState::Destroyed;
        if let Some(hibernator) = &vm.hibernator {
            hibernator.discard(image).await;
        }
        Ok(sent)
    }

    /// What it is doing now, without waiting for a wake or capture in progress.
    pub fn status(&self) -> Status {
        let Backing::Vm(vm) = &self.backing else {
            return Status::Running;
        };
        match vm.state.try_lock() {
            Err(_) => Status::Busy,
            Ok(state) => match &*state {
                VmState::Running(_) => Status::Running,
                VmState::Hibernated(_) => Status::Hibernated,
                VmState::Destroyed => Status::Destroyed,
            },
        }
    }

    /// True while the sandbox is hibernated.
    pub async fn is_hibernated(&self) -> bool {
        match &self.backing {
            Backing::Attached => false,
            Backing::Vm(vm) => matches!(*vm.state.lock().await, VmState::Hibernated(_)),
        }
    }

    /// Lets the VM outlive this process, running or hibernated, with its record,
    /// for a node's next start to re-adopt (a graceful stop of a node daemon); the
    /// sandbox is gone from this process. A VM that cannot outlive it (booted owned)
    /// is stopped instead.
    pub async fn leave(&self) {
        self.agent.forget().await;
        let Backing::Vm(vm) = &self.backing else {
            return;
        };
        let state = std::mem::replace(&mut *vm.state.lock().await, VmState::Destroyed);
        if let VmState::Running(lease) = state {
            lease.leave();
        }
    }

    /// Destroys the VM and then frees its slot, or removes its hibernated image (an
    /// attached agent is left running). Idempotent.
    pub async fn destroy(&self) {
        // Drop the connection first so nothing waits on a dying VM.
        self.agent.forget().await;
        let Backing::Vm(vm) = &self.backing else {
            return;
        };
        let state = std::mem::replace(&mut *vm.state.lock().await, VmState::Destroyed);
        match state {
            VmState::Running(lease) => lease.destroy().await,
            VmState::Hibernated(image) => {
                if let Some(hibernator) = &vm.hibernator {
                    hibernator.discard(image).await;
                }
            }
            VmState::Destroyed => {}
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
    /// Drops the kept connection.
    async fn forget(&self) {
        self.client.lock().await.take();
    }

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::pool::fake::{default_spec, get, started_pool, FakeFactory, FakeVm};
    use crate::pool::Pool;

    /// Hibernates by dropping the fake VM (its slot freed) and wakes by claiming a
    /// new one, counting both.
    #[derive(Debug)]
    struct FakeHibernator {
        pool: Arc<Pool<FakeFactory>>,
        wakes: AtomicUsize,
        discards: AtomicUsize,
    }

    impl Hibernator<FakeVm> for FakeHibernator {
        fn hibernate(
            &self,
            lease: Lease<FakeVm>,
        ) -> BoxFuture<'_, Result<Image, NotSlept<FakeVm>>> {
            Box::pin(async move {
                let vm_id = lease.vm().id().to_owned();
                drop(lease);
                Ok(Image {
                    vm_id,
                    at: SystemTime::now(),
                    took: Duration::ZERO,
                    bytes_on_disk: 0,
                })
            })
        }

        fn wake<'a>(
            &'a self,
            _image: &'a Image,
        ) -> BoxFuture<'a, Result<Lease<FakeVm>, WakeError>> {
            Box::pin(async move {
                self.wakes.fetch_add(1, Ordering::SeqCst);
                let (lease, _) = self
                    .pool
                    .claim(&default_spec())
                    .await
                    .map_err(|error| WakeError::Capacity(error.to_string().into()))?;
                Ok(lease)
            })
        }

        fn discard(&self, _image: Image) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                self.discards.fetch_add(1, Ordering::SeqCst);
            })
        }
    }

    async fn hibernating_sandbox() -> (Arc<Sandbox<FakeVm>>, Arc<FakeHibernator>) {
        let (pool, _counters) = started_pool(0, 1);
        let pool = Arc::new(pool);
        let hibernator = Arc::new(FakeHibernator {
            pool: pool.clone(),
            wakes: AtomicUsize::new(0),
            discards: AtomicUsize::new(0),
        });
        let (lease, _) = pool.claim(&default_spec()).await.unwrap();
        let sandbox = Sandbox::new(
            SandboxId::new("sbx-1"),
            Claim::for_test(None),
            (
                "unix:///nonexistent".parse().unwrap(),
                ConnectOptions::default(),
                None,
            ),
            Backing::hibernating(lease, hibernator.clone()),
        );
        (Arc::new(sandbox), hibernator)
    }

    #[tokio::test(start_paused = true)]
    async fn a_hibernated_sandbox_frees_its_slot_and_wakes_once_for_concurrent_callers() {
        let (sandbox, hibernator) = hibernating_sandbox().await;
        assert_eq!(hibernator.pool.used(), 1);
        assert!(matches!(sandbox.hibernate().await, Ok(Slept::Now(_))));
        assert!(sandbox.is_hibernated().await);
        assert_eq!(
            hibernator.pool.used(),
            0,
            "a sleeping sandbox holds no slot"
        );
        let (a, b) = tokio::join!(
            async {
                sandbox
                    .running()
                    .await
                    .map(|lease| lease.vm().id().to_owned())
            },
            async {
                sandbox
                    .running()
                    .await
                    .map(|lease| lease.vm().id().to_owned())
            },
        );
        assert_eq!(a.unwrap(), b.unwrap(), "both calls see the one woken VM");
        assert_eq!(get(&hibernator.wakes), 1);
        assert_eq!(hibernator.pool.used(), 1);
        assert!(!sandbox.is_hibernated().await);
    }

    #[tokio::test(start_paused = true)]
    async fn hibernating_twice_does_nothing_and_destroying_discards_the_image() {
        let (sandbox, hibernator) = hibernating_sandbox().await;
        let Ok(Slept::Now(first)) = sandbox.hibernate().await else {
            panic!("not hibernated");
        };
        assert!(matches!(sandbox.hibernate().await, Ok(Slept::Already(image)) if image == first));
        sandbox.destroy().await;
        assert_eq!(get(&hibernator.discards), 1);
        assert_eq!(get(&hibernator.wakes), 0, "destroying does not wake it");
        assert!(matches!(
            sandbox.running().await,
            Err(Unreachable::Destroyed)
        ));
        assert!(matches!(
            sandbox.hibernate().await,
            Err(HibernateError::Destroyed)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sandbox_without_a_hibernator_is_refused_with_why() {
        let (pool, _counters) = started_pool(0, 1);
        let (lease, _) = pool.claim(&default_spec()).await.unwrap();
        let sandbox = Sandbox::new(
            SandboxId::new("sbx-2"),
            Claim::for_test(None),
            (
                "unix:///nonexistent".parse().unwrap(),
                ConnectOptions::default(),
                None,
            ),
            Backing::vm(lease),
        );
        assert!(matches!(
            sandbox.hibernate().await,
            Err(HibernateError::NotCapable(_))
        ));
        assert!(sandbox.running().await.is_ok(), "still running");
    }
}
