//! The sandboxes this session holds, by id, and what became of the ones it no
//! longer holds.
//!
//! A sandbox enters with [`Registry::insert`] and leaves exactly once: by
//! [`Registry::release`], by its TTL timer ([`Registry::expire`]) or by
//! [`Registry::shutdown`]. Whoever removes it from the map destroys it, so the
//! three can race without destroying anything twice. Removed ids leave a tombstone,
//! so a later call is told "released" or "expired" instead of only "unknown".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use crate::pool::launcher::LaunchedVm;
use crate::pool::Machine;
use crate::sandbox::{Deadline, Sandbox, SandboxId};
use crate::util::{join_all, lock};

/// Tombstones kept; the oldest are dropped past this.
const MAX_TOMBSTONES: usize = 1024;

/// Why an id is no longer live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// `release` destroyed it.
    Released,
    /// Its TTL ran out at this time.
    Expired(SystemTime),
    /// Handed to the fleet while hibernated: another node wakes it.
    Moved,
}

/// Why a lookup failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Never seen (or forgotten long ago).
    Unknown,
    /// Seen, and gone.
    Gone(Gone),
    /// The server is shutting down.
    Closed,
}

#[derive(Debug)]
struct State<V> {
    live: BTreeMap<SandboxId, Arc<Sandbox<V>>>,
    gone: HashMap<SandboxId, (u64, Gone)>,
    next_tombstone: u64,
    timers: HashMap<SandboxId, tokio::task::AbortHandle>,
    closed: bool,
}

impl<V> Default for State<V> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            gone: HashMap::new(),
            next_tombstone: 0,
            timers: HashMap::new(),
            closed: false,
        }
    }
}

impl<V> State<V> {
    fn bury(&mut self, id: SandboxId, why: Gone) {
        self.next_tombstone += 1;
        self.gone.insert(id, (self.next_tombstone, why));
        if self.gone.len() > MAX_TOMBSTONES {
            if let Some(oldest) = self
                .gone
                .iter()
                .min_by_key(|(_, (n, _))| *n)
                .map(|(id, _)| id.clone())
            {
                self.gone.remove(&oldest);
            }
        }
    }
}

/// The node's sandboxes. Generic over the VM only so that unit tests can hold
/// fake VMs; the server uses [`LaunchedVm`].
#[derive(Debug)]
pub struct Registry<V = LaunchedVm> {
    state: Mutex<State<V>>,
}

