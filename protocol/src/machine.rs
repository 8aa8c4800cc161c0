//! Requests about the whole guest machine rather than one process or file.
//!
//! - `info` (no request body) answers with [`AgentInfo`]: the agent's identity and
//!   version, and the machine's load, memory and process counts.
//! - `resumed` ([`ResumedRequest`]) is sent after a snapshot restore or a fork,
//!   before the guest is used again: the agent sets the wall clock, reseeds the
//!   kernel's random pool and, for a fork, writes a new machine id, then answers
//!   with [`AgentInfo`] (its `generation` bumped).
//! - `reidentify` ([`ReidentifyRequest`]) gives a fork child an identity of its own
//!   after `resumed`: a new hostname and a new token, since the child's agent was
//!   restored with its parent's. The agent answers `Done`.
//! - `shutdown` ([`ShutdownRequest`]) stops every process and powers the guest off
//!   or reboots it; the agent answers before it goes.
//!
//! Which module a type sits in is not on the wire (postcard encodes variant
//! indexes and field order, see the crate docs); the crate root re-exports these.

use serde::{Deserialize, Serialize};

/// What `info` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The agent's crate version.
    pub agent_version: String,
    /// The protocol version it speaks.
    pub protocol_version: u32,
    /// Random per boot of the agent.
    pub boot_id: String,
    /// Whether the agent is the guest's init.
    pub is_init: bool,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// Bumped by each restore from a snapshot (0 on a fresh boot).
    pub generation: u64,
    /// 1, 5 and 15 minute load averages.
    pub load: [f64; 3],
    /// Total memory in bytes.
    pub mem_total_bytes: u64,
    /// Available memory in bytes.
    pub mem_available_bytes: u64,
    /// Tracked processes not yet reaped.
    pub processes_running: u32,
    /// Tracked processes exited and not yet forgotten.
    pub processes_exited: u32,
}

/// Sent after a snapshot restore or a fork, before the guest is used again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumedRequest {
    /// The host's wall clock, nanoseconds since the Unix epoch.
    pub wall_clock_ns: u64,
    /// Fresh random bytes to mix into the guest kernel's pool (and force a reseed,
    /// of the kernel and of every interpreter session). Empty with a clock (and no
    /// new identity): the request only sets the clock, as the host's resends of the
    /// time after a first `resumed` do.
    #[serde(with = "serde_bytes")]
    pub entropy: Vec<u8>,
    /// Write a new `/etc/machine-id`: this guest is a new machine (a fork).
    pub new_identity: bool,
}

impl ResumedRequest {
    /// A resend of the time: a clock, no entropy, no new identity.
    pub fn sets_clock_only(&self) -> bool {
        self.wall_clock_ns > 0 && self.entropy.is_empty() && !self.new_identity
    }
}

/// Gives the guest a new hostname, its agent a new token, or both; sent to a fork
/// child after `resumed`. Fields left `None` keep their value.
///
/// A new token applies to every connection opened after the reply: connections
/// already past their handshake stay served (the one that sent this, too). The
/// hostname is set in the kernel and written to `/etc/hostname`, so only an agent
/// that is the guest's init changes it; any agent changes its own token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReidentifyRequest {
    /// The guest's new hostname: 1 to 64 ASCII letters, digits, `-` and `.`.
    pub hostname: Option<String>,
    /// The token every new connection must present from now on; not empty.
    pub token: Option<String>,
}

// The token is a secret: keep it out of logs.
impl std::fmt::Debug for ReidentifyRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReidentifyRequest")
            .field("hostname", &self.hostname)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Stop every process and power the guest off (or reboot it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownRequest {
    /// Reboot instead of powering off.
    pub reboot: bool,
}

/// How the agent confines what it runs; `confinement` answers with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfinementMode {
    /// Each process has its own process group, and timeouts and kills signal that
    /// group: a child that calls `setsid` escapes. (The agent is not init, or the
    /// kernel has no usable cgroup2.)
    ProcessGroups,
    /// Each process runs in its own cgroup under a workload parent with memory and
    /// pids limits; timeouts and kills reach everything in that cgroup.
    Cgroups,
}

impl ConfinementMode {
    /// The snake_case name used in human and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProcessGroups => "process_groups",
            Self::Cgroups => "cgroups",
        }
    }
}

/// What `confinement` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// The mode in force.
    pub mode: ConfinementMode,
    /// The agent's own cgroup (`/agent`), relative to the cgroup2 mount.
    pub agent_cgroup: Option<String>,
    /// The parent of every workload cgroup (`/workload`).
    pub workload_cgroup: Option<String>,
    /// The workload parent's `memory.max`.
    pub memory_max_bytes: Option<u64>,
    /// The workload parent's `pids.max`.
    pub pids_max: Option<u64>,
    /// Why the agent fell back to process groups, when it did.
    pub reason: Option<String>,
}
