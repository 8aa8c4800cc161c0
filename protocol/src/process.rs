//! Requests and replies about processes: exec, spawn, pty, ps, kill.

use serde::{Deserialize, Serialize};

/// A process id in the guest. A newtype so it is never confused with a request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pid(pub i32);

impl std::fmt::Display for Pid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// An argument vector; `argv[0]` is looked up in `PATH`.
    Argv(Vec<String>),
    /// A shell command line, run as `/bin/sh -c LINE`.
    Shell(String),
}

impl Command {
    /// The argument vector the agent executes.
    pub fn to_argv(&self) -> Vec<String> {
        match self {
            Self::Argv(argv) => argv.clone(),
            Self::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        }
    }
}

/// Who to run as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum User {
    /// A user name, looked up in the guest's `/etc/passwd`.
    Name(String),
    /// A numeric uid; the gid is the passwd entry's when there is one, else the same number.
    Uid(u32),
}

/// How a process starts: shared by exec, spawn and pty.
///
/// The environment starts clean (see the agent docs for the defaults:
/// `PATH`, `HOME`, `USER`, `LOGNAME`, `SHELL`, `TERM`, `LANG`), then the template's
/// variables ([`ImageConfig`](crate::ImageConfig)) are applied, then `env`, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSpec {
    /// What to run; `None` means the user's login shell (pty only).
    pub command: Option<Command>,
    /// Variables to set, applied after the defaults (the agent's, then the
    /// template's); later entries win.
    pub env: Vec<(String, String)>,
    /// Working directory; defaults to the template's, else the user's home, else `/`.
    pub cwd: Option<String>,
    /// Who to run as; defaults to the template's user, else the agent's own.
    pub user: Option<User>,
}

impl ProcessSpec {
    /// A spec that runs `command` with every default.
    pub fn new(command: Command) -> Self {
        Self {
            command: Some(command),
            env: Vec::new(),
            cwd: None,
            user: None,
        }
    }
}

/// Run a command to completion and collect its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// What to run and how.
    pub spec: ProcessSpec,
    /// Bytes written to the child's stdin, which is then closed.
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// Deadline in milliseconds; `None` or anything above the maximum means
    /// [`crate::limits::EXEC_DEADLINE_SECS`].
    pub timeout_ms: Option<u64>,
    /// Send output as [`crate::Event::Output`] events while it runs instead of in the reply.
    pub stream: bool,
}

/// How a process ended: the exit code and the terminating signal are separate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code when the process exited normally.
    pub code: Option<i32>,
    /// The signal number when a signal terminated it.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The conventional shell status: the code, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 255,
        }
    }
}

/// The reply to an [`ExecRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecReply {
    /// The child's pid (also its process group).
    pub pid: Pid,
    /// The first [`crate::limits::EXEC_OUTPUT_CAP_BYTES`] of stdout (empty when streamed).
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    /// The first [`crate::limits::EXEC_OUTPUT_CAP_BYTES`] of stderr (empty when streamed).
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    /// Stdout went past the cap; the rest was read and dropped.
    pub stdout_truncated: bool,
    /// Stderr went past the cap; the rest was read and dropped.
    pub stderr_truncated: bool,
    /// How it ended; `None` only if it could not be reaped after a timeout.
    pub exit: Option<ExitStatus>,
    /// The deadline passed and the process was killed with all it started (its
    /// cgroup, or its process group on an agent without cgroups).
    pub timed_out: bool,
    /// Wall time from start to the reply, in microseconds.
    pub duration_us: u64,
}

/// Start a detached process whose output goes to its ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// What to run and how.
    pub spec: ProcessSpec,
}

/// Open a terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOpenRequest {
    /// What to run (`command: None` runs the login shell) and how.
    pub spec: ProcessSpec,
    /// Terminal size.
    pub size: WindowSize,
}