impl<V: Machine> Registry<V> {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
        })
    }

    /// Adds a sandbox and arms its TTL timer. Returns it back (destroyed) when the
    /// server is already shutting down.
    pub async fn insert(self: &Arc<Self>, sandbox: Sandbox<V>) -> Result<Arc<Sandbox<V>>, Lookup> {
        let sandbox = Arc::new(sandbox);
        {
            let mut state = lock(&self.state);
            if !state.closed {
                state.gone.remove(&sandbox.id);
                state.live.insert(sandbox.id.clone(), sandbox.clone());
                if let Some(deadline) = sandbox.deadline() {
                    self.arm(&mut state, &sandbox.id, deadline);
                }
                return Ok(sandbox);
            }
        }
        sandbox.destroy().await;
        Err(Lookup::Closed)
    }

    /// Starts (or restarts) `id`'s TTL timer for `deadline`.
    fn arm(self: &Arc<Self>, state: &mut State<V>, id: &SandboxId, deadline: Deadline) {
        let registry = Arc::downgrade(self);
        let timer_id = id.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(deadline.instant).await;
            expire(registry, timer_id).await;
        });
        if let Some(old) = state.timers.insert(id.clone(), timer.abort_handle()) {
            old.abort();
        }
    }

    /// Moves the deadline of the live sandbox `id` to `deadline` (later or sooner),
    /// re-arming its timer. The attached agent has none to move: `Ok(None)`.
    pub fn renew(
        self: &Arc<Self>,
        id: &str,
        deadline: Deadline,
    ) -> Result<Option<Arc<Sandbox<V>>>, Lookup> {
        let mut state = lock(&self.state);
        if state.closed {
            return Err(Lookup::Closed);
        }
        let id = SandboxId::new(id);
        let Some(sandbox) = state.live.get(&id).cloned() else {
            return Err(state
                .gone
                .get(&id)
                .map_or(Lookup::Unknown, |(_, why)| Lookup::Gone(*why)));
        };
        if sandbox.deadline().is_none() {
            return Ok(None);
        }
        sandbox.set_deadline(deadline);
        self.arm(&mut state, &id, deadline);
        Ok(Some(sandbox))
    }

    /// The live sandbox `id`.
    pub fn get(&self, id: &str) -> Result<Arc<Sandbox<V>>, Lookup> {
        let state = lock(&self.state);
        if state.closed {
            return Err(Lookup::Closed);
        }
        let id = SandboxId::new(id);
        if let Some(sandbox) = state.live.get(&id) {
            return Ok(sandbox.clone());
        }
        Err(state
            .gone
            .get(&id)
            .map_or(Lookup::Unknown, |(_, why)| Lookup::Gone(*why)))
    }

    /// Every live sandbox, by id.
    pub fn list(&self) -> Vec<Arc<Sandbox<V>>> {
        lock(&self.state).live.values().cloned().collect()
    }

    /// Live ids, for error messages.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.state)
            .live
            .keys()
            .map(|id| id.as_str().to_owned())
            .collect()
    }

    /// Removes `id` and destroys it; a second release finds it gone.
    pub async fn release(&self, id: &str) -> Result<Arc<Sandbox<V>>, Lookup> {
        let sandbox = self.remove(&SandboxId::new(id), Gone::Released)?;
        sandbox.destroy().await;
        Ok(sandbox)
    }

    /// Removes `id` without destroying it: its VM was handed elsewhere
    /// ([`crate::sandbox::Sandbox::hand_off`]).
    pub fn remove_moved(&self, id: &str) -> Result<Arc<Sandbox<V>>, Lookup> {
        self.remove(&SandboxId::new(id), Gone::Moved)
    }

    /// Destroys every sandbox and refuses new ones.
    pub async fn shutdown(&self) {
        let sandboxes = self.close();
        let count = sandboxes.len();
        join_all(sandboxes.into_iter().map(|sandbox| async move {
            sandbox.destroy().await;
        }))
        .await;
        tracing::info!(count, "every sandbox destroyed");
    }

    /// Lets every sandbox's VM outlive this process ([`Sandbox::leave`]) and
    /// refuses new ones: a node daemon's graceful stop.
    pub async fn leave(&self) {
        let sandboxes = self.close();
        let count = sandboxes.len();
        join_all(sandboxes.into_iter().map(|sandbox| async move {
            sandbox.leave().await;
        }))
        .await;
        tracing::info!(count, "every sandbox left for the next start");
    }

    /// Refuses new sandboxes, stops every deadline timer, and hands over the live
    /// sandboxes (the end of the registry, whatever becomes of its VMs).
    fn close(&self) -> Vec<Arc<Sandbox<V>>> {
        let mut state = lock(&self.state);
        state.closed = true;
        for (_, timer) in state.timers.drain() {
            timer.abort();
        }
        std::mem::take(&mut state.live).into_values().collect()
    }

    fn remove(&self, id: &SandboxId, why: Gone) -> Result<Arc<Sandbox<V>>, Lookup> {
        let mut state = lock(&self.state);
        if state.closed {
            return Err(Lookup::Closed);
        }
        let Some(sandbox) = state.live.remove(id) else {
            return Err(state
                .gone
                .get(id)
                .map_or(Lookup::Unknown, |(_, why)| Lookup::Gone(*why)));
        };
        if let Some(timer) = state.timers.remove(id) {
            // Not the timer task itself: it removed its own entry before calling.
            timer.abort();
        }
        state.bury(id.clone(), why);
        Ok(sandbox)
    }
}

