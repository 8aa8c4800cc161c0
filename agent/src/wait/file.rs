//! Waiting until a file contains a text: inotify says when to look again, and
//! [`super::read`] looks.
//!
//! Two watches, on one inotify instance per wait:
//! - the file's directory, for names appearing and going (`IN_CREATE`,
//!   `IN_MOVED_TO`, `IN_MOVED_FROM`, `IN_DELETE`, and the directory's own removal).
//!   While the directory does not exist, its nearest existing ancestor is watched
//!   instead, for the next directory down; each wake-up moves the watch down as far
//!   as the path exists.
//! - the file itself, once it exists, for writes (`IN_MODIFY`, `IN_CLOSE_WRITE`),
//!   truncation and its own removal or move. A file replaced by a rename gets a new
//!   watch on its new inode, and the old one is removed.
//!
//! Every wake-up (an event about the file or its name, a queue overflow) first sets
//! the watches again and then scans: a change after the watches are set produces an
//! event, so nothing between the scan and the next wait is missed. Events about
//! other names in the directory are read and ignored. A slow re-check every
//! [`RECHECK`] catches what inotify does not report (a dangling symlink whose target
//! appears elsewhere, files changed behind a network filesystem's back); it is a
//! safety net, not the mechanism.
//!
//! The watch updates and the reads are blocking I/O (path lookups, `pread`), so each
//! step runs on tokio's blocking pool; the state moves there and back.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::TextFound;
use tokio::time::Instant;

use super::read::{io_error, is_missing, FileScan, Step, STEP_BYTES};
use super::{Limits, WaitError};
use crate::files::display;
use crate::sys::inotify::{Inotify, InotifyEvent, WatchDescriptor, WatchMask};

/// How often a waiting file is looked at even without an event.
pub const RECHECK: Duration = Duration::from_secs(2);

/// Times [`Watches::update`] looks again when directories appear or vanish while it
/// sets its watch, before it settles for what it has (the re-check goes on).
const UPDATE_ATTEMPTS: usize = 8;

/// What a directory watch reports.
fn dir_mask() -> WatchMask {
    WatchMask::IN_CREATE
        | WatchMask::IN_MOVED_TO
        | WatchMask::IN_MOVED_FROM
        | WatchMask::IN_DELETE
        | WatchMask::IN_DELETE_SELF
        | WatchMask::IN_MOVE_SELF
        | WatchMask::IN_ONLYDIR
}

/// What the file's watch reports.
fn file_mask() -> WatchMask {
    WatchMask::IN_MODIFY
        | WatchMask::IN_CLOSE_WRITE
        | WatchMask::IN_ATTRIB
        | WatchMask::IN_DELETE_SELF
        | WatchMask::IN_MOVE_SELF
}

/// The watches of one wait; see the module docs.
#[derive(Debug)]
struct Watches {
    path: PathBuf,
    /// The directory watched (the file's, or its nearest existing ancestor).
    dir: Option<(PathBuf, WatchDescriptor)>,
    /// The name in that directory whose changes matter: the file's, or the next
    /// directory down toward it.
    relevant: OsString,
    /// The file's own watch, while it exists.
    file: Option<WatchDescriptor>,
}

impl Watches {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            dir: None,
            relevant: OsString::new(),
            file: None,
        }
    }

    /// Points the watches at what exists now. Blocking: path lookups.
    fn update(&mut self, inotify: &Inotify) -> Result<(), WaitError> {
        let parent = self.path.parent().unwrap_or(Path::new("/")).to_owned();
        for _ in 0..UPDATE_ATTEMPTS {
            let (dir, relevant) = nearest_dir(&self.path)?;
            self.relevant = relevant;
            // Watched again every time: the same inode keeps its descriptor, and a
            // directory removed and made again under the same name gets a new one.
            let wd = match inotify.add_watch(&dir, dir_mask()) {
                Ok(wd) => wd,
                // It went (or stopped being a directory) meanwhile: look again.
                Err(error) if is_missing(&error) => continue,
                Err(error) => return Err(watch_error(&dir, error)),
            };
            if let Some((_, old)) = self.dir.replace((dir.clone(), wd)) {
                if old != wd {
                    // The kernel may have dropped it already (its directory went).
                    let _ = inotify.rm_watch(old);
                }
            }
            // A directory below the watched one that appeared before the watch was set
            // is never announced: go down to it now.
            let below = dir.join(&self.relevant);
            if dir == parent || std::fs::symlink_metadata(&below).is_err() {
                break;
            }
        }
        match inotify.add_watch(&self.path, file_mask()) {
            Ok(wd) => {
                if let Some(old) = self.file.replace(wd) {
                    if old != wd {
                        let _ = inotify.rm_watch(old);
                    }
                }
            }
            Err(error) if is_missing(&error) => {
                if let Some(old) = self.file.take() {
                    let _ = inotify.rm_watch(old);
                }
            }
            Err(error) => return Err(watch_error(&self.path, error)),
        }
        Ok(())
    }

    /// Whether `event` may mean the file changed: anything on the file's watch, the
    /// relevant name (or the directory itself) on the directory's, an overflow.
    fn matters(&self, event: &InotifyEvent) -> bool {
        if event.mask.contains(WatchMask::IN_Q_OVERFLOW) || Some(event.wd) == self.file {
            return true;
        }
        match &self.dir {
            Some((_, wd)) if *wd == event.wd => event
                .name
                .as_ref()
                .is_none_or(|name| *name == self.relevant),
            _ => false,
        }
    }
}