/// A terminal size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Bytes typed into a terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyInputRequest {
    /// The terminal's process.
    pub pid: Pid,
    /// Raw bytes for the terminal.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A new terminal size; the child gets `SIGWINCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyResizeRequest {
    /// The terminal's process.
    pub pid: Pid,
    /// The new size.
    pub size: WindowSize,
}

/// The largest signal number a [`KillRequest`] may carry (Linux's `SIGRTMAX`).
pub const MAX_SIGNAL: i32 = 64;

/// Send a signal to everything a tracked process started: every process in its
/// cgroup (also after it exited, to what it left behind), or its process group on an
/// agent without cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillRequest {
    /// The tracked process.
    pub pid: Pid,
    /// The signal number, `1..=MAX_SIGNAL` (`SIGKILL` is 9). 0 and anything out of
    /// range are refused as a bad request: shorthands such as "0 means kill" belong to
    /// the tools that promise them (`sandboxctl`, the MCP server), not to the wire.
    pub signal: i32,
}

/// How a tracked process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessKind {
    /// Run to completion by an exec request.
    Exec,
    /// Detached by a spawn request.
    Spawn,
    /// Attached to a terminal.
    Pty,
    /// The interpreter of an `eval` session (see [`crate::eval`]).
    Session,
}

impl ProcessKind {
    /// The lowercase name used in human and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Spawn => "spawn",
            Self::Pty => "pty",
            Self::Session => "session",
        }
    }
}

/// Where a tracked process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessState {
    /// Not yet reaped.
    Running,
    /// Reaped with this status.
    Exited(ExitStatus),
}

/// One row of `ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its pid, which is also its process group.
    pub pid: Pid,
    /// How it was started.
    pub kind: ProcessKind,
    /// What it runs.
    pub argv: Vec<String>,
    /// Running or exited.
    pub state: ProcessState,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Exit time, milliseconds since the Unix epoch.
    pub ended_at_ms: Option<u64>,
}

/// The OOM killer struck inside a process's cgroup (agents that confine workloads
/// in cgroups v2 only), as [`ProcessDetail`] reports it.
///
/// Not an event on the exec stream: a client that predates it could not decode the
/// frame, and the agent cannot tell which clients do (the handshake carries no client
/// capabilities). So an exec's reply stays as it was (the exit status shows
/// `SIGKILL`), and a client that knows `ps_detail` asks it about that pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomKill {
    /// The tracked process whose cgroup it was.
    pub pid: Pid,
    /// How many processes in that cgroup the OOM killer ended (`oom_kill` of its
    /// `memory.events`).
    pub kills: u64,
    /// The memory limit in force for that cgroup (the lowest `memory.max` from it up
    /// to the workload parent), when there is one.
    pub memory_max_bytes: Option<u64>,
}

impl std::fmt::Display for OomKill {
    /// The one wording every front end uses: "killed by the OOM killer (memory limit
    /// 448 MiB)", with the count when more than one process was killed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("killed by the OOM killer")?;
        if self.kills > 1 {
            write!(f, " ({} processes", self.kills)?;
        } else {
            f.write_str(" (")?;
        }
        match self.memory_max_bytes {
            Some(bytes) if self.kills > 1 => write!(f, ", memory limit {} MiB)", bytes >> 20),
            Some(bytes) => write!(f, "memory limit {} MiB)", bytes >> 20),
            None if self.kills > 1 => f.write_str(")"),
            None => f.write_str("no memory limit)"),
        }
    }
}

/// One row of `ps_detail`: the `ps` row and what the process's cgroup holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDetail {
    /// The same row `ps` gives.
    pub info: ProcessInfo,
    /// Its cgroup, relative to the cgroup2 mount (`/workload/exec-3`); `None` when the
    /// agent confines by process group only.
    pub cgroup: Option<String>,
    /// Processes alive in its cgroup now, the tracked one included: after an exit,
    /// these are what it left behind (`kill` of its pid ends them all).
    pub live_pids: u32,
    /// Set once the OOM killer struck in its cgroup.
    pub oom: Option<OomKill>,
}
