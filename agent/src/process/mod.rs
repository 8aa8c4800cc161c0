//! The process layer: one table of tracked processes, one reaper, and the ways a
//! process gets started (exec, spawn, pty; interpreter sessions through the same
//! launch, see [`crate::session`]) and observed (logs, ps, kill).
//!
//! # Layout
//! - [`table`]: the process table and each process's record (ring, exit, progress).
//! - [`reaper`]: the single `waitpid(-1)` loop; it hands exit statuses to the table.
//! - [`gate`]: the spawn gate that serialises child starts against each other and
//!   the reaper, and the only way to lower the agent's OOM shield for a start.
//! - [`cgroup`]: confinement: the workload cgroup tree with its memory and pids
//!   limits, one cgroup per process, killing a cgroup, OOM kills; or process groups
//!   where the agent is not the machine's init.
//! - [`remover`]: removes the cgroups of forgotten processes on a thread of its own,
//!   so no sweep holds up the runtime with `rmdir`s.
//! - [`launch`]: turns a [`ProcessSpec`](sandbox_protocol::ProcessSpec) into a running
//!   child: clean environment, user, cwd, its own process group or session, its own
//!   cgroup joined before `exec`.
//! - [`defaults`]: the template's defaults (its image's `Env`, `WorkingDir`, `User`)
//!   for what a request leaves out; the table holds them, [`launch`] applies them.
//! - [`pump`]: moves a child's output from its pipe or terminal ([`source`]) into its record.
//! - [`exec`], [`pty`], [`logs`]: the request handlers built on the above.
//!
//! # Why one reaper
//! Children are started with `clone3` or `std::process::Command` (see [`launch`]),
//! and never waited for by their starter: only [`reaper`] ever calls `waitpid` on a
//! child that reached `exec`, so no two waiters can steal each
//! other's exit status, and orphans re-parented to the agent are reaped too. Starting
//! a child holds the table's spawn gate ([`gate`]); the reaper holds the same gate
//! while it calls `waitpid`, so a child is always in the table before its exit status
//! can be collected (and std's own wait for a child whose `exec` failed never races us).

pub mod buffers;
pub mod cgroup;
pub mod defaults;
pub mod exec;
pub mod gate;
pub mod kill;
pub mod launch;
pub mod logs;
pub mod passwd;
pub mod pty;
pub mod pump;
pub mod reaper;
pub mod remover;
pub mod source;
pub mod table;

use std::io;

use sandbox_protocol::{ErrorKind, Pid, WireError};

use crate::ring::CursorAhead;

/// Why a process request failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// No tracked process has this pid (it may have been forgotten).
    #[error("No tracked process with pid {pid}")]
    NotFound {
        /// The pid asked for.
        pid: Pid,
    },
    /// A terminal request named a process that is not a terminal.
    #[error("Process {pid} is not a terminal")]
    NotATerminal {
        /// The pid asked for.
        pid: Pid,
    },
    /// The process has already exited.
    #[error("Process {pid} has exited")]
    Exited {
        /// The pid asked for.
        pid: Pid,
    },
    /// The command or one of its settings is unusable.
    #[error("Invalid {what}: {reason}")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The working directory cannot be used.
    #[error("Cannot use {path} as the working directory")]
    NoDirectory {
        /// The directory asked for.
        path: String,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The user named does not exist in the guest.
    #[error("Unknown user {user}")]
    UnknownUser {
        /// The name or uid asked for.
        user: String,
    },
    /// The group an image's `User` names does not exist in the guest.
    #[error("Unknown group {group}")]
    UnknownGroup {
        /// The name asked for.
        group: String,
    },
    /// Starting the program failed.
    #[error("Cannot start {program}")]
    Start {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// Sending a signal failed.
    #[error("Cannot send signal {signal} to the processes of {pid}")]
    Signal {
        /// The process group.
        pid: Pid,
        /// The signal.
        signal: i32,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// The process's cgroup could not be made or joined.
    #[error("Cannot make a cgroup for {program}")]
    Cgroup {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// Opening a pseudo-terminal failed.
    #[error("Cannot open a terminal")]
    OpenPty(#[source] io::Error),
    /// Writing to or resizing a terminal failed.
    #[error("Terminal I/O on process {pid}")]
    PtyIo {
        /// The terminal's process.
        pid: Pid,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A logs cursor beyond the output.
    #[error(transparent)]
    Cursor(#[from] CursorAhead),
}

impl ProcessError {
    /// The error as the client sees it: kind, the whole message chain, errno.
    pub fn to_wire(&self) -> WireError {
        let (kind, source) = match self {
            Self::NotFound { .. } => (ErrorKind::NotFound, None),
            Self::NotATerminal { .. } => (ErrorKind::WrongType, None),
            Self::Exited { .. } => (ErrorKind::NotFound, None),
            Self::Invalid { .. } | Self::Cursor(_) => (ErrorKind::BadRequest, None),
            Self::UnknownUser { .. } | Self::UnknownGroup { .. } => (ErrorKind::NotFound, None),
            Self::Start { error, .. }
            | Self::Cgroup { error, .. }
            | Self::PtyIo { error, .. }
            | Self::OpenPty(error)
            | Self::NoDirectory { error, .. } => (io_kind(error), Some(error)),
            Self::Signal { error, .. } => match error.raw_os_error() {
                Some(libc::EINVAL) => (ErrorKind::BadRequest, Some(error)),
                _ => (io_kind(error), Some(error)),
            },
        };
        let message = match source {
            Some(error) => format!("{self}: {error}"),
            None => self.to_string(),
        };
        WireError {
            kind,
            message,
            errno: source.and_then(io::Error::raw_os_error),
        }
    }
}

fn io_kind(error: &io::Error) -> ErrorKind {
    WireError::from_io("", error).kind
}
