//! Outputs of the sandstorm tools, shaped the way sandstorm-mcp's results reach a
//! client. sandstorm-mcp is a FastMCP server, which turns a tool's return value into
//! a result like this:
//! - a `dict` is the structured content itself, and its indented JSON is the one
//!   text block ([`object`]);
//! - a `list` is wrapped as `{"result": [...]}` in the structured content, and each
//!   item's indented JSON is a text block of its own ([`list`]).
//!
//! So a client that reads either the structured content or the text's JSON reads
//! the same fields here. The field names are sandstorm's where it has them (`id`,
//! `token`, `tag`, `stdout`, `exit_code`, `found`, `last_excerpt`, ...); the rest say
//! what this server knows besides.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use sandbox_engine::sandbox::{Lineage, Sandbox};

/// A list result: what FastMCP makes of a returned list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Listing<T> {
    /// The items.
    pub result: Vec<T>,
}

/// A sandbox, in `list_sandboxes`, `get_sandbox` and (with its token)
/// `spawn_sandboxes`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SandboxInfo {
    /// The sandbox's id: pass it to the other tools.
    pub id: String,
    /// The template or snapshot tag it was spawned from.
    pub snapshot_tag: String,
    /// "running", "hibernated" or "busy" (being captured by branch_sandbox).
    pub state: String,
    /// When it was spawned, in seconds since the Unix epoch.
    pub created_at_unix: u64,
    /// When it is destroyed (one hour after spawning), in seconds since the Unix
    /// epoch.
    pub expires_at_unix: Option<u64>,
    /// Virtual CPUs.
    pub vcpus: Option<u16>,
    /// Memory in MiB (the VM's hard limit).
    pub memory_mib: Option<u32>,
}

impl SandboxInfo {
    /// What listings show of `sandbox`: never its token.
    pub fn new(sandbox: &Sandbox) -> Self {
        let snapshot_tag = match &sandbox.lineage {
            Lineage::Checkpoint { id, name } => name.clone().unwrap_or_else(|| id.clone()),
            Lineage::Template | Lineage::Fork(_) | Lineage::Attached => sandbox.template.clone(),
        };
        Self {
            id: sandbox.id.to_string(),
            snapshot_tag,
            state: sandbox.status().as_str().to_owned(),
            created_at_unix: unix_secs(sandbox.claimed_at),
            expires_at_unix: sandbox.deadline().map(|deadline| unix_secs(deadline.wall)),
            vcpus: sandbox.size.map(|size| size.vcpus),
            memory_mib: sandbox.size.map(|size| size.memory_mib),
        }
    }
}

/// A sandbox just spawned: its listing plus its token, shown this once.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SpawnedSandbox {
    /// The sandbox.
    #[serde(flatten)]
    pub info: SandboxInfo,
    /// Pass as sandbox_token to exec_command, eval_code, wait_for_text and
    /// ping_sandbox. Keep it: no other tool shows it again.
    pub token: String,
}

impl SpawnedSandbox {
    /// `sandbox` with its token.
    pub fn new(sandbox: &Sandbox) -> Self {
        Self {
            info: SandboxInfo::new(sandbox),
            token: sandbox.token.reveal().to_owned(),
        }
    }
}

/// A template or snapshot, in `list_snapshots`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SnapshotInfo {
    /// Pass as spawn_sandboxes' snapshot_tag.
    pub tag: String,
    /// "template" (built or promoted on this host) or "snapshot" (a running
    /// sandbox's captured state, from branch_sandbox).
    pub kind: String,
    /// When it was made, in seconds since the Unix epoch.
    pub created_at_unix: Option<u64>,
    /// The template its sandboxes run.
    pub template: String,
    /// Virtual CPUs of its sandboxes.
    pub vcpus: Option<u16>,
    /// Memory of its sandboxes, in MiB.
    pub memory_mib: Option<u32>,
    /// For a snapshot: the sandbox it was captured from (it may be gone).
    pub source_sandbox_id: Option<String>,
    /// For a template: whether it is the server's default, which is kept warm.
    pub default: bool,
    /// Sandboxes of it booted and waiting in the warm pool: spawning that many takes
    /// milliseconds.
    pub warm: usize,
    /// Why it cannot be used, if it cannot.
    pub error: Option<String>,
}

/// `branch_sandbox`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BranchInfo {
    /// The new snapshot's tag: pass it to spawn_sandboxes.
    pub tag: String,
    /// Its id on this host (also accepted as snapshot_tag).
    pub snapshot_id: String,
    /// The sandbox captured; it keeps running.
    pub source_sandbox_id: String,
    /// How long the sandbox was paused, in milliseconds.
    pub pause_ms: u64,
    /// The whole capture, in milliseconds.
    pub took_ms: u64,
    /// When it was made, in seconds since the Unix epoch.
    pub created_at_unix: u64,
    /// Bytes it occupies on the host's disk.
    pub bytes_on_disk: u64,
    /// Always "ready": spawn_sandboxes can use it at once.
    pub status: String,
}

/// `exec_command`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ExecCommandResult {
    /// Standard output (invalid UTF-8 replaced): at most 16 KiB as JSON encodes it,
    /// the tail of a failed command, head and tail of a successful one, with a
    /// `[... N omitted ...]` line where bytes were left out.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// The exit status (128 + N for a signal N); null when the run was cut off.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether a stream was cut to its 16 KiB.
    pub truncated: bool,
    /// Whether timeout_secs ended it (it was killed with all it started).
    pub timed_out: bool,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
}

