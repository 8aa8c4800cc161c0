//! Outputs of the fleet tools: one serializable type per tool (its schema is the
//! tool's `outputSchema`) and its text rendering, carried by
//! [`crate::render::success`] like every other tool's.

use std::fmt::Write as _;
use std::time::SystemTime;

use schemars::JsonSchema;
use serde::Serialize;

use crate::render::{rfc3339, CreateSandboxResult, Render};
use sandbox_engine::batch::{Batch, Ping};
use sandbox_engine::node::TemplateEntry;
use sandbox_engine::sandbox::{Lineage, Sandbox};
use sandbox_engine::util::millis;

/// `create_sandboxes`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CreateSandboxesResult {
    /// The new sandboxes, each as create_sandbox would return it.
    pub sandboxes: Vec<CreateSandboxResult>,
    /// How many came booted from the warm pool (the rest were started for this
    /// call, side by side).
    pub warm: usize,
    /// From the call until every sandbox answered, in milliseconds.
    pub batch_ms: u64,
}

impl CreateSandboxesResult {
    /// The result for `batch`, whose sandboxes live `ttl_secs`.
    pub fn new(batch: &Batch, ttl_secs: u64) -> Self {
        let size = batch.spec.size;
        let sandboxes: Vec<CreateSandboxResult> = batch
            .sandboxes
            .iter()
            .map(|(sandbox, origin)| CreateSandboxResult {
                sandbox_id: sandbox.id.to_string(),
                deadline: sandbox.deadline().map(|deadline| rfc3339(deadline.wall)),
                ttl_seconds: Some(ttl_secs),
                template: sandbox.template.clone(),
                size: Some(size.to_string()),
                vcpus: Some(size.vcpus),
                memory_mib: Some(size.memory_mib),
                warm: origin.is_warm(),
                origin: origin.as_str().to_owned(),
                claim_ms: millis(sandbox.claim_duration),
                note: None,
            })
            .collect();
        Self {
            warm: sandboxes.iter().filter(|sandbox| sandbox.warm).count(),
            sandboxes,
            batch_ms: millis(batch.took),
        }
    }
}

impl Render for CreateSandboxesResult {
    fn render(&self) -> String {
        let mut out = format!(
            "{} sandboxes in {} ms ({} from the warm pool)",
            self.sandboxes.len(),
            self.batch_ms,
            self.warm
        );
        if let Some(first) = self.sandboxes.first() {
            let size = first.size.as_deref().unwrap_or("?");
            let _ = write!(out, ", template {}, size {size}", first.template);
            if let Some(deadline) = &first.deadline {
                let _ = write!(out, ", deadline {deadline} (not renewable)");
            }
        }
        for sandbox in &self.sandboxes {
            let _ = write!(out, "\nsandbox_id: {}", sandbox.sandbox_id);
        }
        out
    }
}

/// One sandbox: `get_sandbox`, and each row of `list_sandboxes`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SandboxRow {
    /// Pass this to every other tool.
    pub sandbox_id: String,
    /// "running", "hibernated" (the next call that reaches it wakes it) or "busy"
    /// (being woken, forked, checkpointed or hibernated right now).
    pub state: String,
    /// The template it runs.
    pub template: String,
    /// The sandbox it was forked from, for a fork's child.
    pub forked_from: Option<String>,
    /// The checkpoint it started from, for one made by branch_checkpoint.
    pub checkpoint_id: Option<String>,
    /// The size preset (or VCPUSxMIB); null when unknown (an attached agent).
    pub size: Option<String>,
    /// Virtual CPUs; null when unknown.
    pub vcpus: Option<u16>,
    /// Memory in MiB; null when unknown.
    pub memory_mib: Option<u32>,
    /// When it was claimed (RFC 3339, UTC).
    pub claimed_at: String,
    /// When it is destroyed (RFC 3339, UTC); null when never (an attached agent).
    pub deadline: Option<String>,
    /// Seconds left until the deadline; null when never.
    pub seconds_left: Option<u64>,
}

impl SandboxRow {
    /// The row of `sandbox`.
    pub fn new(sandbox: &Sandbox) -> Self {
        let (forked_from, checkpoint_id) = match &sandbox.lineage {
            Lineage::Fork(parent) => (Some(parent.to_string()), None),
            Lineage::Checkpoint { id, .. } => (None, Some(id.clone())),
            Lineage::Template | Lineage::Attached => (None, None),
        };
        let now = SystemTime::now();
        Self {
            sandbox_id: sandbox.id.to_string(),
            state: sandbox.status().as_str().to_owned(),
            template: sandbox.template.clone(),
            forked_from,
            checkpoint_id,
            size: sandbox.size.map(|size| size.to_string()),
            vcpus: sandbox.size.map(|size| size.vcpus),
            memory_mib: sandbox.size.map(|size| size.memory_mib),
            claimed_at: rfc3339(sandbox.claimed_at),
            deadline: sandbox.deadline().map(|deadline| rfc3339(deadline.wall)),
            seconds_left: sandbox.deadline().map(|deadline| {
                deadline
                    .wall
                    .duration_since(now)
                    .map_or(0, |left| left.as_secs())
            }),
        }
    }

