//! Tool outputs: one serializable type per tool (its JSON schema is the tool's
//! `outputSchema`), its text rendering, and the `CallToolResult` that carries both.
//!
//! Successful results put the JSON in `structuredContent` and a rendering meant for
//! a model's eyes in the text content; a field too large to carry twice is in the
//! JSON only, named in the text (see [`crate::output`]). Failures are `isError`
//! results with text only (see [`crate::error`]); the exceptions are a cut-off
//! `exec` and an `eval_code` that raised, whose structured results keep the output
//! collected so far next to their `error` field.
//!
//! # Layout
//! - this file: [`Render`], the result constructors, and the results of the
//!   sandbox-level tools (`create_sandbox`, `eval_code`, `wait_for_text`,
//!   `release`, `node_info`).
//! - [`process`]: `exec`, `spawn`, `ps`, `logs`, `kill`.
//! - [`files`]: `read_file`, `write_file`, `list_dir`.

pub mod files;
pub mod process;

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

pub use files::{DirEntryRow, ListDirResult, ReadFileResult, WriteFileResult};
pub use process::{ExecResult, KillResult, LogsResult, ProcessRow, PsResult, SpawnResult};

/// A tool result with a text rendering.
pub trait Render: Serialize {
    /// The text a model reads.
    fn render(&self) -> String;
}

/// A successful result: structured JSON plus its rendering.
pub fn success<T: Render>(value: &T) -> CallToolResult {
    with_text(value, false, value.render())
}

/// A failed result that still carries structured JSON (a cut-off exec).
pub fn failure_with<T: Render>(value: &T, message: &str) -> CallToolResult {
    let text = format!("{}\nerror: {message}", value.render());
    with_text(value, true, text)
}

/// A successful result whose content is an image (base64 `data` of `mime_type`)
/// and the rendering; the JSON describes the image.
pub fn success_with_image<T: Render>(value: &T, data: String, mime_type: &str) -> CallToolResult {
    let mut result = success(value);
    result
        .content
        .insert(0, ContentBlock::image(data, mime_type.to_owned()));
    result
}

fn with_text<T: Serialize>(value: &T, is_error: bool, text: String) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(json) => {
            let mut result = if is_error {
                CallToolResult::structured_error(json)
            } else {
                CallToolResult::structured(json)
            };
            result.content = vec![ContentBlock::text(text)];
            result
        }
        Err(error) => CallToolResult::error(vec![ContentBlock::text(format!(
            "{text}\n(the structured result could not be encoded: {error})"
        ))]),
    }
}

/// `create_sandbox`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CreateSandboxResult {
    /// Pass this to every other tool.
    pub sandbox_id: String,
    /// When the sandbox is destroyed (RFC 3339, UTC); null when it never expires.
    pub deadline: Option<String>,
    /// Seconds from the claim to the deadline; null when it never expires.
    pub ttl_seconds: Option<u64>,
    /// The template it runs.
    pub template: String,
    /// The size preset (or VCPUSxMIB); null when unknown.
    pub size: Option<String>,
    /// Virtual CPUs; null when unknown.
    pub vcpus: Option<u16>,
    /// Memory in MiB; null when unknown.
    pub memory_mib: Option<u32>,
    /// Whether a warm VM was ready for it (claimed in milliseconds).
    pub warm: bool,
    /// Where its VM came from: "warm_pool" (booted and waiting), "pool_boot" (the
    /// claim waited for the warm pool's boot in flight), "new_vm" (booted, or
    /// restored from a promoted template, for this claim) or "attached".
    pub origin: String,
    /// How long the claim took, in milliseconds.
    pub claim_ms: u64,
    /// Anything else worth knowing.
    pub note: Option<String>,
}

impl Render for CreateSandboxResult {
    fn render(&self) -> String {
        let mut out = format!("sandbox_id: {}\n", self.sandbox_id);
        match &self.deadline {
            Some(deadline) => {
                let _ = writeln!(out, "deadline: {deadline} (destroyed then; not renewable)");
            }
            None => out.push_str("deadline: none\n"),
        }
        let _ = write!(out, "template: {}", self.template);
        if let (Some(size), Some(vcpus), Some(mib)) = (&self.size, self.vcpus, self.memory_mib) {
            let _ = write!(out, ", size: {size} ({vcpus} vCPU, {mib} MiB)");
        }
        let origin = match self.origin.as_str() {
            "warm_pool" => "warm pool",
            "pool_boot" => "waited for the warm pool's VM to boot",
            "attached" => "attached agent",
            _ => "new VM",
        };
        let _ = write!(out, "\nclaimed in {} ms ({origin})", self.claim_ms);
        if let Some(note) = &self.note {
            let _ = write!(out, "\nnote: {note}");
        }
        out
    }
}

