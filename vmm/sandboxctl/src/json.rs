//! JSON views of protocol types for `--json` output. The protocol types stay free of
//! JSON concerns (their serde shape is the postcard wire format); these views pick
//! stable snake_case names and turn output bytes into text (invalid UTF-8 replaced).

use serde::Serialize;

use sandbox_protocol::{
    AgentInfo, Confinement, EvalReply, ExitStatus, HelloReply, LogsBatch, OutputChunk,
    ProcessDetail, ProcessState, Stream, TextFound,
};

/// One row of `ps --json`.
#[derive(Debug, Serialize)]
pub(crate) struct ProcessView<'a> {
    pub pid: i32,
    pub kind: &'static str,
    pub argv: &'a [String],
    pub state: &'static str,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    /// Its cgroup, when the agent confines in cgroups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<&'a str>,
    /// Processes alive in its cgroup (after an exit: what it left behind).
    pub live_pids: u32,
    /// Processes in its cgroup the OOM killer ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// The memory limit they ran under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_memory_max_bytes: Option<u64>,
}

impl<'a> From<&'a ProcessDetail> for ProcessView<'a> {
    fn from(row: &'a ProcessDetail) -> Self {
        let info = &row.info;
        let (state, exit) = match info.state {
            ProcessState::Running => ("running", None),
            ProcessState::Exited(status) => ("exited", Some(status)),
        };
        Self {
            pid: info.pid.0,
            kind: info.kind.as_str(),
            argv: &info.argv,
            state,
            exit_code: exit.and_then(|s| s.code),
            signal: exit.and_then(|s| s.signal),
            started_at_ms: info.started_at_ms,
            ended_at_ms: info.ended_at_ms,
            cgroup: row.cgroup.as_deref(),
            live_pids: row.live_pids,
            oom_kills: row.oom.map(|oom| oom.kills),
            oom_memory_max_bytes: row.oom.and_then(|oom| oom.memory_max_bytes),
        }
    }
}

/// How a process ended.
#[derive(Debug, Serialize)]
pub(crate) struct ExitView {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl From<ExitStatus> for ExitView {
    fn from(status: ExitStatus) -> Self {
        Self {
            code: status.code,
            signal: status.signal,
        }
    }
}

/// One output chunk.
#[derive(Debug, Serialize)]
pub(crate) struct ChunkView {
    pub stream: &'static str,
    pub offset: u64,
    pub data: String,
}

impl From<&OutputChunk> for ChunkView {
    fn from(chunk: &OutputChunk) -> Self {
        Self {
            stream: stream_name(chunk.stream),
            offset: chunk.offset,
            data: String::from_utf8_lossy(&chunk.data).into_owned(),
        }
    }
}

/// A logs batch (an event while following, or the final reply with `done`).
#[derive(Debug, Serialize)]
pub(crate) struct LogsView {
    pub chunks: Vec<ChunkView>,
    pub dropped: u64,
    pub end: u64,
    /// True on the final object: the process ended (following) or the replay is over.
    pub done: bool,
    pub exit: Option<ExitView>,
}

impl LogsView {
    pub fn new(batch: &LogsBatch, done: bool, exit: Option<ExitStatus>) -> Self {
        Self {
            chunks: batch.chunks.iter().map(ChunkView::from).collect(),
            dropped: batch.dropped,
            end: batch.end,
            done,
            exit: exit.map(ExitView::from),
        }
    }
}

/// `info --json`.
#[derive(Debug, Serialize)]
pub(crate) struct InfoView<'a> {
    pub agent_version: &'a str,
    pub protocol_version: u32,
    pub boot_id: &'a str,
    pub capabilities: &'a [String],
    pub is_init: bool,
    pub uptime_ms: u64,
    pub generation: u64,
    pub load: [f64; 3],
    pub mem_total_bytes: u64,
    pub mem_available_bytes: u64,
    pub processes_running: u32,
    pub processes_exited: u32,
    /// How processes are confined; absent from an agent that predates `confinement`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confinement: Option<ConfinementView<'a>>,
}