/// The directory to watch for `path`: its parent if that exists, else the nearest
/// ancestor that does; with the name in it that leads to `path`. An ancestor that
/// exists but is not a directory means the path can never exist.
fn nearest_dir(path: &Path) -> Result<(PathBuf, OsString), WaitError> {
    let mut relevant = path.file_name().unwrap_or_default().to_owned();
    let mut dir = path.parent().unwrap_or(Path::new("/"));
    loop {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => return Ok((dir.to_owned(), relevant)),
            Ok(_) => {
                return Err(WaitError::NotDirectory {
                    ancestor: display(dir),
                    path: display(path),
                })
            }
            Err(error) if is_missing(&error) => match dir.parent() {
                Some(up) => {
                    relevant = dir.file_name().unwrap_or_default().to_owned();
                    dir = up;
                }
                None => return Err(io_error("stat", dir, error)),
            },
            Err(error) => return Err(io_error("stat", dir, error)),
        }
    }
}

fn watch_error(path: &Path, error: std::io::Error) -> WaitError {
    WaitError::Watch {
        path: display(path),
        error,
    }
}

/// What moves to the blocking pool and back for each step.
#[derive(Debug)]
struct State {
    watches: Watches,
    scan: FileScan,
}

/// Runs one step on the blocking pool: with `refresh`, sets the watches first.
async fn step(
    mut state: State,
    inotify: Arc<Inotify>,
    refresh: bool,
) -> Result<(State, Step), WaitError> {
    let path = state.watches.path.clone();
    tokio::task::spawn_blocking(move || {
        if refresh {
            state.watches.update(&inotify)?;
        }
        let step = state.scan.step(STEP_BYTES)?;
        Ok((state, step))
    })
    .await
    .unwrap_or_else(|join| {
        Err(io_error(
            "scan",
            &path,
            std::io::Error::other(join.to_string()),
        ))
    })
}

/// File waits the agent keeps at once. Each holds an inotify instance, and the
/// kernel's default cap is 128 per user: the agent and a root workload are the same
/// user, so the agent keeps to half of them.
pub const MAX_FILE_WAITS: usize = 64;

static FILE_WAITS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_FILE_WAITS);

