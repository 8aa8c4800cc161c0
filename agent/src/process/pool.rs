//! Cgroups made ahead of time, and removed after the fact, by a thread of their own,
//! so that no exec waits for cgroup I/O.
//!
//! In a TCG guest a `mkdir` under the workload parent costs about 2.75 ms and an
//! `rmdir` about 2.55 ms: as much as the fork and exec they confine. A start takes a
//! cgroup the pool thread made before (already set up, its directory open for
//! `CLONE_INTO_CGROUP`) and wakes the thread to make the next; the table hands the
//! cgroups of forgotten processes to the same thread to remove. The thread makes
//! before it removes, one directory at a time, so a removal never holds up a
//! refill for long. When the pool is empty (a burst of starts), the start makes its
//! cgroup itself, as every start did before the pool.
//!
//! cgroup v2 cannot rename a directory, so a cgroup is made before anyone knows the
//! pid or the kind of process it will hold: the names are neutral (`cg-7`), and
//! each process's record keeps the name it got (`ps_detail` shows it).

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Cgroups kept ready. Execs arrive one round trip apart at best, and a refill
/// (about 3 ms under TCG) fits in that gap, so a few cover bursts; each costs the
/// kernel a few pages while it waits.
pub const POOL_CGROUPS: usize = 4;

/// How long the thread waits before it tries again to make a cgroup after a failure
/// (the workload's pids or memory limit, most likely).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The name of the `seq`-th process cgroup: a number never reused in this boot.
pub fn cgroup_name(seq: u64) -> String {
    format!("cg-{seq}")
}

/// A cgroup made for one process and not yet used.
#[derive(Debug)]
pub struct FreshCgroup {
    /// Its directory name under the workload parent.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// Its directory, open (`CLONE_INTO_CGROUP` takes this descriptor).
    pub dir: OwnedFd,
}

/// Makes the next cgroup under `workload`, with `memory.oom.group` set.
fn make(workload: &Path, next: &AtomicU64) -> io::Result<FreshCgroup> {
    loop {
        let name = cgroup_name(next.fetch_add(1, Ordering::Relaxed));
        let path = workload.join(&name);
        match fs::create_dir(&path) {
            // Left by an agent that ran before on this tree: take the next number.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
            Ok(()) => {}
        }
        if let Err(error) = fs::write(path.join("memory.oom.group"), "1") {
            tracing::warn!(cgroup = %path.display(), %error, "cannot set memory.oom.group");
        }
        let dir = match fs::File::open(&path) {
            Ok(dir) => OwnedFd::from(dir),
            Err(error) => {
                let _ = fs::remove_dir(&path);
                return Err(error);
            }
        };
        return Ok(FreshCgroup { name, path, dir });
    }
}

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

