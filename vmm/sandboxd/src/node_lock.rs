//! One daemon per run folder: an exclusive `flock` on a file beside the run root,
//! holding the daemon's pid.
//!
//! Two daemons on one run root would both re-adopt the same VMs at start and stop
//! each other's. The lock is the kernel's, so it goes with the process however it
//! ends (a `kill -9` included): the next start takes it at once. `stop-all` takes it
//! too, so it never stops VMs under a live daemon; it asks that daemon to stop first
//! (its pid is in the file).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a wait for the lock looks again.
const LOCK_POLL: Duration = Duration::from_millis(100);

/// Why the lock could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another daemon holds it.
    #[error("Another sandboxd (pid {pid}) serves the run folders in {}: stop it first, or give this one another SANDBOX_HOME or SANDBOX_RUN_DIR", run_root.display())]
    Held {
        /// Its pid, as its lock file says (0 when unreadable).
        pid: u32,
        /// The run root.
        run_root: PathBuf,
    },
    /// The lock file could not be opened, locked or written.
    #[error("Cannot lock {}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
}

/// The lock, held while this value lives.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
}

/// The lock file of the run root `run_root`: beside it, not in it (the run root
/// holds only VM folders).
pub fn lock_path(run_root: &Path) -> PathBuf {
    let mut name = run_root.as_os_str().to_owned();
    name.push(".sandboxd-lock");
    PathBuf::from(name)
}

impl NodeLock {
    /// Takes the lock of `run_root` now, or says who holds it.
    pub fn acquire(run_root: &Path) -> Result<Self, LockError> {
        let path = lock_path(run_root);
        let io_error = |error| LockError::Io {
            path: path.clone(),
            error,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_error)?;
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(LockError::Held {
                    pid: read_pid(&mut file).unwrap_or(0),
                    run_root: run_root.to_owned(),
                });
            }
            return Err(io_error(error));
        }
        file.set_len(0).map_err(io_error)?;
        file.rewind().map_err(io_error)?;
        writeln!(file, "{}", std::process::id()).map_err(io_error)?;
        Ok(Self { _file: file })
    }

    /// Takes the lock, waiting up to `within` for its holder to let go.
    pub async fn wait(run_root: &Path, within: Duration) -> Result<Self, LockError> {
        let deadline = Instant::now() + within;
        loop {
            match Self::acquire(run_root) {
                Err(LockError::Held { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(LOCK_POLL).await;
                }
                other => return other,
            }
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_and_gets_it_after() {
        let root = std::env::temp_dir().join(format!("sbxd-lock-{}", std::process::id()));
        let first = NodeLock::acquire(&root).unwrap();
        match NodeLock::acquire(&root) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, std::process::id()),
            other => panic!("not refused: {other:?}"),
        }
        drop(first);
        let again = NodeLock::acquire(&root).unwrap();
        drop(again);
        std::fs::remove_file(lock_path(&root)).unwrap();
    }
}