    fn line(&self) -> String {
        let mut out = format!(
            "{} {} template {}",
            self.sandbox_id, self.state, self.template
        );
        if let Some(size) = &self.size {
            let _ = write!(out, " size {size}");
        }
        if let Some(parent) = &self.forked_from {
            let _ = write!(out, " forked from {parent}");
        }
        if let Some(checkpoint) = &self.checkpoint_id {
            let _ = write!(out, " from checkpoint {checkpoint}");
        }
        match self.seconds_left {
            Some(left) => {
                let _ = write!(out, ", {left} s left");
            }
            None => out.push_str(", no deadline"),
        }
        out
    }
}

impl Render for SandboxRow {
    fn render(&self) -> String {
        let mut out = self.line();
        let _ = write!(out, "\nclaimed at {}", self.claimed_at);
        if let Some(deadline) = &self.deadline {
            let _ = write!(out, ", destroyed at {deadline}");
        }
        out
    }
}

/// `list_sandboxes`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListSandboxesResult {
    /// This session's sandboxes, by id.
    pub sandboxes: Vec<SandboxRow>,
    /// How many more sandboxes can be claimed now.
    pub claimable: usize,
}

impl Render for ListSandboxesResult {
    fn render(&self) -> String {
        let mut out = format!(
            "{} sandboxes; {} more can be claimed",
            self.sandboxes.len(),
            self.claimable
        );
        for row in &self.sandboxes {
            let _ = write!(out, "\n{}", row.line());
        }
        out
    }
}

/// `ping_sandbox`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PingResult {
    /// The sandbox.
    pub sandbox_id: String,
    /// "running", or "hibernated" (not woken by a ping; the agent was not asked).
    pub state: String,
    /// The agent's round trip, in milliseconds; null when hibernated.
    pub round_trip_ms: Option<u64>,
    /// The agent's version.
    pub agent_version: Option<String>,
    /// Milliseconds since the agent started (a restored sandbox counts from its
    /// template's boot).
    pub uptime_ms: Option<u64>,
    /// 1-minute load average in the guest.
    pub load_1m: Option<f64>,
    /// Guest memory, total and available, in bytes.
    pub mem_total_bytes: Option<u64>,
    /// Guest memory available, in bytes.
    pub mem_available_bytes: Option<u64>,
    /// Processes the agent tracks that are still running.
    pub processes_running: Option<u32>,
}

impl PingResult {
    /// The result of pinging `sandbox_id`.
    pub fn new(sandbox_id: &str, ping: &Ping) -> Self {
        let info = ping.info.as_ref();
        Self {
            sandbox_id: sandbox_id.to_owned(),
            state: ping.status.as_str().to_owned(),
            round_trip_ms: ping.round_trip.map(millis),
            agent_version: info.map(|info| info.agent_version.clone()),
            uptime_ms: info.map(|info| info.uptime_ms),
            load_1m: info.map(|info| info.load[0]),
            mem_total_bytes: info.map(|info| info.mem_total_bytes),
            mem_available_bytes: info.map(|info| info.mem_available_bytes),
            processes_running: info.map(|info| info.processes_running),
        }
    }
}

impl Render for PingResult {
    fn render(&self) -> String {
        let Some(rtt) = self.round_trip_ms else {
            return format!(
                "{} is {}: not woken, not asked (the next exec or other call that \
                 reaches it wakes it)",
                self.sandbox_id, self.state
            );
        };
        let mut out = format!("{} answered in {rtt} ms", self.sandbox_id);
        if let Some(version) = &self.agent_version {
            let _ = write!(out, ", agent {version}");
        }
        if let (Some(total), Some(available)) = (self.mem_total_bytes, self.mem_available_bytes) {
            let _ = write!(out, ", {} of {} MiB free", available >> 20, total >> 20);
        }
        if let Some(running) = self.processes_running {
            let _ = write!(out, ", {running} tracked processes running");
        }
        out
    }
}