/// Waits until `path` contains the text, or the deadline; refused at once while
/// [`MAX_FILE_WAITS`] are in progress.
pub async fn wait(path: PathBuf, limits: &Limits) -> Result<TextFound, WaitError> {
    let Ok(_slot) = FILE_WAITS.try_acquire() else {
        return Err(WaitError::TooManyFileWaits {
            max: MAX_FILE_WAITS,
        });
    };
    let inotify = Arc::new(Inotify::new().map_err(|error| watch_error(&path, error))?);
    let mut state = State {
        watches: Watches::new(path.clone()),
        scan: FileScan::new(path.clone(), limits.scanner()),
    };
    let mut at_once = true;
    loop {
        let mut refresh = true;
        loop {
            let (back, scanned) = step(state, inotify.clone(), refresh).await?;
            state = back;
            refresh = false;
            match scanned {
                Step::Found => {
                    if let Some(hit) = state.scan.hit() {
                        return Ok(limits.found(hit, None, at_once));
                    }
                    break;
                }
                Step::More if Instant::now() < limits.deadline => {}
                Step::More | Step::CaughtUp | Step::Missing => break,
            }
        }
        at_once = false;
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(limits.deadline) => {
                return Err(limits.timed_out(display(&path), state.scan.describe()));
            }
            changed = changed(&inotify, &state.watches) => changed?,
            () = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// Resolves at the next event that may mean the file changed.
async fn changed(inotify: &Inotify, watches: &Watches) -> Result<(), WaitError> {
    loop {
        let events = inotify
            .read_events()
            .await
            .map_err(|error| watch_error(&watches.path, error))?;
        if events.iter().any(|event| watches.matters(event)) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::Limits;
    use sandbox_protocol::{WaitForTextRequest, WaitTarget};
    use std::os::unix::ffi::OsStrExt;

    fn limits(text: &str, timeout_ms: u64) -> Limits {
        Limits::check(&WaitForTextRequest {
            target: WaitTarget::Output(sandbox_protocol::Pid(0)),
            text: text.into(),
            timeout_ms: Some(timeout_ms),
        })
        .unwrap()
    }

    /// Runs `change` on a thread after a short pause, so the wait is already
    /// watching when it happens.
    fn later(change: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            // The pause is the test: the wait must be parked on inotify, not scanning.
            std::thread::sleep(Duration::from_millis(200));
            change();
        });
    }

    #[tokio::test]
    async fn a_file_created_later_in_directories_created_later_is_found_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/c/log");
        let top = dir.path().to_owned();
        later(move || {
            std::fs::create_dir_all(top.join("a/b/c")).unwrap();
            std::fs::write(top.join("a/b/c/log"), b"boot\nserver ready\n").unwrap();
        });
        let limits = limits("ready", 20_000);
        let found = wait(path, &limits).await.unwrap();
        assert_eq!(found.offset, 12);
        assert_eq!(found.line, "server ready");
        assert!(found.waited_ms > 0);
        // Well before the safety re-check: inotify woke it.
        assert!(
            Duration::from_millis(found.waited_ms) < RECHECK,
            "{found:?}"
        );
    }

    #[tokio::test]
    async fn a_directory_removed_and_made_again_is_watched_anew() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("run");
        std::fs::create_dir(&sub).unwrap();
        let inotify = Inotify::new().unwrap();
        let mut watches = Watches::new(sub.join("pid"));
        watches.update(&inotify).unwrap();
        let first = watches.dir.as_ref().unwrap().1;
        std::fs::remove_dir(&sub).unwrap();
        std::fs::create_dir(&sub).unwrap();
        watches.update(&inotify).unwrap();
        let (watched, second) = watches.dir.clone().unwrap();
        assert_eq!(watched, sub);
        assert_ne!(first, second, "still on the removed directory");
    }

    #[tokio::test]
    async fn an_ancestor_that_is_a_file_is_an_error_at_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain"), b"").unwrap();
        let path = dir.path().join("plain/sub/log");
        let error = wait(path, &limits("x", 10_000)).await.unwrap_err();
        assert!(matches!(error, WaitError::NotDirectory { .. }), "{error}");
        assert!(error.to_string().contains("plain is not a directory"));
    }

    #[tokio::test]
    async fn the_deadline_says_what_was_seen() {
        let dir = tempfile::tempdir().unwrap();
        let missing = wait(dir.path().join("none"), &limits("x", 100))
            .await
            .unwrap_err();
        assert!(
            missing.to_string().ends_with("(it does not exist)"),
            "{missing}"
        );
        let path = dir.path().join("some");
        std::fs::write(&path, b"abc").unwrap();
        let error = wait(path, &limits("x", 100)).await.unwrap_err();
        assert_eq!(error.to_wire().kind, sandbox_protocol::ErrorKind::TimedOut);
        assert!(error.to_string().contains("scanned 3 bytes"), "{error}");
    }

    #[tokio::test]
    async fn events_about_other_names_do_not_matter() {
        let dir = tempfile::tempdir().unwrap();
        let (log, other) = (dir.path().join("log"), dir.path().join("other"));
        std::fs::write(&log, b"").unwrap();
        std::fs::write(&other, b"").unwrap();
        // Real descriptors (nix has no constructor for one).
        let inotify = Inotify::new().unwrap();
        let mut watches = Watches::new(log.clone());
        watches.update(&inotify).unwrap();
        let (dir_wd, file_wd) = (watches.dir.as_ref().unwrap().1, watches.file.unwrap());
        assert_eq!(watches.relevant, OsString::from("log"));
        let other_wd = inotify.add_watch(&other, file_mask()).unwrap();
        let event = |wd, mask, name: Option<&str>| InotifyEvent {
            wd,
            mask,
            cookie: 0,
            name: name.map(OsString::from),
        };
        assert!(watches.matters(&event(dir_wd, WatchMask::IN_CREATE, Some("log"))));
        assert!(!watches.matters(&event(dir_wd, WatchMask::IN_CREATE, Some("other"))));
        assert!(watches.matters(&event(dir_wd, WatchMask::IN_DELETE_SELF, None)));
        assert!(watches.matters(&event(file_wd, WatchMask::IN_MODIFY, None)));
        assert!(!watches.matters(&event(other_wd, WatchMask::IN_MODIFY, None)));
        assert!(watches.matters(&event(other_wd, WatchMask::IN_Q_OVERFLOW, None)));
        // Replaced by a rename: the file's watch follows the new inode.
        let new = dir.path().join("log.new");
        std::fs::write(&new, b"").unwrap();
        std::fs::rename(&new, &log).unwrap();
        watches.update(&inotify).unwrap();
        assert_ne!(watches.file, Some(file_wd));
        std::fs::remove_file(&log).unwrap();
        watches.update(&inotify).unwrap();
        assert_eq!(watches.file, None);
    }

    #[test]
    fn nearest_dir_walks_up_to_what_exists() {
        let dir = tempfile::tempdir().unwrap();
        let (watched, relevant) = nearest_dir(&dir.path().join("x/y/z")).unwrap();
        assert_eq!(watched, dir.path());
        assert_eq!(relevant.as_bytes(), b"x");
        std::fs::create_dir(dir.path().join("x")).unwrap();
        let (watched, relevant) = nearest_dir(&dir.path().join("x/y/z")).unwrap();
        assert_eq!(watched, dir.path().join("x"));
        assert_eq!(relevant.as_bytes(), b"y");
        let (watched, relevant) = nearest_dir(&dir.path().join("x/file")).unwrap();
        assert_eq!(
            (watched, relevant.as_bytes()),
            (dir.path().join("x"), &b"file"[..])
        );
    }
}
