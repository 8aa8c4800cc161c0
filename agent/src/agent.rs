//! The agent's shared state: its identity, the process table and settings every
//! connection sees.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sandbox_protocol::{tokens_equal, AgentInfo, PROTOCOL_VERSION};
use tokio::sync::watch;

use crate::init::PowerAction;
use crate::process::table::ProcessTable;
use crate::session::Sessions;

/// Capabilities announced in the handshake (plus [`CGROUPS_CAPABILITY`] when the
/// agent confines in cgroups).
pub const CAPABILITIES: &[&str] = &[
    "exec",
    "exec_stream",
    "spawn",
    "logs_follow",
    "pty",
    sandbox_protocol::limits::STREAM_WINDOW_CAPABILITY,
    "eval",
    sandbox_protocol::port::PORT_FORWARD_CAPABILITY,
];

/// Announced when every process runs in its own cgroup: timeouts and kills reach
/// all it started, and OOM kills are reported (`ps_detail`, `confinement`).
pub const CGROUPS_CAPABILITY: &str = "cgroups";

/// The agent's crate version.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// State shared by every connection.
#[derive(Debug)]
pub struct Agent {
    /// Every tracked process.
    pub table: Arc<ProcessTable>,
    /// Random per start of the agent.
    pub boot_id: String,
    /// Whether the agent is the guest's init (PID 1).
    pub is_init: bool,
    /// The bytes held for clients across all connections (see [`crate::budget`]).
    pub budget: crate::budget::Budget,
    /// The template's defaults and boot sessions.
    pub image: sandbox_protocol::ImageConfig,
    /// The interpreter sessions of `eval`.
    pub sessions: Arc<Sessions>,
    /// The egress proxy's route to the host (see [`crate::egress`]).
    pub egress: Arc<crate::egress::Egress>,
    /// The port pipes' slots (see [`crate::port`]).
    pub ports: crate::port::Ports,
    /// The token clients must present in their `Hello`, if any; `reidentify`
    /// replaces it (see [`Agent::admits`], [`Agent::replace_token`]).
    token: RwLock<Option<String>>,
    /// Init's thread for `resumed` and `reidentify` (see
    /// [`crate::machine::worker`]); `None` for an agent that is no init (it refuses
    /// both), or when the thread could not be started (the work is done in place).
    pub machine: Option<crate::machine::worker::MachineWorker>,
    started: Instant,
    generation: AtomicU64,
    shutdown: watch::Sender<Option<PowerAction>>,
}

impl Agent {
    /// Fresh state: an empty table forgetting exited processes after `forget_after`,
    /// confining by process group.
    pub fn new(forget_after: Duration, token: Option<String>, is_init: bool) -> Self {
        Self::with_table(ProcessTable::new(forget_after), token, is_init)
    }

    /// Fresh state around `table`.
    pub fn with_table(table: ProcessTable, token: Option<String>, is_init: bool) -> Self {
        Self {
            table: Arc::new(table),
            boot_id: crate::sys::random_hex(16),
            is_init,
            budget: crate::budget::Budget::default(),
            image: sandbox_protocol::ImageConfig::default(),
            sessions: Arc::new(Sessions::new()),
            egress: Arc::new(crate::egress::Egress::new()),
            ports: crate::port::Ports::default(),
            token: RwLock::new(token),
            machine: is_init
                .then(|| {
                    crate::machine::worker::MachineWorker::start()
                        .inspect_err(|error| {
                            tracing::warn!(%error, "no machine thread; resumed and reidentify work in place")
                        })
                        .ok()
                })
                .flatten(),
            started: Instant::now(),
            generation: AtomicU64::new(0),
            shutdown: watch::channel(None).0,
        }
    }

    /// The same agent with the template's defaults `image`.
    pub fn with_image(mut self, image: sandbox_protocol::ImageConfig) -> Self {
        self.image = image;
        self
    }

    /// The capabilities this agent announces.
    pub fn capabilities(&self) -> Vec<String> {
        let mut capabilities: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        if self.table.confinement().mode() == sandbox_protocol::ConfinementMode::Cgroups {
            capabilities.push(CGROUPS_CAPABILITY.to_owned());
        }
        capabilities
    }

    /// Whether a client presenting `given` in its `Hello` may connect: any client
    /// when the agent has no token, else one with exactly the current token. The
    /// comparison takes the same time wherever the first difference is.
    pub fn admits(&self, given: Option<&str>) -> bool {
        let token = self.token.read().unwrap_or_else(PoisonError::into_inner);
        match token.as_deref() {
            None => true,
            Some(expected) => tokens_equal(given.unwrap_or("").as_bytes(), expected.as_bytes()),
        }
    }

    /// Makes `token` the one every new connection must present. Connections
    /// already past their handshake are not asked again.
    pub fn replace_token(&self, token: String) {
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = Some(token);
    }

    /// Counts one more restore from a snapshot.
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Asks the server to stop and the guest to power off (or reboot).
    pub fn request_shutdown(&self, action: PowerAction) {
        self.shutdown.send_replace(Some(action));
    }

    /// The shutdown asked for by a request, if any.
    pub fn requested_shutdown(&self) -> Option<PowerAction> {
        *self.shutdown.borrow()
    }

    /// Resolves once a shutdown request arrived.
    pub async fn shutdown_requested(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// What `info` reports.
    pub fn info(&self) -> AgentInfo {
        let (running, exited) = self.table.counts();
        let (mem_total_bytes, mem_available_bytes) = memory().unwrap_or((0, 0));
        AgentInfo {
            agent_version: AGENT_VERSION.to_owned(),
            protocol_version: PROTOCOL_VERSION,
            boot_id: self.boot_id.clone(),
            is_init: self.is_init,
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            generation: self.generation.load(Ordering::Relaxed),
            load: load_average().unwrap_or([0.0; 3]),
            mem_total_bytes,
            mem_available_bytes,
            processes_running: running,
            processes_exited: exited,
        }
    }
}

fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

fn memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_reads_the_system() {
        let agent = Agent::new(Duration::from_secs(1), None, false);
        let info = agent.info();
        assert_eq!(info.boot_id.len(), 32);
        assert!(info.mem_total_bytes > 0);
        assert!(info.mem_available_bytes <= info.mem_total_bytes);
        assert_eq!(info.generation, 0);
    }

    #[test]
    fn without_a_token_every_client_is_admitted() {
        let agent = Agent::new(Duration::from_secs(1), None, false);
        assert!(agent.admits(None));
        assert!(agent.admits(Some("anything")));
    }

    #[test]
    fn a_replaced_token_admits_only_itself() {
        let agent = Agent::new(Duration::from_secs(1), Some("old".into()), false);
        assert!(agent.admits(Some("old")));
        assert!(!agent.admits(None));
        agent.replace_token("new".into());
        assert!(!agent.admits(Some("old")));
        assert!(!agent.admits(None));
        assert!(agent.admits(Some("new")));
    }

    #[test]
    fn a_token_can_be_set_on_an_agent_that_had_none() {
        let agent = Agent::new(Duration::from_secs(1), None, false);
        agent.replace_token("t".into());
        assert!(!agent.admits(None));
        assert!(agent.admits(Some("t")));
    }

    #[test]
    fn boot_ids_differ() {
        assert_ne!(crate::sys::random_hex(16), crate::sys::random_hex(16));
    }
}
