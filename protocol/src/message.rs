//! The envelope: every frame carries a request id and one message.
//!
//! The client picks request ids (non-zero, unique among its in-flight requests).
//! For each request the agent sends any number of [`Event`]s, then exactly one final
//! [`AgentMsg::Reply`] or [`AgentMsg::Error`]. Id 0 is the handshake and
//! connection-level errors (for a frame whose id could not be read).

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::eval::{CloseSessionRequest, EvalReply, EvalRequest};
use crate::files::{
    DirEntry, FileStat, MkdirRequest, PathRequest, PutRequest, RemoveRequest, RenameRequest,
    WriteFileRequest,
};
use crate::hello::{Hello, HelloReply};
use crate::machine::{AgentInfo, Confinement, ReidentifyRequest, ResumedRequest, ShutdownRequest};
use crate::output::{LogsBatch, LogsReply, LogsRequest, OutputChunk};
use crate::port::PortForwardRequest;
use crate::process::{
    ExecReply, ExecRequest, KillRequest, Pid, ProcessDetail, ProcessInfo, PtyInputRequest,
    PtyOpenRequest, PtyResizeRequest, SpawnRequest,
};
use crate::wait::{TextFound, WaitForTextRequest};

/// Names one request and everything sent about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The handshake and connection-level errors.
    pub const CONNECTION: Self = Self(0);
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A frame from the client to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientFrame {
    /// The request this frame is about.
    pub id: RequestId,
    /// What the client says.
    pub msg: ClientMsg,
}

/// What a client can say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// The handshake; must be the first frame, with id 0.
    Hello(Hello),
    /// Start a request under a fresh id.
    Request(Request),
    /// Stop the request with this frame's id: a running exec is killed with all it
    /// started (its cgroup, or its process group on an agent without cgroups), a
    /// follow stream ends. The request still gets its final `Error(Cancelled)`.
    Cancel,
    /// Bytes for the request with this frame's id (the content of a `put`).
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// No more `Data` for the request with this frame's id.
    DataEnd,
    /// The client has consumed this many bytes (cumulative) of the request's event
    /// payloads ([`Event::payload_bytes`]). The agent sends at most
    /// [`STREAM_WINDOW_BYTES`](crate::limits::STREAM_WINDOW_BYTES) beyond the last
    /// count, so a slow reader slows the stream instead of growing either side.
    Consumed(u64),
}

/// A frame from the agent to the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentFrame {
    /// The request this frame answers.
    pub id: RequestId,
    /// What the agent says.
    pub msg: AgentMsg,
}

/// What an agent can say.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMsg {
    /// The answer to a valid `Hello`.
    Hello(HelloReply),
    /// Progress on a request; more frames follow.
    Event(Event),
    /// The request succeeded; nothing more follows for its id.
    Reply(Reply),
    /// The request failed; nothing more follows for its id.
    Error(WireError),
}

/// Everything a client can ask. Append only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Run to completion; reply [`Reply::Exec`].
    Exec(ExecRequest),
    /// Start detached; reply [`Reply::Spawned`].
    Spawn(SpawnRequest),
    /// Replay (and follow) output; reply [`Reply::Logs`].
    Logs(LogsRequest),
    /// List tracked processes; reply [`Reply::Ps`].
    Ps,
    /// Signal a process's cgroup (or process group); reply [`Reply::Done`].
    Kill(KillRequest),
    /// Open a terminal; reply [`Reply::PtyOpened`]. Read it with `Logs { follow }`.
    PtyOpen(PtyOpenRequest),
    /// Type into a terminal; reply [`Reply::Done`].
    PtyInput(PtyInputRequest),
    /// Resize a terminal; reply [`Reply::Done`].
    PtyResize(PtyResizeRequest),
    /// Describe the agent; reply [`Reply::Info`].
    Info,
    /// Replace a file atomically; reply [`Reply::Done`].
    WriteFile(WriteFileRequest),
    /// Read a regular file of at most 1 MiB; reply [`Reply::File`].
    ReadFile(PathRequest),
    /// List one directory level; reply [`Reply::Dir`].
    ListDir(PathRequest),
    /// Describe a path; reply [`Reply::Stat`].
    Stat(PathRequest),
    /// Create a directory; reply [`Reply::Done`].
    Mkdir(MkdirRequest),
    /// Remove a path; reply [`Reply::Done`].
    Remove(RemoveRequest),
    /// Rename a path; reply [`Reply::Done`].
    Rename(RenameRequest),
    /// Stream a file in (see [`crate::files`]); reply [`Reply::Transferred`].
    Put(PutRequest),
    /// Stream a file out as [`Event::Data`]; reply [`Reply::Transferred`].
    Get(PathRequest),
    /// The guest was restored or forked: fix clock, entropy, identity; reply [`Reply::Info`].
    Resumed(ResumedRequest),
    /// Stop everything and power off; reply [`Reply::Done`] first.
    Shutdown(ShutdownRequest),
    /// `ps` with each process's cgroup, what it left behind and OOM kills; reply
    /// [`Reply::PsDetail`]. (A new request rather than new fields in `ps`: see the
    /// crate docs.)
    PsDetail,
    /// How the agent confines processes; reply [`Reply::Confinement`].
    Confinement,
    /// A fork child gets its own hostname and agent token (after `Resumed`); reply
    /// [`Reply::Done`].
    Reidentify(ReidentifyRequest),
    /// Evaluate code in an interpreter session (see [`crate::eval`]); reply
    /// [`Reply::Eval`].
    Eval(EvalRequest),
    /// End an interpreter session; reply [`Reply::Done`].
    CloseSession(CloseSessionRequest),
    /// Wait until a file or a process's output contains a string (see
    /// [`crate::wait`]); reply [`Reply::TextFound`].
    WaitForText(WaitForTextRequest),
    /// Turn this connection into a byte pipe to a guest TCP port (see
    /// [`crate::port`]): the first and only request of its connection; reply
    /// [`Reply::Done`], after which no more frames flow.
    PortForward(PortForwardRequest),
}

