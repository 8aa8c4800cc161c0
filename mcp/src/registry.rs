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

use crate::pool::{futures_join_all, lock};
use crate::sandbox::{Sandbox, SandboxId};

/// Tombstones kept; the oldest are dropped past this.
const MAX_TOMBSTONES: usize = 1024;

/// Why an id is no longer live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// `release` destroyed it.
    Released,
    /// Its TTL ran out at this time.
    Expired(SystemTime),
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

#[derive(Debug, Default)]
struct State {
    live: BTreeMap<SandboxId, Arc<Sandbox>>,
    gone: HashMap<SandboxId, (u64, Gone)>,
    next_tombstone: u64,
    timers: HashMap<SandboxId, tokio::task::AbortHandle>,
    closed: bool,
}

impl State {
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

/// The session's sandboxes.
#[derive(Debug, Default)]
pub struct Registry {
    state: Mutex<State>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds a sandbox and arms its TTL timer. Returns it back (destroyed) when the
    /// server is already shutting down.
    pub async fn insert(self: &Arc<Self>, sandbox: Sandbox) -> Result<Arc<Sandbox>, Lookup> {
        let sandbox = Arc::new(sandbox);
        {
            let mut state = lock(&self.state);
            if !state.closed {
                state.gone.remove(&sandbox.id);
                state.live.insert(sandbox.id.clone(), sandbox.clone());
                if let Some(deadline) = sandbox.deadline {
                    let registry = Arc::downgrade(self);
                    let id = sandbox.id.clone();
                    let timer = tokio::spawn(async move {
                        tokio::time::sleep_until(deadline.instant).await;
                        expire(registry, id).await;
                    });
                    state
                        .timers
                        .insert(sandbox.id.clone(), timer.abort_handle());
                }
                return Ok(sandbox);
            }
        }
        sandbox.destroy().await;
        Err(Lookup::Closed)
    }

    /// The live sandbox `id`.
    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, Lookup> {
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
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
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
    pub async fn release(&self, id: &str) -> Result<Arc<Sandbox>, Lookup> {
        let sandbox = self.remove(&SandboxId::new(id), Gone::Released)?;
        sandbox.destroy().await;
        Ok(sandbox)
    }

    /// Destroys every sandbox and refuses new ones.
    pub async fn shutdown(&self) {
        let sandboxes: Vec<Arc<Sandbox>> = {
            let mut state = lock(&self.state);
            state.closed = true;
            for (_, timer) in state.timers.drain() {
                timer.abort();
            }
            std::mem::take(&mut state.live).into_values().collect()
        };
        let count = sandboxes.len();
        futures_join_all(sandboxes.into_iter().map(|sandbox| async move {
            sandbox.destroy().await;
        }))
        .await;
        tracing::info!(count, "every sandbox destroyed");
    }

    fn remove(&self, id: &SandboxId, why: Gone) -> Result<Arc<Sandbox>, Lookup> {
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
async fn expire(registry: Weak<Registry>, id: SandboxId) {
    let Some(registry) = registry.upgrade() else {
        return;
    };
    lock(&registry.state).timers.remove(&id);
    let expired_at = SystemTime::now();
    match registry.remove(&id, Gone::Expired(expired_at)) {
        Ok(sandbox) => {
            tracing::info!(sandbox = %id, "ttl reached; destroying");
            sandbox.destroy().await;
        }
        Err(_) => tracing::debug!(sandbox = %id, "ttl reached after release"),
    }
}
