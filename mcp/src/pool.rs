//! Booting VMs: the capacity limit, cold boots, and the warm pool.
//!
//! # Capacity
//! Every VM this server runs (warm, booting or claimed) holds one [`Slot`] of
//! `--max-sandboxes`; dropping the slot after the VM is gone frees it and wakes the
//! refiller. A claim never fails because of warm VMs: when the limit is reached, a
//! claim for another template or size takes a warm VM's slot and destroys that VM.
//!
//! # The warm pool
//! One background task (the refiller) keeps `--pool` VMs of the default template and
//! size booted, with an open agent connection each, so a claim of that kind is a
//! queue pop. It boots one VM at a time (boots are CPU-bound; parallel boots on a
//! small host only slow each other), only into free capacity, and backs off after a
//! failed boot. A claim that finds the pool empty while a boot is in flight waits
//! for that boot rather than starting a second one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};
use sandbox_vmm::launcher::{BootSpec, LaunchError, Launcher, Size, TemplateRef};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::sandbox::OwnedVm;

/// First pause after a failed pool boot; it doubles up to [`REFILL_MAX_BACKOFF_SECS`].
const REFILL_FIRST_BACKOFF_SECS: u64 = 1;

/// Longest pause between failed pool boots.
const REFILL_MAX_BACKOFF_SECS: u64 = 60;

/// Why a VM could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Every slot is taken by claimed VMs.
    #[error("All {max} sandboxes allowed by --max-sandboxes are claimed")]
    AtCapacity {
        /// `--max-sandboxes`.
        max: usize,
    },
    /// The boot failed.
    #[error(transparent)]
    Boot(#[from] LaunchError),
    /// The VM booted but its agent could not be reached.
    #[error("The VM booted but its agent did not answer")]
    Connect(#[source] ClientError),
    /// The VM booted but reported an agent URL the client cannot parse.
    #[error("The VM reported an unusable agent URL {0:?}")]
    AgentUrl(String),
    /// The server is shutting down.
    #[error("The server is shutting down")]
    Closed,
}

/// The shared limit on running VMs.
#[derive(Debug)]
pub struct Capacity {
    max: usize,
    used: Mutex<usize>,
    freed: Arc<Notify>,
}

impl Capacity {
    /// A limit of `max` VMs; `freed` is notified whenever a slot is freed.
    pub fn new(max: usize, freed: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            max,
            used: Mutex::new(0),
            freed,
        })
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Slots taken.
    pub fn used(&self) -> usize {
        *lock(&self.used)
    }

    /// A slot, if one is free.
    pub fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let mut used = lock(&self.used);
        if *used >= self.max {
            return None;
        }
        *used += 1;
        Some(Slot {
            capacity: self.clone(),
        })
    }
}

/// One VM's share of the capacity; freed on drop.
#[derive(Debug)]
pub struct Slot {
    capacity: Arc<Capacity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut used = lock(&self.capacity.used);
        *used = used.saturating_sub(1);
        drop(used);
        self.capacity.freed.notify_one();
    }
}

/// A booted VM with an open connection to its agent.
#[derive(Debug)]
pub struct ReadyVm {
    /// The VM and its slot.
    pub vm: OwnedVm,
    /// Where its agent listens.
    pub url: AgentUrl,
    /// An open connection.
    pub client: Client,
}

/// What a pool snapshot reports.
#[derive(Debug, Clone)]
pub struct PoolStatus {
    /// The template kept warm.
    pub template: String,
    /// The size kept warm.
    pub size: Size,
    /// `--pool`.
    pub target: usize,
    /// VMs booted and waiting.
    pub warm: usize,
    /// VMs booting for the pool.
    pub booting: usize,
    /// Why the last pool boot failed, if it did.
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
struct PoolState {
    warm: VecDeque<ReadyVm>,
    booting: usize,
    closed: bool,
    last_error: Option<String>,
}

/// Boots VMs, keeps the warm pool, enforces the capacity.
#[derive(Debug)]
pub struct Pool {
    launcher: Arc<Launcher>,
    capacity: Arc<Capacity>,
    /// The default template, kept warm.
    template: TemplateRef,
    /// The default template's size.
    size: Size,
    target: usize,
    boot_timeout: Duration,
    state: Mutex<PoolState>,
    /// Wakes the refiller (a slot was freed, a warm VM was taken, or shutdown).
    wake: Arc<Notify>,
    /// Wakes claims waiting for a pool boot.
    changed: Notify,
    refiller: Mutex<Option<JoinHandle<()>>>,
}

impl Pool {
    /// A pool that keeps `target` VMs of `template` at `size` warm, within `max` VMs.
    /// Nothing boots until [`Pool::start`].
    pub fn new(
        launcher: Arc<Launcher>,
        template: TemplateRef,
        size: Size,
        target: usize,
        max: usize,
        boot_timeout: Duration,
    ) -> Arc<Self> {
        let wake = Arc::new(Notify::new());
        Arc::new(Self {
            launcher,
            capacity: Capacity::new(max, wake.clone()),
            template,
            size,
            target,
            boot_timeout,
            state: Mutex::new(PoolState::default()),
            wake,
            changed: Notify::new(),
            refiller: Mutex::new(None),
        })
    }

