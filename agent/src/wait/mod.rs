//! `wait_for_text`: wait until a file, or a tracked process's output, contains a
//! string, without a shell polling for it.
//!
//! # How a wait goes
//! The request is checked first ([`Limits::check`]): a non-empty text of at most
//! [`MAX_WAIT_TEXT_BYTES`], a timeout of at most [`WAIT_MAX_TIMEOUT_MS`]. Then:
//! - a file ([`file`]): inotify watches its directory (for creation, rename and
//!   removal) and the file itself (for writes), and each change scans only what was
//!   appended since the last scan ([`read`]); the scan starts over from offset 0 when
//!   the file was replaced, shrank, or rewritten under the scanned offset. The reads
//!   are blocking I/O on tokio's blocking pool, in bounded steps.
//! - a process's output ([`output`]): its ring is read from the oldest byte held and
//!   then as the record's progress changes, as `logs --follow` does; each stream is
//!   scanned on its own, so a match never mixes stdout and stderr bytes.
//!
//! Both feed a [`scan::Scanner`], which finds matches that span reads in bounded
//! memory and keeps the line around the match. The reply says where the text starts
//! (its absolute offset), in which stream, the line holding it (at most
//! [`WAIT_LINE_CAP_BYTES`], lossy UTF-8) and how long the agent waited.
//!
//! # Ends
//! Found: `TextFound`. The deadline: `TimedOut`, saying what was seen. A process
//! that exits without the text: `NotFound` once its final output is scanned. A
//! cancelled request (client `Cancel` or disconnect) aborts the task: dropping it
//! drops the inotify instance (its descriptor and every watch) or the process
//! subscription; a read step already on the blocking pool finishes its bounded step
//! and closes its file.
//!
//! # A file's directory that does not exist yet
//! The wait watches the nearest ancestor that exists and moves down as directories
//! appear (`mkdir -p` of the whole path is seen), so waiting on a log file of a job
//! that has not created its output directory yet just works. An ancestor that exists
//! but is not a directory is an error at once: the path can never exist.

pub mod file;
pub mod output;
pub mod read;
pub mod scan;

use std::io;
use std::time::Duration;

use sandbox_protocol::wait::{
    MAX_WAIT_TEXT_BYTES, WAIT_DEFAULT_TIMEOUT_MS, WAIT_LINE_CAP_BYTES, WAIT_MAX_TIMEOUT_MS,
};
use sandbox_protocol::{
    ErrorKind, ExitStatus, Pid, Stream, TextFound, WaitForTextRequest, WaitTarget, WireError,
};
use tokio::time::Instant;

use crate::process::table::ProcessTable;
use scan::Hit;

/// Why a wait failed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// Nothing to look for: an empty text would match at once, anywhere.
    #[error("The text to wait for is empty")]
    EmptyText,
    /// The text is longer than the protocol allows.
    #[error("The text to wait for is {len} bytes, over the limit of {MAX_WAIT_TEXT_BYTES} bytes")]
    TextTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The timeout is longer than the protocol allows.
    #[error(
        "A timeout of {timeout_ms} ms is over the 5-minute cap on wait_for_text \
         ({WAIT_MAX_TIMEOUT_MS} ms); wait again after it times out"
    )]
    TimeoutTooLong {
        /// The timeout asked for.
        timeout_ms: u64,
    },
    /// Paths must be absolute, so their meaning never depends on the agent's cwd.
    #[error("Path {path} is not absolute")]
    NotAbsolute {
        /// The path as given.
        path: String,
    },
    /// The path names a directory.
    #[error("{path} is a directory; wait_for_text reads a regular file")]
    IsDirectory {
        /// The path.
        path: String,
    },
    /// The path names a device, FIFO or socket (never opened: a FIFO would block).
    #[error("{path} is a {kind}; wait_for_text reads regular files only")]
    NotRegular {
        /// The path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// [`file::MAX_FILE_WAITS`] file waits are in progress already.
    #[error(
        "{max} waits for files are in progress, the most the agent keeps at once (each \
         holds an inotify instance, which the workload needs too); try again when one ends"
    )]
    TooManyFileWaits {
        /// The cap.
        max: usize,
    },
    /// An ancestor of the path exists but is not a directory.
    #[error("{ancestor} is not a directory, so {path} cannot exist")]
    NotDirectory {
        /// The ancestor.
        ancestor: String,
        /// The path waited for.
        path: String,
    },
    /// No tracked process has this pid.
    #[error("No tracked process with pid {pid}")]
    UnknownPid {
        /// The pid asked for.
        pid: Pid,
    },
    /// The process ended and its whole output was scanned without a match.
    #[error("Process {pid} exited ({}) without printing {text}{}", ending(status), lost(*dropped))]
    Exited {
        /// The process.
        pid: Pid,
        /// How it ended.
        status: ExitStatus,
        /// The text, quoted for the message.
        text: String,
        /// Output the ring no longer held when it was read.
        dropped: u64,
    },
    /// The deadline passed.
    #[error("Timed out after {} waiting for {text} in {target} ({seen})", seconds(*waited_ms))]
    TimedOut {
        /// What was watched: a path, or "the output of process N".
        target: String,
        /// The text, quoted for the message.
        text: String,
        /// How long the wait lasted.
        waited_ms: u64,
        /// What the wait saw, e.g. "scanned 120 bytes".
        seen: String,
    },
    /// An inotify instance or watch could not be set up.
    #[error("Cannot watch {path}")]
    Watch {
        /// What was to be watched.
        path: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A system call on the file failed.
    #[error("Cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
}

