//! Removing the cgroups of forgotten processes on a thread of their own, so the
//! sweeper never holds up the runtime with cgroup I/O.
//!
//! An `rmdir` of a process cgroup costs about 0.4 ms in a TCG guest (four times one
//! on tmpfs), and one sweep may forget hundreds of processes at once: on the
//! runtime thread that would stall every connection for as long. The table hands
//! the paths to this thread instead; it removes them in `SCHED_IDLE`, so on a
//! one-vCPU guest it runs when the agent and the workload leave the CPU free.
//!
//! Making cgroups ahead of time on the same thread was tried and dropped: the
//! `mkdir` a start saves (about 0.55 ms with `memory.oom.group`, measured in the
//! guest, not the 2.75 ms of a busybox `mkdir`, which is mostly its fork and exec)
//! did not show in the microVM exec benchmark next to the same agent making its
//! cgroups inline, and it cost the cgroups their telling names (`exec-7`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// Removes `dir` and the cgroups the workload made below it; fails while populated.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    for sub in super::cgroup::sub_cgroups(dir) {
        remove_tree(&sub)?;
    }
    match fs::remove_dir(dir) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The removal thread (which ends when this is dropped).
#[derive(Debug)]
pub struct CgroupRemover {
    shared: Arc<Shared>,
    /// The thread; without one, removals happen inline.
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Cgroups of forgotten processes, to remove.
    doomed: Vec<PathBuf>,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CgroupRemover {
    /// Starts the thread. If it cannot be started, removals happen inline, as
    /// before it existed.
    pub fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cgroup-remover".into())
            .spawn(move || run(&worker))
            .map_err(|error| tracing::warn!(%error, "no cgroup removal thread; removals inline"))
            .ok();
        Self { shared, thread }
    }

    /// Removes the cgroup at `path` (with what the workload made below it), on the
    /// thread when there is one.
    pub fn remove_later(&self, path: PathBuf) {
        if self.thread.is_none() {
            remove_logged(&path);
            return;
        }
        self.shared.lock().doomed.push(path);
        self.shared.wake.notify_one();
    }
}

impl Drop for CgroupRemover {
    /// Stops the thread after the removal at hand; what is still queued is removed
    /// first (only an agent dropping its table, in tests, gets here).
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn remove_logged(path: &Path) {
    if let Err(error) = remove_tree(path) {
        tracing::warn!(cgroup = %path.display(), %error, "cannot remove a cgroup");
    }
}

/// The thread: removes what it is given, until stopped and drained.
fn run(shared: &Shared) {
    if let Err(error) = crate::sys::run_this_thread_when_idle() {
        tracing::debug!(%error, "the cgroup removal thread keeps the normal priority");
    }
    let mut state = shared.lock();
    loop {
        if let Some(path) = state.doomed.pop() {
            drop(state);
            remove_logged(&path);
            state = shared.lock();
        } else if state.stop {
            return;
        } else {
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("remover-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn removals_happen_on_the_thread_sub_cgroups_first() {
        // Plain directories stand in for cgroups.
        let dir = scratch("remove");
        let remover = CgroupRemover::start();
        fs::create_dir_all(dir.join("old").join("sub")).unwrap();
        remover.remove_later(dir.join("old"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while dir.join("old").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!dir.join("old").exists());
        drop(remover);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn what_is_queued_is_removed_before_the_thread_stops() {
        let dir = scratch("drain");
        let remover = CgroupRemover::start();
        for i in 0..20 {
            fs::create_dir(dir.join(i.to_string())).unwrap();
            remover.remove_later(dir.join(i.to_string()));
        }
        drop(remover);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_cgroup_counts_as_removed() {
        let dir = scratch("missing");
        assert!(remove_tree(&dir.join("never-made")).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }
}