/// An exception a Python cell raised, in `eval_code`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ExceptionInfo {
    /// Its type, e.g. ZeroDivisionError or json.decoder.JSONDecodeError.
    #[serde(rename = "type")]
    pub type_name: String,
    /// str() of it.
    pub message: String,
    /// The traceback, from the cell's own frames on.
    pub traceback: String,
}

/// `eval_code`
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct EvalCodeResult {
    /// The session.
    pub session: String,
    /// Its language: python or sh.
    pub language: String,
    /// Its interpreter's pid (ps lists it as kind session; kill ends it).
    pub pid: i32,
    /// This call started the session's interpreter (its first use, or a restart):
    /// nothing defined before is there.
    pub started: bool,
    /// Evaluations the session has run, this one included.
    pub evaluations: u64,
    /// What the code wrote to stdout, subprocesses included (invalid UTF-8
    /// replaced), at most its first 1 MiB.
    pub stdout: String,
    /// What it wrote to stderr, likewise.
    pub stderr: String,
    /// A stream went past 1 MiB; the rest was dropped.
    pub truncated: bool,
    /// Python: the repr of the cell's last expression, when it is not None.
    pub value: Option<String>,
    /// The repr went past 64 KiB and was cut.
    pub value_truncated: bool,
    /// Python: the exception the code raised (KeyboardInterrupt after a timeout).
    pub exception: Option<ExceptionInfo>,
    /// sh: the status of the last command ($?).
    pub status: Option<i32>,
    /// The timeout passed and the code was interrupted.
    pub timed_out: bool,
    /// The interpreter ended during this call (exit(), a crash, or killed after not
    /// coming back from the interrupt): the session's state is gone.
    pub died: bool,
    /// When it died: its exit code (128+N when signal N killed it).
    pub exit_code: Option<i32>,
    /// When it died by a signal: which.
    pub signal: Option<i32>,
    /// Wall time of the evaluation in milliseconds.
    pub duration_ms: u64,
    /// Set when the code raised, timed out or the session died: what happened and
    /// what to do next.
    pub error: Option<String>,
}

impl Render for EvalCodeResult {
    fn render(&self) -> String {
        let mut out = format!(
            "session {} ({}, pid {}, evaluation {}{})",
            self.session,
            self.language,
            self.pid,
            self.evaluations,
            if self.started { ", just started" } else { "" }
        );
        if let Some(status) = self.status {
            let _ = write!(
                out,
                "
status: {status}"
            );
        }
        if self.truncated {
            out.push_str(
                "
(output truncated at 1 MiB per stream)",
            );
        }
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !text.is_empty() {
                let _ = write!(
                    out,
                    "
--- {name} ---
{text}"
                );
                if !text.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        if let Some(value) = &self.value {
            let cut = if self.value_truncated { " (cut)" } else { "" };
            let _ = write!(
                out,
                "
--- value{cut} ---
{value}"
            );
        }
        if let Some(exception) = &self.exception {
            let _ = write!(
                out,
                "
--- exception ---
{}",
                exception.traceback
            );
        }
        out
    }
}

/// `wait_for_text`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WaitForTextResult {
    /// The file waited on; null for a process.
    pub path: Option<String>,
    /// The process waited on; null for a file.
    pub pid: Option<i32>,
    /// Byte offset of the text's first byte in the file, or in the process's output
    /// (the offsets logs counts in; pass it as logs' cursor to read from there).
    pub offset: u64,
    /// For a process: "stdout", "stderr" or "pty", the stream that printed it.
    pub stream: Option<String>,
    /// The line holding the text (at most 4 KiB around it; invalid UTF-8 replaced).
    pub line: String,
    /// How long the wait took, in milliseconds (0: it was already there).
    pub waited_ms: u64,
}

impl Render for WaitForTextResult {
    fn render(&self) -> String {
        let place = match (&self.path, self.pid, &self.stream) {
            (Some(path), _, _) => path.clone(),
            (None, Some(pid), Some(stream)) => format!("the {stream} of process {pid}"),
            (None, Some(pid), None) => format!("the output of process {pid}"),
            (None, None, _) => "the target".to_owned(),
        };
        let when = match self.waited_ms {
            0 => "already there".to_owned(),
            ms => format!("after {ms} ms"),
        };
        format!(
            "found at offset {} of {place} ({when}):\n{}",
            self.offset, self.line
        )
    }
}

/// `release`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReleaseResult {
    /// The sandbox released; its id is now unknown.
    pub sandbox_id: String,
    /// What happened to it.
    pub outcome: String,
}