/// A template, in `list_templates`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TemplateRow {
    /// Pass as create_sandbox's or create_sandboxes' template.
    pub name: String,
    /// Whether it is the server's default (kept warm: claims in milliseconds).
    pub default: bool,
    /// Its default size; null when it cannot be loaded.
    pub default_size: Option<String>,
    /// Virtual CPUs at that size.
    pub vcpus: Option<u16>,
    /// Memory in MiB at that size.
    pub memory_mib: Option<u32>,
    /// Made by promote: its sandboxes start from a captured state.
    pub promoted: bool,
    /// Interpreter sessions its sandboxes start with, as NAME:LANGUAGE (eval_code
    /// in them skips the interpreter's start).
    pub warm_sessions: Vec<String>,
    /// When it was built or promoted (RFC 3339, UTC).
    pub modified_at: Option<String>,
    /// Why it cannot be used, if it cannot.
    pub error: Option<String>,
}

impl From<&TemplateEntry> for TemplateRow {
    fn from(entry: &TemplateEntry) -> Self {
        Self {
            name: entry.name.clone(),
            default: entry.default,
            default_size: entry.size.map(|size| size.to_string()),
            vcpus: entry.size.map(|size| size.vcpus),
            memory_mib: entry.size.map(|size| size.memory_mib),
            promoted: entry.promoted,
            warm_sessions: entry.sessions.clone(),
            modified_at: entry.modified.map(rfc3339),
            error: entry.error.clone(),
        }
    }
}

/// `list_templates`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListTemplatesResult {
    /// The templates this host holds, by name.
    pub templates: Vec<TemplateRow>,
}

impl Render for ListTemplatesResult {
    fn render(&self) -> String {
        let mut out = format!("{} templates", self.templates.len());
        for row in &self.templates {
            let _ = write!(out, "\n{}", row.name);
            if row.default {
                out.push_str(" (default, kept warm)");
            }
            if let Some(size) = &row.default_size {
                let _ = write!(out, " size {size}");
            }
            if row.promoted {
                out.push_str(", promoted");
            }
            if !row.warm_sessions.is_empty() {
                let _ = write!(out, ", sessions {}", row.warm_sessions.join(" "));
            }
            if let Some(error) = &row.error {
                let _ = write!(out, ", unusable: {error}");
            }
        }
        out
    }
}

/// `egress_log`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EgressLogResult {
    /// The sandbox.
    pub sandbox_id: String,
    /// The operator's allowlist (a sandbox's own `allow` may narrow it further).
    pub server_allowlist: Vec<String>,
    /// Connection attempts, oldest first.
    pub records: Vec<EgressRow>,
}

/// One connection attempt.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EgressRow {
    /// When it started (RFC 3339, UTC).
    pub time: String,
    /// "allowed", "denied" (by the allowlist), "failed" (allowed, but it could not be
    /// resolved or connected) or "refused" (not an HTTP proxy request).
    pub verdict: String,
    /// `host:port` as the program named it ("-" for a refused request).
    pub destination: String,
    /// The address dialled, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Why, for anything but allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes sent by the sandbox.
    pub bytes_out: u64,
    /// Bytes received by the sandbox.
    pub bytes_in: u64,
    /// How long it lasted.
    pub duration_ms: u64,
}

impl EgressRow {
    /// A row of a stored record.
    pub fn new(record: &sandbox_vmm::egress::EgressRecord) -> Self {
        use sandbox_vmm::egress::Verdict;
        let time = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(record.time_unix_ms);
        Self {
            time: rfc3339(time),
            verdict: match record.verdict {
                Verdict::Allowed => "allowed",
                Verdict::Denied => "denied",
                Verdict::Failed => "failed",
                Verdict::Refused => "refused",
            }
            .to_owned(),
            destination: if record.port == 0 {
                "-".to_owned()
            } else {
                format!("{}:{}", record.host, record.port)
            },
            address: record.address.clone(),
            reason: record.reason.clone(),
            bytes_out: record.bytes_out,
            bytes_in: record.bytes_in,
            duration_ms: record.duration_ms,
        }
    }
}

impl Render for EgressLogResult {
    fn render(&self) -> String {
        let mut out = format!(
            "{}: {} egress record(s)\n",
            self.sandbox_id,
            self.records.len()
        );
        for r in &self.records {
            let _ = writeln!(
                out,
                "{} {} {} {}{} out={} in={} {}ms",
                r.time,
                r.verdict,
                r.destination,
                r.address
                    .as_deref()
                    .map(|a| format!("via {a} "))
                    .unwrap_or_default(),
                r.reason
                    .as_deref()
                    .map(|a| format!("({a}) "))
                    .unwrap_or_default(),
                r.bytes_out,
                r.bytes_in,
                r.duration_ms
            );
        }
        out
    }
}
