//! The relay's own log, bounded against a guest that makes it talk.
//!
//! A guest that takes the agent's serial descriptor can break the link's framing at
//! will, and each break used to log a warning: about 1.2 MB in 20 s, 5 GB a day, in
//! a file that never rotated. Two bounds: [`Summary`] lets one warning of a kind
//! through per window and counts the rest into the next one, and [`RotatingLog`]
//! renames the file to `.1` (one old file kept) when it passes its cap.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes the relay's log may reach before it is rotated (one old file is kept).
pub const RELAY_LOG_MAX_BYTES: u64 = 1024 * 1024;

/// Bytes of console the relay keeps in `console.log` before rotating it (one old file
/// kept): the crash report quotes the last 4 KiB.
pub const CONSOLE_LOG_MAX_BYTES: u64 = 1024 * 1024;

/// One warning of a kind per this long; the others are counted.
pub const WARN_WINDOW: Duration = Duration::from_secs(60);

/// Counts repeated events and says when one may be logged.
#[derive(Debug)]
pub struct Summary {
    window: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Summary {
    /// A summary that lets one event through per `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: None,
            suppressed: 0,
        }
    }

    /// An event at `now`: `Some(n)` when it should be logged, `n` being how many
    /// were held back since the last one logged; `None` when it is only counted.
    pub fn event(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.window => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// A log file that is renamed to `PATH.1` and started again past `max_bytes`.
/// Cloned into each writer tracing asks for; they share one file.
#[derive(Debug, Clone)]
pub struct RotatingLog {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    file: File,
    written: u64,
    max_bytes: u64,
    /// Also point this process's stderr at the new file (the relay's stderr is its
    /// log: panics and the last error go there too).
    redirect_stderr: bool,
}

impl RotatingLog {
    /// Appends to `path` (what it holds counts toward the cap).
    pub fn open(path: &Path, max_bytes: u64, redirect_stderr: bool) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let written = file.metadata()?.len();
        if redirect_stderr {
            // stderr may be the same file opened without O_APPEND: it would write
            // over the log's start.
            nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&file), 2)
                .map_err(io::Error::from)?;
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                path: path.to_owned(),
                file,
                written,
                max_bytes,
                redirect_stderr,
            })),
        })
    }
}

impl Inner {
    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&self.path)?;
        self.written = 0;
        if self.redirect_stderr {
            nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&self.file), 2)
                .map_err(io::Error::from)?;
        }
        Ok(())
    }
}

impl Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.written > 0 && inner.written + buf.len() as u64 > inner.max_bytes {
            // A log that cannot rotate goes on in the old file rather than stop.
            let _ = inner.rotate();
        }
        inner.file.write_all(buf)?;
        inner.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_events_are_logged_once_per_window_with_the_count_held_back() {
        let mut summary = Summary::new(Duration::from_secs(60));
        let start = Instant::now();
        assert_eq!(summary.event(start), Some(0));
        for i in 1..=1000 {
            assert_eq!(summary.event(start + Duration::from_millis(i)), None);
        }
        assert_eq!(summary.event(start + Duration::from_secs(61)), Some(1000));
        assert_eq!(summary.event(start + Duration::from_secs(62)), None);
    }

    /// Regression (issue 22, item 5): relay.log never rotated (5 GB a day from a
    /// guest breaking the link's framing). It stays within twice its cap, in two
    /// files, and the newest lines are in the current one.
    #[test]
    fn the_log_rotates_past_its_cap_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.log");
        let mut log = RotatingLog::open(&path, 4096, false).unwrap();
        for i in 0..10_000 {
            writeln!(log, "line {i}").unwrap();
        }
        let current = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::metadata(dir.path().join("relay.log.1")).unwrap();
        assert!(current.len() <= 4096 && old.len() <= 4096);
        assert!(current.ends_with("line 9999\n"), "{current}");
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 2);
    }
}