    /// Starts the refiller (a no-op with a pool of 0).
    pub fn start(self: &Arc<Self>) {
        if self.target == 0 {
            return;
        }
        let pool = Arc::downgrade(self);
        let handle = tokio::spawn(async move { refill(pool).await });
        *lock(&self.refiller) = Some(handle);
    }

    /// The launcher VMs are booted with.
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// The capacity shared by every VM.
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// The default template.
    pub fn default_template(&self) -> &TemplateRef {
        &self.template
    }

    /// The default size.
    pub fn default_size(&self) -> Size {
        self.size
    }

    /// A snapshot for `node_info`.
    pub fn status(&self) -> PoolStatus {
        let state = lock(&self.state);
        PoolStatus {
            template: self.template.to_string(),
            size: self.size,
            target: self.target,
            warm: state.warm.len(),
            booting: state.booting,
            last_error: state.last_error.clone(),
        }
    }

    /// A VM of `template` at `size`: from the pool when it keeps that kind, else
    /// booted now. Returns the VM and whether it came warm.
    pub async fn claim(
        &self,
        template: &TemplateRef,
        size: Size,
    ) -> Result<(ReadyVm, bool), ClaimError> {
        let pooled = self.target > 0 && *template == self.template && size == self.size;
        if pooled {
            if let Some(vm) = self.take_warm().await? {
                return Ok((vm, true));
            }
        }
        let slot = self.slot_for_cold_boot().await?;
        let vm = boot_ready(&self.launcher, template, size, self.boot_timeout, slot).await?;
        Ok((vm, false))
    }

    /// Destroys every warm VM, stops the refiller (killing a VM it is booting) and
    /// refuses further claims.
    pub async fn shutdown(&self) {
        let warm: Vec<ReadyVm> = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.warm.drain(..).collect()
        };
        self.changed.notify_waiters();
        let refiller = lock(&self.refiller).take();
        if let Some(handle) = refiller {
            // Dropping the boot future kills whatever it had started.
            handle.abort();
            let _ = handle.await;
        }
        let count = warm.len();
        let stops = warm.into_iter().map(|ready| ready.vm.destroy());
        futures_join_all(stops).await;
        tracing::info!(warm = count, "pool stopped");
    }

    /// A warm VM with a live connection, waiting for an in-flight pool boot if there
    /// is one; `None` when the pool has nothing coming.
    async fn take_warm(&self) -> Result<Option<ReadyVm>, ClaimError> {
        let deadline = Instant::now() + self.boot_timeout;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let booting = {
                let mut state = lock(&self.state);
                if state.closed {
                    return Err(ClaimError::Closed);
                }
                let mut found = None;
                let mut dead = Vec::new();
                while let Some(ready) = state.warm.pop_front() {
                    match ready.client.closed_reason() {
                        None => {
                            found = Some(ready);
                            break;
                        }
                        Some(reason) => {
                            tracing::warn!(%reason, "a warm VM lost its agent; discarding it");
                            dead.push(ready);
                        }
                    }
                }
                let booting = state.booting;
                drop(state);
                for ready in dead {
                    tokio::spawn(ready.vm.destroy());
                }
                if let Some(ready) = found {
                    self.wake.notify_one();
                    return Ok(Some(ready));
                }
                booting
            };
            if booting == 0 {
                return Ok(None);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Ok(None);
            }
        }
    }

    /// A free slot, or a warm VM's slot (that VM is destroyed), waiting for an
    /// in-flight pool boot to finish when that is the only thing holding capacity.
    async fn slot_for_cold_boot(&self) -> Result<Slot, ClaimError> {
        let deadline = Instant::now() + self.boot_timeout;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(slot) = self.capacity.try_take() {
                return Ok(slot);
            }
            let (evicted, booting) = {
                let mut state = lock(&self.state);
                if state.closed {
                    return Err(ClaimError::Closed);
                }
                (state.warm.pop_back(), state.booting)
            };
            if let Some(ready) = evicted {
                tracing::info!(vm = %ready.vm.vm.id(), "evicting a warm VM to make room");
                let OwnedVm { vm, slot } = ready.vm;
                drop(ready.client);
                // The slot moves to the claim, so the refiller cannot take it back.
                let stop = async move {
                    if let Err(error) = vm
                        .shutdown(Duration::from_millis(crate::sandbox::VM_STOP_GRACE_MS))
                        .await
                    {
                        tracing::warn!(%error, "stopping an evicted VM failed");
                    }
                };
                tokio::spawn(stop);
                return Ok(slot);
            }
            if booting == 0 {
                return Err(ClaimError::AtCapacity {
                    max: self.capacity.max(),
                });
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(ClaimError::AtCapacity {
                    max: self.capacity.max(),
                });
            }
        }
    }
}