/// `eval_code`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EvalCodeResult {
    /// The repr of the last expression's value; null when the code ends with a
    /// statement or failed.
    pub result: Option<String>,
    /// The traceback of an exception, or why the evaluation stopped; null on
    /// success.
    pub error: Option<String>,
    /// 0 on success, 1 when error is set.
    pub exit_code: i32,
    /// What the code printed (its first 1 MiB).
    pub stdout: String,
    /// What it wrote to standard error.
    pub stderr: String,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
}

/// `wait_for_text`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WaitForTextResult {
    /// Whether the marker appeared before timeout_secs.
    pub found: bool,
    /// How long the call waited, in milliseconds.
    pub elapsed_ms: u64,
    /// When found: the line holding the marker. Otherwise the file's last 256
    /// bytes (empty when it does not exist), to show what is being written.
    pub last_excerpt: String,
}

/// `ping_sandbox`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PingInfo {
    /// The sandbox.
    pub id: String,
    /// True when its agent answered.
    pub ok: bool,
    /// The round trip, in milliseconds.
    pub round_trip_ms: Option<u64>,
    /// The in-guest agent's version.
    pub agent_version: Option<String>,
    /// Milliseconds since the agent started.
    pub uptime_ms: Option<u64>,
    /// 1-minute load average in the guest.
    pub load_1m: Option<f64>,
    /// Guest memory, in bytes.
    pub mem_total_bytes: Option<u64>,
    /// Guest memory available, in bytes.
    pub mem_available_bytes: Option<u64>,
    /// Processes the agent tracks that are still running.
    pub processes_running: Option<u32>,
}

/// `kill_sandbox`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KillInfo {
    /// The sandbox.
    pub id: String,
    /// True: it was destroyed with everything in it.
    pub killed: bool,
}

/// A returned object, as FastMCP returns a `dict`.
pub fn object<T: Serialize>(value: &T) -> CallToolResult {
    with(value, false, None)
}

/// A returned object that is also a failure (a cut-off run), with `message` after
/// its JSON.
pub fn object_error<T: Serialize>(value: &T, message: &str) -> CallToolResult {
    with(value, true, Some(message))
}

/// A returned list, as FastMCP returns one: `{"result": items}`, one text block per
/// item.
pub fn list<T: Serialize>(items: Vec<T>) -> CallToolResult {
    let mut blocks: Vec<ContentBlock> = items.iter().map(|item| text_block(item)).collect();
    if blocks.is_empty() {
        // An empty list's JSON, so a client that reads the text (and parses it) gets
        // an answer: a result with no content at all reads as a failure to some.
        blocks.push(ContentBlock::text("[]"));
    }
    let mut result = with(&Listing { result: items }, false, None);
    result.content = blocks;
    result
}

fn with<T: Serialize>(value: &T, is_error: bool, message: Option<&str>) -> CallToolResult {
    let json = match serde_json::to_value(value) {
        Ok(json) => json,
        Err(error) => {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "The result could not be encoded: {error}"
            ))])
        }
    };
    let mut result = if is_error {
        CallToolResult::structured_error(json)
    } else {
        CallToolResult::structured(json)
    };
    let mut content = vec![text_block(value)];
    if let Some(message) = message {
        content.push(ContentBlock::text(format!("error: {message}")));
    }
    result.content = content;
    result
}

/// The indented JSON of `value`, FastMCP's text for a returned value.
fn text_block<T: Serialize>(value: &T) -> ContentBlock {
    ContentBlock::text(
        serde_json::to_string_pretty(value)
            .unwrap_or_else(|error| format!("(cannot encode the result: {error})")),
    )
}

/// Seconds since the Unix epoch (0 before it).
pub fn unix_secs(time: std::time::SystemTime) -> u64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_wrapped_as_result_with_one_text_block_per_item() {
        let result = list(vec![
            KillInfo {
                id: "a".into(),
                killed: true,
            },
            KillInfo {
                id: "b".into(),
                killed: true,
            },
        ]);
        let structured = result.structured_content.clone().unwrap();
        assert_eq!(structured["result"][1]["id"], "b");
        assert_eq!(result.content.len(), 2);
        let first: serde_json::Value =
            serde_json::from_str(&result.content[0].as_text().unwrap().text).unwrap();
        assert_eq!(first, serde_json::json!({"id": "a", "killed": true}));
        assert_ne!(result.is_error, Some(true));
    }

    /// Regression: an empty listing had no text block at all.
    #[test]
    fn an_empty_list_has_one_text_block_of_its_json() {
        let result = list(Vec::<KillInfo>::new());
        assert_eq!(result.content.len(), 1);
        assert_eq!(result.content[0].as_text().unwrap().text, "[]");
        assert_eq!(
            result.structured_content.unwrap(),
            serde_json::json!({"result": []})
        );
    }

    #[test]
    fn an_object_is_its_own_structured_content_and_its_json_text() {
        let result = object(&KillInfo {
            id: "a".into(),
            killed: true,
        });
        let structured = result.structured_content.clone().unwrap();
        let text: serde_json::Value =
            serde_json::from_str(&result.content[0].as_text().unwrap().text).unwrap();
        assert_eq!(structured, text);
        let failed = object_error(
            &KillInfo {
                id: "a".into(),
                killed: false,
            },
            "why",
        );
        assert_eq!(failed.is_error, Some(true));
        assert_eq!(failed.content[1].as_text().unwrap().text, "error: why");
    }

    #[test]
    fn a_spawned_sandbox_carries_its_token_next_to_the_listing_fields() {
        let schema = serde_json::to_value(schemars::schema_for!(SpawnedSandbox)).unwrap();
        let properties = schema["properties"].as_object().unwrap();
        assert!(properties.contains_key("id") && properties.contains_key("token"));
        let listing = serde_json::to_value(schemars::schema_for!(SandboxInfo)).unwrap();
        assert!(!listing["properties"]
            .as_object()
            .unwrap()
            .contains_key("token"));
    }
}
