//! JSON views of protocol types for `--json` output. The protocol types stay free of
//! JSON concerns (their serde shape is the postcard wire format); these views pick
//! stable snake_case names and turn output bytes into text (invalid UTF-8 replaced).

use serde::Serialize;

use sandbox_protocol::{
    AgentInfo, ExitStatus, HelloReply, LogsBatch, OutputChunk, ProcessInfo, ProcessState, Stream,
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
}

impl<'a> From<&'a ProcessInfo> for ProcessView<'a> {
    fn from(info: &'a ProcessInfo) -> Self {
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
}

impl<'a> InfoView<'a> {
    pub fn new(info: &'a AgentInfo, hello: &'a HelloReply) -> Self {
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