impl Request {
    /// A short snake_case name for messages and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Exec(_) => "exec",
            Self::Spawn(_) => "spawn",
            Self::Logs(_) => "logs",
            Self::Ps => "ps",
            Self::Kill(_) => "kill",
            Self::PtyOpen(_) => "pty_open",
            Self::PtyInput(_) => "pty_input",
            Self::PtyResize(_) => "pty_resize",
            Self::Info => "info",
            Self::WriteFile(_) => "write_file",
            Self::ReadFile(_) => "read_file",
            Self::ListDir(_) => "list_dir",
            Self::Stat(_) => "stat",
            Self::Mkdir(_) => "mkdir",
            Self::Remove(_) => "remove",
            Self::Rename(_) => "rename",
            Self::Put(_) => "put",
            Self::Get(_) => "get",
            Self::Resumed(_) => "resumed",
            Self::Shutdown(_) => "shutdown",
            Self::PsDetail => "ps_detail",
            Self::Confinement => "confinement",
            Self::Reidentify(_) => "reidentify",
            Self::Eval(_) => "eval",
            Self::CloseSession(_) => "close_session",
            Self::WaitForText(_) => "wait_for_text",
            Self::PortForward(_) => "port_forward",
        }
    }
}

/// Non-final progress on a request. Append only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A streaming exec started with this pid.
    Started(Pid),
    /// A streaming exec produced output.
    Output(OutputChunk),
    /// A followed process produced output (or the ring dropped some).
    Logs(LogsBatch),
    /// A chunk of a file being sent by `get`.
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// This many bytes of a `put` have been written to the file so far.
    Acked(u64),
}

impl Event {
    /// The bytes of output or file content this event carries: what stream flow
    /// control counts (see [`ClientMsg::Consumed`]).
    pub fn payload_bytes(&self) -> u64 {
        let bytes = match self {
            Self::Output(chunk) => chunk.data.len(),
            Self::Logs(batch) => batch.chunks.iter().map(|chunk| chunk.data.len()).sum(),
            Self::Data(data) => data.len(),
            Self::Started(_) | Self::Acked(_) => 0,
        };
        bytes as u64
    }
}

/// Final successful answers. Append only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Exec finished (or timed out).
    Exec(ExecReply),
    /// Spawn started this process.
    Spawned(Pid),
    /// Logs replayed (or the followed process ended).
    Logs(LogsReply),
    /// Every tracked process.
    Ps(Vec<ProcessInfo>),
    /// The request was carried out and has nothing to return.
    Done,
    /// The terminal is running under this pid.
    PtyOpened(Pid),
    /// About the agent.
    Info(AgentInfo),
    /// A file's whole content.
    File(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A directory's entries, sorted by name.
    Dir(Vec<DirEntry>),
    /// A path's metadata.
    Stat(FileStat),
    /// A `put` or `get` finished: the file's size and permission bits.
    Transferred {
        /// Bytes in the file.
        bytes: u64,
        /// Its permission bits.
        mode: u32,
    },
    /// Every tracked process with its cgroup's state.
    PsDetail(Vec<ProcessDetail>),
    /// How the agent confines processes.
    Confinement(Confinement),
    /// What an evaluation printed and returned.
    Eval(EvalReply),
    /// Where `wait_for_text` found its text.
    TextFound(TextFound),
}