impl Render for ReleaseResult {
    fn render(&self) -> String {
        format!("released {}: {}", self.sandbox_id, self.outcome)
    }
}

/// The warm pool, in `node_info`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PoolInfo {
    /// Template kept warm.
    pub template: String,
    /// Size kept warm.
    pub size: String,
    /// VMs the pool aims to keep booted.
    pub target: usize,
    /// VMs booted and ready to claim.
    pub warm: usize,
    /// VMs booting for the pool.
    pub booting: usize,
    /// Why the last pool boot failed, if it did.
    pub last_error: Option<String>,
}

/// A template, in `node_info`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TemplateInfo {
    /// Pass as create_sandbox's template.
    pub name: String,
    /// Its default size.
    pub default_size: Option<String>,
    /// Whether it is the server's default.
    pub default: bool,
}

/// A live claim, in `node_info`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ClaimInfo {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its template.
    pub template: String,
    /// Its size, when known.
    pub size: Option<String>,
    /// When it was claimed (RFC 3339, UTC).
    pub claimed_at: String,
    /// When it is destroyed (RFC 3339, UTC); null when never.
    pub deadline: Option<String>,
}

/// Capacity, in `node_info`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CapacityInfo {
    /// Most VMs at once (claimed, warm and booting), from --max-sandboxes.
    pub max_sandboxes: usize,
    /// VMs running or booting now.
    pub vms: usize,
    /// Sandboxes claimed by this session.
    pub live_claims: usize,
    /// Sandboxes that can still be claimed (warm VMs are given up for a claim).
    pub claimable: usize,
}

/// `node_info`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NodeInfoResult {
    /// "launch" (this server boots microVMs) or "attach" (one existing agent).
    pub mode: String,
    /// The template create_sandbox uses when none is given.
    pub default_template: String,
    /// The warm pool; null in attach mode.
    pub pool: Option<PoolInfo>,
    /// Templates that can be booted.
    pub templates: Vec<TemplateInfo>,
    /// Sandboxes this session holds.
    pub claims: Vec<ClaimInfo>,
    /// Limits and usage.
    pub capacity: CapacityInfo,
}

impl Render for NodeInfoResult {
    fn render(&self) -> String {
        let mut out = format!(
            "mode: {}\ndefault template: {}\ncapacity: {} claimed, {} VMs of {} max, {} claimable",
            self.mode,
            self.default_template,
            self.capacity.live_claims,
            self.capacity.vms,
            self.capacity.max_sandboxes,
            self.capacity.claimable
        );
        if let Some(pool) = &self.pool {
            let _ = write!(
                out,
                "\nwarm pool: {}/{} ready ({} booting) of {} {}",
                pool.warm, pool.target, pool.booting, pool.template, pool.size
            );
            if let Some(error) = &pool.last_error {
                let _ = write!(out, "\nlast pool boot failed: {error}");
            }
        }
        let names: Vec<&str> = self.templates.iter().map(|t| t.name.as_str()).collect();
        let _ = write!(out, "\ntemplates: {}", names.join(", "));
        if self.claims.is_empty() {
            out.push_str("\nclaims: none");
        }
        for claim in &self.claims {
            let _ = write!(
                out,
                "\nclaim {}: {} {}, deadline {}",
                claim.sandbox_id,
                claim.template,
                claim.size.as_deref().unwrap_or("-"),
                claim.deadline.as_deref().unwrap_or("none")
            );
        }
        out
    }
}

/// The engine's results for the sandbox-level tools, in this profile's shapes.
pub mod from_engine {
    use sandbox_engine::node::{Claimed, NodeStatus};
    use sandbox_engine::sandbox::Sandbox;
    use sandbox_engine::util::millis;

    use super::{
        rfc3339, CapacityInfo, ClaimInfo, CreateSandboxResult, NodeInfoResult, PoolInfo,
        ReleaseResult, TemplateInfo,
    };
    use crate::config::ATTACHED_ID;

    /// `create_sandbox`
    pub fn created(claimed: &Claimed) -> CreateSandboxResult {
        let sandbox = &claimed.sandbox;
        let Some(origin) = claimed.origin else {
            return CreateSandboxResult {
                sandbox_id: sandbox.id.to_string(),
                deadline: None,
                ttl_seconds: None,
                template: ATTACHED_ID.to_owned(),
                size: None,
                vcpus: None,
                memory_mib: None,
                warm: true,
                origin: "attached".to_owned(),
                claim_ms: millis(claimed.duration),
                note: Some(
                    "Attach mode: this is the one existing agent the server was started with. \
                     It has no deadline; template, size and ttl_seconds do not apply."
                        .to_owned(),
                ),
            };
        };
        CreateSandboxResult {
            sandbox_id: sandbox.id.to_string(),
            deadline: sandbox.deadline().map(|deadline| rfc3339(deadline.wall)),
            ttl_seconds: claimed.ttl_secs,
            template: sandbox.template.clone(),
            size: sandbox.size.map(|size| size.to_string()),
            vcpus: sandbox.size.map(|size| size.vcpus),
            memory_mib: sandbox.size.map(|size| size.memory_mib),
            warm: origin.is_warm(),
            origin: origin.as_str().to_owned(),
            claim_ms: millis(claimed.duration),
            note: None,
        }
    }