/// The refiller: keeps the pool at its target while capacity allows.
async fn refill(pool: std::sync::Weak<Pool>) {
    let mut backoff = Duration::from_secs(REFILL_FIRST_BACKOFF_SECS);
    loop {
        let Some(this) = pool.upgrade() else { return };
        let wake = this.wake.clone();
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let slot = {
            let mut state = lock(&this.state);
            if state.closed {
                return;
            }
            let have = state.warm.len() + state.booting;
            match (have < this.target)
                .then(|| this.capacity.try_take())
                .flatten()
            {
                Some(slot) => {
                    state.booting += 1;
                    Some(slot)
                }
                None => None,
            }
        };
        let Some(slot) = slot else {
            drop(this);
            notified.await;
            continue;
        };
        let (launcher, template, size, timeout) = (
            this.launcher.clone(),
            this.template.clone(),
            this.size,
            this.boot_timeout,
        );
        drop(this);
        let started = Instant::now();
        let result = boot_ready(&launcher, &template, size, timeout, slot).await;
        let Some(this) = pool.upgrade() else { return };
        // Decide under the lock, act (destroy, log) after it.
        let (failed, leftover) = {
            let mut state = lock(&this.state);
            state.booting = state.booting.saturating_sub(1);
            match result {
                Ok(ready) if state.closed => (false, Some(ready)),
                Ok(ready) => {
                    tracing::info!(
                        vm = %ready.vm.vm.id(),
                        boot_ms = millis(started.elapsed()),
                        warm = state.warm.len() + 1,
                        "warm VM ready"
                    );
                    state.warm.push_back(ready);
                    state.last_error = None;
                    (false, None)
                }
                Err(error) => {
                    let text = sandbox_vmm::error_chain(&error);
                    tracing::error!(error = %text, "pool boot failed");
                    state.last_error = Some(text);
                    (true, None)
                }
            }
        };
        if let Some(ready) = leftover {
            drop(this);
            ready.vm.destroy().await;
            return;
        }
        this.changed.notify_waiters();
        drop(this);
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(REFILL_MAX_BACKOFF_SECS));
        } else {
            backoff = Duration::from_secs(REFILL_FIRST_BACKOFF_SECS);
        }
    }
}

/// Boots a VM into `slot` and opens a connection to its agent.
async fn boot_ready(
    launcher: &Launcher,
    template: &TemplateRef,
    size: Size,
    timeout: Duration,
    slot: Slot,
) -> Result<ReadyVm, ClaimError> {
    let mut spec = BootSpec::new(template.clone());
    spec.size = Some(size);
    spec.ready_timeout = timeout;
    let vm = launcher.boot(spec).await?;
    let vm = OwnedVm { vm, slot };
    let raw_url = vm.vm.agent_url();
    let url: AgentUrl = match raw_url.parse() {
        Ok(url) => url,
        Err(_) => {
            vm.destroy().await;
            return Err(ClaimError::AgentUrl(raw_url));
        }
    };
    // The agent said Ready, so it listens; retry only over the VMM's own start-up.
    let options = ConnectOptions::default();
    let deadline = Instant::now() + options.connect_timeout;
    match Client::connect_with_retry(&url, &options, deadline).await {
        Ok(client) => Ok(ReadyVm { vm, url, client }),
        Err(error) => {
            vm.destroy().await;
            Err(ClaimError::Connect(error))
        }
    }
}

/// Runs futures concurrently and waits for all of them.
pub async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    while set.join_next().await.is_some() {}
}

/// Milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Locks a mutex, recovering from poisoning (every critical section here leaves
/// the state consistent).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