impl WaitError {
    /// The error as the client sees it: kind, message (with the OS error), errno.
    pub fn to_wire(&self) -> WireError {
        let kind = match self {
            Self::EmptyText | Self::TimeoutTooLong { .. } | Self::NotAbsolute { .. } => {
                ErrorKind::BadRequest
            }
            Self::TextTooLong { .. } => ErrorKind::TooLarge,
            Self::IsDirectory { .. } | Self::NotRegular { .. } | Self::NotDirectory { .. } => {
                ErrorKind::WrongType
            }
            Self::UnknownPid { .. } | Self::Exited { .. } => ErrorKind::NotFound,
            Self::TimedOut { .. } => ErrorKind::TimedOut,
            Self::TooManyFileWaits { .. } => ErrorKind::Busy,
            // The kernel's cap on inotify instances or watches: try again later.
            Self::Watch { error, .. }
                if matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENOSPC)) =>
            {
                ErrorKind::Busy
            }
            Self::Watch { error, .. } | Self::Io { error, .. } => {
                WireError::from_io("", error).kind
            }
        };
        match self {
            Self::Watch { error, .. } | Self::Io { error, .. } => WireError {
                kind,
                message: format!("{self}: {error}"),
                errno: error.raw_os_error(),
            },
            _ => WireError::new(kind, self.to_string()),
        }
    }
}