/// The pool and its thread (which ends when the pool is dropped).
#[derive(Debug)]
pub struct CgroupPool {
    shared: Arc<Shared>,
    /// The thread; without one, everything happens inline.
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    workload: PathBuf,
    next: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<FreshCgroup>,
    /// Cgroups of forgotten processes, to remove.
    doomed: Vec<PathBuf>,
    /// After a failure to make one, no new attempt before this.
    retry_at: Option<Instant>,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the thread does next.
enum Job {
    Make,
    Remove(PathBuf),
    Stop,
}

impl CgroupPool {
    /// A pool of cgroups under `workload`, numbered from 1, filled by a thread that
    /// starts at once. If the thread cannot be started, cgroups are made and
    /// removed inline, as before the pool.
    pub fn start(workload: PathBuf) -> Self {
        let shared = Arc::new(Shared {
            workload,
            next: AtomicU64::new(1),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let filler = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cgroup-pool".into())
            .spawn(move || run(&filler))
            .map_err(|error| tracing::warn!(%error, "no cgroup pool thread; cgroups made inline"))
            .ok();
        Self { shared, thread }
    }

    /// A cgroup for a process about to start: a ready one, or one made now when
    /// none is ready.
    pub fn take(&self) -> io::Result<FreshCgroup> {
        let ready = self.shared.lock().ready.pop_front();
        self.shared.wake.notify_one();
        match ready {
            Some(fresh) => Ok(fresh),
            None => make(&self.shared.workload, &self.shared.next),
        }
    }

    /// Removes the cgroup at `path` (with what the workload made below it), on the
    /// pool thread when there is one.
    pub fn remove_later(&self, path: PathBuf) {
        if self.thread.is_none() {
            if let Err(error) = remove_tree(&path) {
                tracing::warn!(cgroup = %path.display(), %error, "cannot remove a cgroup");
            }
            return;
        }
        self.shared.lock().doomed.push(path);
        self.shared.wake.notify_one();
    }

    /// Cgroups ready now (for tests).
    #[cfg(test)]
    fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }
}

impl Drop for CgroupPool {
    /// Stops the thread after the job at hand (one `mkdir` or `rmdir` at most).
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The pool thread: keeps [`POOL_CGROUPS`] ready, removes what it is given.
fn run(shared: &Shared) {
    // On a one-vCPU guest a refill woken by a start would otherwise take the CPU
    // from that very start (measured: the pool then saved nothing). Idle, it runs
    // while the agent waits for its client.
    if let Err(error) = crate::sys::run_this_thread_when_idle() {
        tracing::debug!(%error, "the cgroup pool thread keeps the normal priority");
    }
    loop {
        match next_job(shared) {
            Job::Stop => break,
            Job::Make => {
                let made = make(&shared.workload, &shared.next);
                let mut state = shared.lock();
                match made {
                    Ok(fresh) => {
                        state.ready.push_back(fresh);
                        state.retry_at = None;
                    }
                    Err(error) => {
                        if state.retry_at.is_none() {
                            tracing::warn!(%error, "cannot make a cgroup ahead of time");
                        }
                        state.retry_at = Some(Instant::now() + RETRY_AFTER_FAILURE);
                    }
                }
            }
            Job::Remove(path) => {
                if let Err(error) = remove_tree(&path) {
                    tracing::warn!(cgroup = %path.display(), %error, "cannot remove a cgroup");
                }
            }
        }
    }
    // What is left ready goes with the agent's tree; only an agent dropping its table
    // (tests) gets here, and it removes the ready ones it made.
    for fresh in shared.lock().ready.drain(..) {
        let _ = fs::remove_dir(&fresh.path);
    }
}

/// Waits for work: making comes first, then removing.
fn next_job(shared: &Shared) -> Job {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return Job::Stop;
        }
        let now = Instant::now();
        let may_make = state.retry_at.is_none_or(|at| now >= at);
        if may_make && state.ready.len() < POOL_CGROUPS {
            return Job::Make;
        }
        if let Some(path) = state.doomed.pop() {
            return Job::Remove(path);
        }
        state = match state.retry_at.filter(|_| state.ready.len() < POOL_CGROUPS) {
            Some(at) => {
                let timeout = at.saturating_duration_since(now);
                shared
                    .wake
                    .wait_timeout(state, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Plain directories stand in for cgroups (`memory.oom.group` becomes a plain file).

    fn eventually(mut check: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if check() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pool-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn names_are_neutral_and_numbered() {
        assert_eq!(cgroup_name(1), "cg-1");
        assert_eq!(cgroup_name(22), "cg-22");
    }

    #[test]
    fn the_pool_fills_and_refills_after_a_take() {
        let dir = scratch("fill");
        let pool = CgroupPool::start(dir.clone());
        assert!(eventually(|| pool.ready() == POOL_CGROUPS));
        let first = pool.take().unwrap();
        assert_eq!(first.name, "cg-1");
        assert!(first.path.is_dir());
        assert!(eventually(|| pool.ready() == POOL_CGROUPS));
        // Never a name twice, whatever the order of takes and refills.
        let mut names: Vec<_> = (0..10).map(|_| pool.take().unwrap().name).collect();
        names.push(first.name);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 11);
        drop(pool);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_name_left_by_an_earlier_agent_is_skipped() {
        let dir = scratch("skip");
        fs::create_dir(dir.join("cg-1")).unwrap();
        let next = AtomicU64::new(1);
        let fresh = make(&dir, &next).unwrap();
        assert_eq!(fresh.name, "cg-2");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn removals_happen_on_the_thread() {
        let dir = scratch("remove");
        let pool = CgroupPool::start(dir.clone());
        let doomed = dir.join("old").join("sub");
        fs::create_dir_all(&doomed).unwrap();
        pool.remove_later(dir.join("old"));
        assert!(eventually(|| !dir.join("old").exists()));
        drop(pool);
        let _ = fs::remove_dir_all(&dir);
    }
}
