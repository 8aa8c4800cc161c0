//! The real [`VmFactory`]: QEMU microVMs booted by `sandbox_vmm`'s [`Launcher`],
//! each handed out with an open connection to its agent, so a warm claim costs no
//! handshake.

use std::sync::Arc;
use std::time::Duration;

use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};
use sandbox_vmm::launcher::{BootSpec, LaunchError, Launcher, Vm};
use tokio::time::Instant;

use super::boot_times::{BootSnapshot, BootTimes};
use super::{Machine, VmFactory, VmSpec};
use crate::record::{Owner, OwnerKind, SandboxRecord};

/// How long a destroyed VM's QEMU gets between `SIGTERM` and `SIGKILL`. The guest is
/// being thrown away, so nothing inside it needs to shut down cleanly.
pub const VM_STOP_GRACE_MS: u64 = 500;

/// Why a VM could not be booted and reached.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The boot failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The VM booted but its agent could not be reached.
    #[error("The VM booted but its agent did not answer")]
    Connect(#[source] ClientError),
    /// The VM booted but reported an agent URL the client cannot parse.
    #[error("The VM reported an unusable agent URL {0:?}")]
    AgentUrl(String),
    /// The VM booted but its record could not be written (it was stopped).
    #[error("The VM booted but its record could not be written")]
    Record(#[source] crate::record::RecordError),
}

/// Boots microVMs with a [`Launcher`].
#[derive(Debug, Clone)]
pub struct LauncherFactory {
    launcher: Arc<Launcher>,
    /// Who holds the VMs: a node daemon's are detached (they outlive it), an
    /// embedded engine's die with its process.
    owner: OwnerKind,
    /// Every boot's duration, shared by the factory's clones.
    boots: Arc<BootTimes>,
}

impl LauncherFactory {
    /// A factory over `launcher` whose VMs are held by an `owner`.
    pub fn new(launcher: Arc<Launcher>, owner: OwnerKind) -> Self {
        Self {
            launcher,
            owner,
            boots: Arc::default(),
        }
    }

    /// How long its boots took.
    pub fn boot_times(&self) -> BootSnapshot {
        self.boots.snapshot()
    }

    /// Whether its VMs outlive this process.
    pub fn detached(&self) -> bool {
        self.owner == OwnerKind::Node
    }

    /// Who holds its VMs.
    pub fn owner(&self) -> OwnerKind {
        self.owner
    }

    /// The launcher (templates are looked up through it).
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }
}

impl VmFactory for LauncherFactory {
    type Vm = LaunchedVm;
    type Error = BootError;

    async fn boot(&self, spec: &VmSpec, timeout: Duration) -> Result<LaunchedVm, BootError> {
        let mut boot = BootSpec::new(spec.template.clone());
        boot.size = Some(spec.size);
        boot.net = spec.net.clone();
        boot.ready_timeout = timeout;
        boot.detached = self.detached();
        let started = Instant::now();
        let booted = self.launcher.boot(boot).await;
        self.boots.observe(started.elapsed(), booted.is_ok());
        let vm = booted?;
        // Recorded as this node's before anyone can claim it: a node killed now
        // finds it at its next start and stops it, rather than leaking it.
        let record = SandboxRecord::unclaimed(Owner::this(self.owner));
        if let Err(error) = crate::record::write(vm.run_dir(), &record) {
            stop(vm).await;
            return Err(BootError::Record(error));
        }
        LaunchedVm::connect(vm).await
    }
}

/// A booted microVM with an open connection to its agent. Dropping it kills QEMU
/// (`Vm`'s own `Drop`).
#[derive(Debug)]
pub struct LaunchedVm {
    /// The VM.
    pub vm: Vm,
    /// Where its agent listens.
    pub url: AgentUrl,
    /// An open connection (clones share it).
    pub client: Client,
}

impl LaunchedVm {
    /// `vm` (booted, restored or woken: its agent answers) with a connection to its
    /// agent; a VM whose agent cannot be reached is stopped.
    pub async fn connect(vm: Vm) -> Result<Self, BootError> {
        let raw_url = vm.agent_url();
        let Ok(url) = raw_url.parse::<AgentUrl>() else {
            stop(vm).await;
            return Err(BootError::AgentUrl(raw_url));
        };
        // The agent said Ready, so it listens; retry only over the VMM's own start-up.
        // The VM's own token: the launcher gives every VM a random one.
        let options = vm.connect_options(ConnectOptions::default().connect_timeout);
        let deadline = Instant::now() + options.connect_timeout;
        match Client::connect_with_retry(&url, &options, deadline).await {
            Ok(client) => Ok(Self { vm, url, client }),
            Err(error) => {
                stop(vm).await;
                Err(BootError::Connect(error))
            }
        }
    }
}

impl Machine for LaunchedVm {
    fn id(&self) -> &str {
        self.vm.id().as_str()
    }

    fn lost(&self) -> Option<String> {
        self.client.closed_reason().map(|reason| reason.to_string())
    }

    /// Drops the connection first, so nothing waits on a dying VM; then stops QEMU
    /// (`SIGTERM`, then `SIGKILL`) and its vsock daemon and removes its run folder.
    async fn destroy(self) {
        let Self { vm, client, .. } = self;
        drop(client);
        stop(vm).await;
    }

    /// Detaches a detached VM (its processes, folder and records stay); an owned
    /// one is killed by its drop.
    fn leave(self) {
        let Self { vm, client, .. } = self;
        drop(client);
        match vm.detach() {
            Ok(record) => tracing::info!(vm = %record.id, "left running for the next start"),
            Err(vm) => drop(vm),
        }
    }
}

/// Stops `vm` within [`VM_STOP_GRACE_MS`], logging the outcome.
async fn stop(vm: Vm) {
    let id = vm.id().clone();
    match vm.shutdown(Duration::from_millis(VM_STOP_GRACE_MS)).await {
        Ok(outcome) => tracing::info!(vm = %id, ?outcome, "vm destroyed"),
        Err(error) => tracing::warn!(vm = %id, %error, "vm stop reported an error"),
    }
}