/// "code 1" or "killed by signal 9".
fn ending(status: &ExitStatus) -> String {
    match (status.code, status.signal) {
        (Some(code), _) => format!("code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "status unknown".to_owned(),
    }
}

/// The note on output the ring lost before it could be scanned.
fn lost(dropped: u64) -> String {
    match dropped {
        0 => String::new(),
        n => format!(" in the output still held ({n} earlier bytes were dropped from its ring)"),
    }
}

/// Milliseconds as "2.5 s".
fn seconds(ms: u64) -> String {
    format!("{:.1} s", Duration::from_millis(ms).as_secs_f64())
}

/// The text for messages: quoted, and cut after 80 characters.
pub fn quoted(text: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// A checked request: what to look for and until when.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The text, 1 to [`MAX_WAIT_TEXT_BYTES`] bytes.
    pub text: String,
    /// When to give up.
    pub deadline: Instant,
    /// When the wait started.
    pub started: Instant,
}

impl Limits {
    /// Checks the text and the timeout of `request`; the deadline runs from now.
    pub fn check(request: &WaitForTextRequest) -> Result<Self, WaitError> {
        if request.text.is_empty() {
            return Err(WaitError::EmptyText);
        }
        if request.text.len() > MAX_WAIT_TEXT_BYTES {
            return Err(WaitError::TextTooLong {
                len: request.text.len(),
            });
        }
        let timeout_ms = request.timeout_ms.unwrap_or(WAIT_DEFAULT_TIMEOUT_MS);
        if timeout_ms > WAIT_MAX_TIMEOUT_MS {
            return Err(WaitError::TimeoutTooLong { timeout_ms });
        }
        let started = Instant::now();
        Ok(Self {
            text: request.text.clone(),
            deadline: started + Duration::from_millis(timeout_ms),
            started,
        })
    }

    /// A scanner for the text.
    pub fn scanner(&self) -> scan::Scanner {
        scan::Scanner::new(self.text.as_bytes(), WAIT_LINE_CAP_BYTES)
    }

    /// Milliseconds since the wait started.
    pub fn waited_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The reply for `hit`; `at_once` when it was found before any waiting.
    pub fn found(&self, hit: &Hit, stream: Option<Stream>, at_once: bool) -> TextFound {
        TextFound {
            offset: hit.offset,
            stream,
            line: hit.line(&self.text, WAIT_LINE_CAP_BYTES),
            waited_ms: if at_once { 0 } else { self.waited_ms() },
        }
    }

    /// The timeout error for `target`, saying what was `seen`.
    pub fn timed_out(&self, target: String, seen: String) -> WaitError {
        WaitError::TimedOut {
            target,
            text: quoted(&self.text),
            waited_ms: self.waited_ms(),
            seen,
        }
    }
}

/// Handles one `wait_for_text` request.
pub async fn wait_for_text(
    table: &ProcessTable,
    request: WaitForTextRequest,
) -> Result<TextFound, WaitError> {
    let limits = Limits::check(&request)?;
    match request.target {
        WaitTarget::File(path) => {
            let path = crate::files::absolute_path(&path).map_err(|_| WaitError::NotAbsolute {
                path: String::from_utf8_lossy(&path).into_owned(),
            })?;
            file::wait(path, &limits).await
        }
        WaitTarget::Output(pid) => output::wait(table, pid, &limits).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str, timeout_ms: Option<u64>) -> WaitForTextRequest {
        WaitForTextRequest {
            target: WaitTarget::Output(Pid(1)),
            text: text.into(),
            timeout_ms,
        }
    }

    #[test]
    fn bad_texts_and_timeouts_are_refused_with_their_kind() {
        let kind = |r: &WaitForTextRequest| Limits::check(r).unwrap_err().to_wire().kind;
        assert_eq!(kind(&request("", None)), ErrorKind::BadRequest);
        let long = "x".repeat(MAX_WAIT_TEXT_BYTES + 1);
        assert_eq!(kind(&request(&long, None)), ErrorKind::TooLarge);
        let over = request("x", Some(WAIT_MAX_TIMEOUT_MS + 1));
        let error = Limits::check(&over).unwrap_err().to_wire();
        assert_eq!(error.kind, ErrorKind::BadRequest);
        assert!(error.message.contains("5-minute cap"), "{}", error.message);
        // The limits themselves are fine.
        let most = "x".repeat(MAX_WAIT_TEXT_BYTES);
        Limits::check(&request(&most, Some(WAIT_MAX_TIMEOUT_MS))).unwrap();
        Limits::check(&request("x", Some(0))).unwrap();
    }

    #[test]
    fn the_default_deadline_is_thirty_seconds() {
        let limits = Limits::check(&request("x", None)).unwrap();
        assert_eq!(
            limits.deadline - limits.started,
            Duration::from_millis(WAIT_DEFAULT_TIMEOUT_MS)
        );
    }

    #[test]
    fn messages_quote_the_text_and_cut_a_long_one() {
        assert_eq!(quoted("say \"hi\""), r#""say \"hi\"""#);
        let long = "é".repeat(100);
        let shown = quoted(&long);
        assert!(
            shown.ends_with('…') && shown.chars().count() == 83,
            "{shown}"
        );
        let exited = WaitError::Exited {
            pid: Pid(4),
            status: ExitStatus {
                code: Some(1),
                signal: None,
            },
            text: quoted("ready"),
            dropped: 0,
        };
        assert_eq!(
            exited.to_string(),
            "Process 4 exited (code 1) without printing \"ready\""
        );
        let timed_out = WaitError::TimedOut {
            target: "/tmp/x".into(),
            text: quoted("ready"),
            waited_ms: 2500,
            seen: "it does not exist yet".into(),
        };
        let wire = timed_out.to_wire();
        assert_eq!(wire.kind, ErrorKind::TimedOut);
        assert_eq!(
            wire.message,
            "Timed out after 2.5 s waiting for \"ready\" in /tmp/x (it does not exist yet)"
        );
    }

    #[test]
    fn the_kernels_inotify_limits_are_busy() {
        let error = WaitError::Watch {
            path: "/tmp/x".into(),
            error: io::Error::from_raw_os_error(libc::EMFILE),
        };
        let wire = error.to_wire();
        assert_eq!(wire.kind, ErrorKind::Busy);
        assert_eq!(wire.errno, Some(libc::EMFILE));
    }
}
