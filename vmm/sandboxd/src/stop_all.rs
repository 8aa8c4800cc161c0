//! `sandboxd stop-all`: stops everything the node runs on its home.
//!
//! A graceful stop of the daemon leaves claimed sandboxes for its next start; this
//! is the way to end them all. It first asks a daemon that holds the run root's lock
//! to stop (SIGTERM to the pid in the lock file, which must be a `sandboxd`) and
//! waits for the lock, so it never stops VMs under a live daemon; then, holding the
//! lock, it stops every VM whose record says a node holds it (claimed or warm,
//! running or hibernated) and removes its run folder, RAM file and record. VMs of an
//! embedded engine or of `sandboxctl vm start` are not the node's and are left.

use std::time::Duration;

use anyhow::Context as _;
use sandbox_engine::config::{Mode, OwnerKind};
use sandbox_engine::pool::launcher::VM_STOP_GRACE_MS;
use sandbox_engine::record;
use sandbox_vmm::launcher::{Launcher, VmId};

use crate::node_lock::{lock_path, LockError, NodeLock};

/// How long a running daemon gets to stop before `stop-all` gives up.
const DAEMON_STOP_WAIT: Duration = Duration::from_secs(120);

/// What `stop-all` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// VMs stopped.
    pub vms: usize,
    /// Run folders whose record could not be read (left as they are).
    pub skipped: usize,
}

/// Stops every VM of the node on `mode`'s run root.
pub async fn stop_all(mode: Mode) -> anyhow::Result<Stopped> {
    let Mode::Launch(launch) = mode else {
        anyhow::bail!("stop-all needs a launching node");
    };
    let run_root = launch.launcher.run_root.clone();
    let _lock = match NodeLock::acquire(&run_root) {
        Ok(lock) => lock,
        Err(LockError::Held { pid, .. }) => {
            ask_to_stop(pid)?;
            tracing::info!(pid, "asked the running sandboxd to stop; waiting for it");
            NodeLock::wait(&run_root, DAEMON_STOP_WAIT)
                .await
                .context("The running sandboxd did not stop")?
        }
        Err(error) => return Err(error.into()),
    };
    let launcher = Launcher::new(launch.launcher);
    let mut stopped = Stopped::default();
    for entry in launcher.list()? {
        let held = match record::read(&entry.path) {
            Ok(Some(record)) => record.owner.kind == OwnerKind::Node,
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(folder = %entry.path.display(), error = %sandbox_vmm::error_chain(&error), "unreadable sandbox record: left as it is");
                stopped.skipped += 1;
                false
            }
        };
        let Ok(id) = entry.name.parse::<VmId>() else {
            continue;
        };
        if !held {
            continue;
        }
        match launcher
            .stop(&id, Duration::from_millis(VM_STOP_GRACE_MS))
            .await
        {
            Ok(outcome) => {
                tracing::info!(vm = %id, ?outcome, "stopped");
                stopped.vms += 1;
            }
            Err(error) => {
                tracing::warn!(vm = %id, error = %sandbox_vmm::error_chain(&error), "cannot stop it")
            }
        }
    }
    let _ = std::fs::remove_file(lock_path(&run_root));
    Ok(stopped)
}

/// SIGTERM to the daemon `pid`, once it is known to be a `sandboxd`.
fn ask_to_stop(pid: u32) -> anyhow::Result<()> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    use std::os::unix::ffi::OsStrExt;
    let is_sandboxd = std::path::Path::new(std::ffi::OsStr::from_bytes(first))
        .file_name()
        .is_some_and(|name| name == "sandboxd");
    if !is_sandboxd {
        anyhow::bail!(
            "The run folders are locked by process {pid}, which is not a sandboxd; stop it first"
        );
    }
    let raw = i32::try_from(pid).context("pid out of range")?;
    // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
    let rc = unsafe { libc::kill(raw, libc::SIGTERM) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .context(format!("Cannot signal sandboxd {pid}"));
    }
    Ok(())
}
