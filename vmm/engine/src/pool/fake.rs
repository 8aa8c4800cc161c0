//! A fake [`VmFactory`] for unit tests: boots take a configurable (virtual) time and
//! can be made to fail, and the factory counts what is alive, so tests can check the
//! capacity limit, destruction and refill in milliseconds under
//! `tokio::time::pause()`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_vmm::launcher::{Size, TemplateRef};

use super::{Machine, VmFactory, VmSpec};

/// How long a fake boot takes unless a test says otherwise.
pub const BOOT_MS: u64 = 1000;

/// The factory's counters, shared with every VM it made.
#[derive(Debug, Default)]
pub struct Counters {
    /// Boots started.
    pub boots: AtomicUsize,
    /// VMs in existence: booting, or booted and not yet destroyed or dropped.
    pub alive: AtomicUsize,
    /// The most that were ever alive at once.
    pub peak: AtomicUsize,
    /// VMs stopped with `destroy` (not just dropped).
    pub destroyed: AtomicUsize,
    /// Upcoming boots that fail.
    pub fail_next: AtomicUsize,
    /// Specs booted, in order.
    pub specs: Mutex<Vec<VmSpec>>,
}

impl Counters {
    fn up(&self) {
        let now = self.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn down(&self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Boots [`FakeVm`]s.
#[derive(Debug, Clone)]
pub struct FakeFactory {
    /// What happened.
    pub counters: Arc<Counters>,
    /// How long each boot takes.
    pub boot_time: Duration,
    /// How long each VM takes to stop.
    pub stop_time: Duration,
}

impl Default for FakeFactory {
    fn default() -> Self {
        Self {
            counters: Arc::default(),
            boot_time: Duration::from_millis(BOOT_MS),
            stop_time: Duration::ZERO,
        }
    }
}

/// A boot the test asked to fail.
#[derive(Debug, thiserror::Error)]
#[error("fake boot failed")]
pub struct FakeError;

impl VmFactory for FakeFactory {
    type Vm = FakeVm;
    type Error = FakeError;

    async fn boot(&self, spec: &VmSpec, _timeout: Duration) -> Result<FakeVm, FakeError> {
        let counters = &self.counters;
        let n = counters.boots.fetch_add(1, Ordering::SeqCst) + 1;
        if let Ok(mut specs) = counters.specs.lock() {
            specs.push(spec.clone());
        }
        // Counted from the start, like a QEMU that exists while it boots; the guard
        // uncounts it if the boot fails or is cancelled.
        let vm = FakeVm {
            id: format!("fake-{n}"),
            counters: counters.clone(),
            lost: Arc::new(AtomicBool::new(false)),
            stop_time: self.stop_time,
        };
        counters.up();
        tokio::time::sleep(self.boot_time).await;
        let fail = counters
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(FakeError);
        }
        Ok(vm)
    }
}

/// A fake VM: alive until destroyed or dropped.
#[derive(Debug)]
pub struct FakeVm {
    id: String,
    counters: Arc<Counters>,
    /// Set by a test to make the VM look like it lost its agent.
    pub lost: Arc<AtomicBool>,
    stop_time: Duration,
}

impl Machine for FakeVm {
    fn id(&self) -> &str {
        &self.id
    }

    fn lost(&self) -> Option<String> {
        self.lost
            .load(Ordering::SeqCst)
            .then(|| "connection reset".to_owned())
    }

    async fn destroy(self) {
        tokio::time::sleep(self.stop_time).await;
        self.counters.destroyed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for FakeVm {
    fn drop(&mut self) {
        self.counters.down();
    }
}

/// The kind the test pools keep warm.
pub fn default_spec() -> VmSpec {
    VmSpec {
        template: TemplateRef::Name("default".into()),
        size: Size::default(),
        net: sandbox_vmm::egress::Net::None,
    }
}

/// Another kind, never kept warm.
pub fn other_spec() -> VmSpec {
    VmSpec {
        template: TemplateRef::Name("other".into()),
        size: Size::default(),
        net: sandbox_vmm::egress::Net::None,
    }
}

/// Reads a counter.
pub fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

/// A pool of `target` warm VMs within `max`, over a fake factory, started; and the
/// factory's counters. Boot timeout: one virtual minute.
pub fn started_pool(target: usize, max: usize) -> (super::Pool<FakeFactory>, Arc<Counters>) {
    pool_with(FakeFactory::default(), target, max)
}

/// [`started_pool`] over a given factory.
pub fn pool_with(
    factory: FakeFactory,
    target: usize,
    max: usize,
) -> (super::Pool<FakeFactory>, Arc<Counters>) {
    let counters = factory.counters.clone();
    let pool = super::Pool::new(
        factory,
        default_spec(),
        target,
        max,
        Duration::from_secs(60),
    );
    pool.start();
    (pool, counters)
}

/// Waits, in virtual time, until `done` holds; fails the test after ten virtual
/// minutes. Polls because the states it waits for (a refill, a destroy in a
/// background task) have no event a test can await.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