    /// `release`
    pub fn released(sandbox: &Sandbox) -> ReleaseResult {
        let outcome = if sandbox.is_attached() {
            "forgotten by this session; the attached agent and its processes keep running \
             (create_sandbox claims it again)"
        } else {
            "the VM and everything in it was destroyed"
        };
        ReleaseResult {
            sandbox_id: sandbox.id.to_string(),
            outcome: outcome.to_owned(),
        }
    }

    /// `node_info`
    pub fn node_info(status: &NodeStatus) -> NodeInfoResult {
        NodeInfoResult {
            mode: if status.attached { "attach" } else { "launch" }.to_owned(),
            default_template: status.default_template.clone(),
            pool: status.pool.as_ref().map(|pool| PoolInfo {
                template: pool.template.clone(),
                size: pool.size.to_string(),
                target: pool.target,
                warm: pool.warm,
                booting: pool.booting,
                last_error: pool.last_error.clone(),
            }),
            templates: status
                .templates
                .iter()
                .map(|entry| TemplateInfo {
                    name: entry.name.clone(),
                    default_size: entry.size.map(|size| size.to_string()),
                    default: entry.default,
                })
                .collect(),
            claims: status
                .sandboxes
                .iter()
                .map(|sandbox| ClaimInfo {
                    sandbox_id: sandbox.id.to_string(),
                    template: sandbox.template.clone(),
                    size: sandbox.size.map(|size| size.to_string()),
                    claimed_at: rfc3339(sandbox.claimed_at),
                    deadline: sandbox.deadline().map(|deadline| rfc3339(deadline.wall)),
                })
                .collect(),
            capacity: CapacityInfo {
                max_sandboxes: status.capacity.max_sandboxes,
                vms: status.capacity.vms,
                live_claims: status.capacity.live_claims,
                claimable: status.capacity.claimable,
            },
        }
    }
}

/// RFC 3339 in UTC with second precision (`2026-11-29T09:45:39Z`).
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// RFC 3339 in UTC for milliseconds since the epoch.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    rfc3339(UNIX_EPOCH + std::time::Duration::from_secs(unix_ms / 1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day 2000
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_945_539);
        assert_eq!(rfc3339(t), "2026-11-29T09:45:39Z");
        assert_eq!(rfc3339_ms(1_795_945_539_999), "2026-11-29T09:45:39Z");
    }

    #[test]
    fn a_found_text_says_where() {
        let found = WaitForTextResult {
            path: None,
            pid: Some(7),
            offset: 12,
            stream: Some("stderr".into()),
            line: "listening on :80".into(),
            waited_ms: 0,
        };
        assert_eq!(
            found.render(),
            "found at offset 12 of the stderr of process 7 (already there):\nlistening on :80"
        );
        let in_file = WaitForTextResult {
            path: Some("/tmp/log".into()),
            pid: None,
            stream: None,
            waited_ms: 250,
            ..found
        };
        assert_eq!(
            in_file.render(),
            "found at offset 12 of /tmp/log (after 250 ms):\nlistening on :80"
        );
    }

    #[test]
    fn eval_rendering_shows_output_value_and_traceback() {
        let result = EvalCodeResult {
            session: "default".into(),
            language: "python".into(),
            pid: 7,
            evaluations: 2,
            stdout: "hi".into(),
            value: Some("42".into()),
            ..EvalCodeResult::default()
        };
        assert_eq!(
            result.render(),
            "session default (python, pid 7, evaluation 2)\n--- stdout ---\nhi\n\n--- value ---\n42"
        );
        let raised = EvalCodeResult {
            started: true,
            exception: Some(ExceptionInfo {
                type_name: "ValueError".into(),
                message: "bad".into(),
                traceback: "ValueError: bad\n".into(),
            }),
            ..result
        };
        let text = raised.render();
        assert!(text.contains("just started"), "{text}");
        assert!(
            text.ends_with("--- exception ---\nValueError: bad\n"),
            "{text}"
        );
        let json = serde_json::to_value(&raised).unwrap();
        assert_eq!(json["exception"]["type"], "ValueError");
    }
}