/// `info --json`'s `confinement`.
#[derive(Debug, Serialize)]
pub(crate) struct ConfinementView<'a> {
    /// `cgroups` or `process_groups`.
    pub mode: &'static str,
    pub agent_cgroup: Option<&'a str>,
    pub workload_cgroup: Option<&'a str>,
    pub memory_max_bytes: Option<u64>,
    pub pids_max: Option<u64>,
    /// Why process groups, when so.
    pub reason: Option<&'a str>,
}

impl<'a> From<&'a Confinement> for ConfinementView<'a> {
    fn from(c: &'a Confinement) -> Self {
        Self {
            mode: c.mode.as_str(),
            agent_cgroup: c.agent_cgroup.as_deref(),
            workload_cgroup: c.workload_cgroup.as_deref(),
            memory_max_bytes: c.memory_max_bytes,
            pids_max: c.pids_max,
            reason: c.reason.as_deref(),
        }
    }
}

impl<'a> InfoView<'a> {
    pub fn new(
        info: &'a AgentInfo,
        hello: &'a HelloReply,
        confinement: Option<&'a Confinement>,
    ) -> Self {
        Self {
            agent_version: &info.agent_version,
            protocol_version: info.protocol_version,
            boot_id: &info.boot_id,
            capabilities: &hello.capabilities,
            is_init: info.is_init,
            uptime_ms: info.uptime_ms,
            generation: info.generation,
            load: info.load,
            mem_total_bytes: info.mem_total_bytes,
            mem_available_bytes: info.mem_available_bytes,
            processes_running: info.processes_running,
            processes_exited: info.processes_exited,
            confinement: confinement.map(ConfinementView::from),
        }
    }
}

/// `wait-for --json`.
#[derive(Debug, Serialize)]
pub(crate) struct FoundView<'a> {
    /// Byte offset of the match in the file or the process's output.
    pub offset: u64,
    /// `stdout`, `stderr` or `pty` for a process; absent for a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<&'static str>,
    /// The line holding the match (capped, invalid UTF-8 replaced).
    pub line: &'a str,
    pub waited_ms: u64,
}

impl<'a> From<&'a TextFound> for FoundView<'a> {
    fn from(found: &'a TextFound) -> Self {
        Self {
            offset: found.offset,
            stream: found.stream.map(stream_name),
            line: &found.line,
            waited_ms: found.waited_ms,
        }
    }
}

pub(crate) fn stream_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
        Stream::Pty => "pty",
    }
}

/// An exception, in `eval --json`.
#[derive(Debug, Serialize)]
pub(crate) struct ExceptionView<'a> {
    #[serde(rename = "type")]
    pub type_name: &'a str,
    pub message: &'a str,
    pub traceback: &'a str,
}

/// `eval --json`.
#[derive(Debug, Serialize)]
pub(crate) struct EvalView<'a> {
    pub session: &'a str,
    pub language: &'static str,
    pub pid: i32,
    /// This evaluation started the session's interpreter.
    pub started: bool,
    pub evaluations: u64,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Python: the repr of a trailing expression that is not None.
    pub value: Option<&'a str>,
    pub value_truncated: bool,
    pub exception: Option<ExceptionView<'a>>,
    /// sh: `$?`.
    pub status: Option<i32>,
    pub timed_out: bool,
    /// How the interpreter died during the evaluation, if it did.
    pub died: Option<ExitView>,
    pub duration_ms: u64,
}

impl<'a> From<&'a EvalReply> for EvalView<'a> {
    fn from(reply: &'a EvalReply) -> Self {
        Self {
            session: &reply.session.name,
            language: reply.session.language.as_str(),
            pid: reply.session.pid.0,
            started: reply.session.started,
            evaluations: reply.session.evaluations,
            stdout: String::from_utf8_lossy(&reply.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
            stdout_truncated: reply.stdout_truncated,
            stderr_truncated: reply.stderr_truncated,
            value: reply.value.as_deref(),
            value_truncated: reply.value_truncated,
            exception: reply.exception.as_ref().map(|e| ExceptionView {
                type_name: &e.type_name,
                message: &e.message,
                traceback: &e.traceback,
            }),
            status: reply.status,
            timed_out: reply.timed_out,
            died: reply.died.map(ExitView::from),
            duration_ms: reply.duration_ms,
        }
    }
}