/// The TTL timer's end: destroy the sandbox if it is still live.
async fn expire<V: Machine>(registry: Weak<Registry<V>>, id: SandboxId) {
    let Some(registry) = registry.upgrade() else {
        return;
    };
    {
        let mut state = lock(&registry.state);
        // A renew that raced this timer moved the deadline and armed a new one.
        let renewed = state.live.get(&id).and_then(|sandbox| sandbox.deadline());
        if renewed.is_some_and(|deadline| deadline.instant > tokio::time::Instant::now()) {
            return;
        }
        state.timers.remove(&id);
    }
    let expired_at = SystemTime::now();
    match registry.remove(&id, Gone::Expired(expired_at)) {
        Ok(sandbox) => {
            // A warning, so the client's log hears of it (see `crate::logging`).
            tracing::warn!(
                sandbox = %id,
                "the sandbox reached its deadline (TTL): destroying it and its files"
            );
            sandbox.destroy().await;
        }
        Err(_) => tracing::debug!(sandbox = %id, "ttl reached after release"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sandbox_vmm::client::ConnectOptions;

    use super::*;
    use crate::pool::fake::{default_spec, get, started_pool, until, FakeVm};
    use crate::pool::{Lease, Pool};
    use crate::sandbox::{Backing, Claim, Deadline};

    /// A sandbox over `lease` that expires `ttl` from now; its agent is never called.
    fn sandbox(id: &str, lease: Lease<FakeVm>, ttl: Duration) -> Sandbox<FakeVm> {
        Sandbox::new(
            SandboxId::new(id),
            Claim::for_test(Some(Deadline::after(ttl))),
            (
                "unix:///nonexistent".parse().unwrap(),
                ConnectOptions::default(),
                None,
            ),
            Backing::vm(lease),
        )
    }

    async fn claim(pool: &Pool<crate::pool::fake::FakeFactory>) -> Lease<FakeVm> {
        pool.claim(&default_spec()).await.unwrap().0
    }

    #[tokio::test(start_paused = true)]
    async fn a_sandbox_is_destroyed_at_its_ttl_and_its_slot_freed() {
        let (pool, counters) = started_pool(0, 1);
        let registry = Registry::new();
        let lease = claim(&pool).await;
        let ttl = Duration::from_secs(600);
        registry.insert(sandbox("sbx-1", lease, ttl)).await.unwrap();
        tokio::time::sleep(ttl - Duration::from_secs(1)).await;
        assert!(registry.get("sbx-1").is_ok(), "alive until its deadline");
        assert_eq!(pool.used(), 1);
        until("the TTL", || registry.get("sbx-1").is_err()).await;
        assert!(matches!(
            registry.get("sbx-1"),
            Err(Lookup::Gone(Gone::Expired(_)))
        ));
        until("the VM to stop", || pool.used() == 0).await;
        assert_eq!((get(&counters.destroyed), get(&counters.alive)), (1, 0));
        // The freed slot serves the next claim.
        let _next = claim(&pool).await;
    }

    #[tokio::test(start_paused = true)]
    async fn release_destroys_once_and_disarms_the_ttl() {
        let (pool, counters) = started_pool(0, 1);
        let registry = Registry::new();
        let lease = claim(&pool).await;
        registry
            .insert(sandbox("sbx-1", lease, Duration::from_secs(10)))
            .await
            .unwrap();
        registry.release("sbx-1").await.unwrap();
        assert_eq!((pool.used(), get(&counters.destroyed)), (0, 1));
        assert!(matches!(
            registry.release("sbx-1").await,
            Err(Lookup::Gone(Gone::Released))
        ));
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(matches!(
            registry.get("sbx-1"),
            Err(Lookup::Gone(Gone::Released))
        ));
        assert_eq!(get(&counters.destroyed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn renew_moves_the_deadline_and_the_old_timer_does_not_fire() {
        let (pool, counters) = started_pool(0, 1);
        let registry = Registry::new();
        let lease = claim(&pool).await;
        registry
            .insert(sandbox("sbx-1", lease, Duration::from_secs(10)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let renewed = registry
            .renew("sbx-1", Deadline::after(Duration::from_secs(60)))
            .unwrap();
        assert!(renewed.is_some());
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            registry.get("sbx-1").is_ok(),
            "alive past its first deadline"
        );
        assert_eq!(get(&counters.destroyed), 0);
        until("the renewed TTL", || registry.get("sbx-1").is_err()).await;
        assert!(matches!(
            registry.renew("sbx-1", Deadline::after(Duration::from_secs(60))),
            Err(Lookup::Gone(Gone::Expired(_)))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_destroys_every_sandbox_and_refuses_new_ones() {
        let (pool, counters) = started_pool(0, 2);
        let registry = Registry::new();
        for id in ["sbx-1", "sbx-2"] {
            let lease = claim(&pool).await;
            registry
                .insert(sandbox(id, lease, Duration::from_secs(3600)))
                .await
                .unwrap();
        }
        registry.shutdown().await;
        assert_eq!((pool.used(), get(&counters.destroyed)), (0, 2));
        let lease = claim(&pool).await;
        let refused = registry
            .insert(sandbox("sbx-3", lease, Duration::from_secs(3600)))
            .await;
        assert!(matches!(refused, Err(Lookup::Closed)));
        assert_eq!(pool.used(), 0, "a refused sandbox is destroyed");
    }
}
