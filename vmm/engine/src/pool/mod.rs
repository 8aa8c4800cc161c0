//! Where VMs come from: the capacity limit, cold boots, and the warm pool.
//!
//! # Capacity
//! `--max-sandboxes` is a [`tokio::sync::Semaphore`]. Every VM this server runs
//! (warm, booting or claimed) is paid for by one owned permit, its slot, held in the
//! same [`Lease`] as the VM: dropping or destroying the lease stops the VM and then
//! frees the slot, so the limit counts VMs, not claims. A claim never fails because
//! of warm VMs: when the limit is reached, a claim for another template or size takes
//! a warm VM's slot and destroys that VM.
//!
//! # The warm pool
//! One background task (the refiller, [`refill`]) keeps `--pool` VMs of the default
//! template and size booted, with an open agent connection each, so a claim of that
//! kind is a queue pop ([`warm`]). It boots one VM at a time (boots are CPU-bound;
//! parallel boots on a small host only slow each other), only into free capacity, and
//! backs off after a failed boot. A claim that finds the pool empty while a boot is in
//! flight waits for that boot rather than starting a second one.
//!
//! # The seam
//! Booting is behind [`VmFactory`], and what the pool needs of a VM behind
//! [`Machine`]; [`launcher::LauncherFactory`] is the real pair (QEMU through
//! `sandbox_vmm::launcher::Launcher`, plus an agent connection). Everything else in
//! this module is generic over them, so claims, eviction, refill and shutdown are
//! unit-tested against a fake in virtual time.
//!
//! # Layout
//! - this file: the seam traits, [`Lease`], [`ClaimError`], [`PoolStatus`].
//! - [`warm`]: [`Pool`]: claims, eviction, status, shutdown.
//! - [`batch`]: many VMs of one kind in one claim, all or none.
//! - [`refill`]: the refiller task.
//! - [`launcher`]: the real factory.

mod batch;
pub mod boot_times;
pub mod launcher;
mod refill;
mod warm;

#[cfg(test)]
pub(crate) mod fake;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sandbox_vmm::launcher::{Size, TemplateRef};
use tokio::sync::OwnedSemaphorePermit;

pub use warm::Pool;

/// First pause after a failed pool boot; it doubles up to [`REFILL_MAX_BACKOFF_SECS`].
const REFILL_FIRST_BACKOFF_SECS: u64 = 1;

/// Longest pause between failed pool boots: a host that cannot boot is retried
/// about once a minute, not in a loop that burns the CPU the claims need.
const REFILL_MAX_BACKOFF_SECS: u64 = 60;

/// What a VM is booted from: a template at a size. The pool keeps one kind warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    /// The template.
    pub template: TemplateRef,
    /// vCPUs and memory.
    pub size: Size,
    /// No network (what the warm pool keeps), or egress under a policy.
    pub net: sandbox_vmm::egress::Net,
}

/// Boots VMs. The pool calls it from the refiller task and from claims.
pub trait VmFactory: fmt::Debug + Send + Sync + 'static {
    /// What a boot yields.
    type Vm: Machine;
    /// Why a boot failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Boots a VM of `spec`, ready to use, within `timeout`. Dropping the future
    /// must leave nothing running: the pool cancels an in-flight boot at shutdown.
    fn boot(
        &self,
        spec: &VmSpec,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Vm, Self::Error>> + Send;
}

/// What the pool needs of a booted VM. Dropping it must kill the VM (the backstop
/// when nobody had the chance to call [`Machine::destroy`]).
pub trait Machine: fmt::Debug + Send + 'static {
    /// A short id for logs and sandbox ids.
    fn id(&self) -> &str;

    /// Why this VM can no longer be handed out (its agent connection dropped while
    /// it waited in the pool), or `None` while it is usable.
    fn lost(&self) -> Option<String>;

    /// Stops the VM and everything it made.
    fn destroy(self) -> impl Future<Output = ()> + Send;

    /// Lets the VM run on past this process (a node daemon's graceful stop leaves
    /// claimed VMs for its next start). One that cannot is killed, as by a drop.
    fn leave(self)
    where
        Self: Sized,
    {
        drop(self);
    }
}

/// A VM and the capacity slot it pays for.
///
/// Dropping a lease kills the VM (its own `Drop`) and then frees the slot;
/// [`Lease::destroy`] stops it politely first. Either way the slot outlives the VM,
/// so the semaphore never admits a new VM while an old one still runs.
#[derive(Debug)]
pub struct Lease<V> {
    // Field order is drop order: the VM goes before its slot.
    vm: V,
    slot: OwnedSemaphorePermit,
}

impl<V: Machine> Lease<V> {
    /// `vm`, paid for by `slot`.
    pub(crate) fn new(vm: V, slot: OwnedSemaphorePermit) -> Self {
        Self { vm, slot }
    }

    /// The VM.
    pub fn vm(&self) -> &V {
        &self.vm
    }

    /// Stops the VM, then frees its slot.
    pub async fn destroy(self) {
        let Self { vm, slot } = self;
        vm.destroy().await;
        drop(slot);
    }

    /// Lets the VM outlive this process ([`Machine::leave`]) and frees the slot.
    pub fn leave(self) {
        let Self { vm, slot } = self;
        vm.leave();
        drop(slot);
    }

    /// The VM and its slot apart: an eviction hands the slot to a claim at once and
    /// stops the VM in the background; a hibernation frees the slot and keeps the VM's
    /// image.
    pub(crate) fn into_parts(self) -> (V, OwnedSemaphorePermit) {
        (self.vm, self.slot)
    }
}

/// Where a claimed VM came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Booted and waiting in the pool: the claim took milliseconds.
    WarmPool,
    /// The pool's boot in flight, which the claim waited for.
    PoolBoot,
    /// Booted (or restored) for this claim.
    NewVm,
}

impl Origin {
    /// Whether a ready VM was waiting for the claim.
    pub fn is_warm(self) -> bool {
        self == Self::WarmPool
    }

    /// Whether the VM came from the pool, ready or not.
    pub fn from_pool(self) -> bool {
        self != Self::NewVm
    }

    /// The name results report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WarmPool => "warm_pool",
            Self::PoolBoot => "pool_boot",
            Self::NewVm => "new_vm",
        }
    }
}

/// Why a VM could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError<E> {
    /// Every slot is taken by claimed VMs.
    #[error("All {max} sandboxes allowed by --max-sandboxes are claimed")]
    AtCapacity {
        /// `--max-sandboxes`.
        max: usize,
    },
    /// Fewer slots can be had than a fork or branch needs at once.
    #[error(
        "{wanted} more VMs do not fit: {room} can be had within --max-sandboxes {max} \
         (claimed sandboxes keep theirs)"
    )]
    Short {
        /// Slots asked for.
        wanted: usize,
        /// Slots free or held by warm VMs.
        room: usize,
        /// `--max-sandboxes`.
        max: usize,
    },
    /// The boot failed.
    #[error(transparent)]
    Boot(E),
    /// The server is shutting down.
    #[error("The server is shutting down")]
    Closed,
}

/// What a pool snapshot reports (`node_info`).
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
