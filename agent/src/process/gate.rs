//! The spawn gate: one lock that every child start and every reaping pass takes,
//! guarding the two pieces of process-global state a start touches.
//!
//! - **Exit statuses.** A child must be in the table before the reaper can collect
//!   its status, and std's own wait for a child whose `exec` failed must not race
//!   the reaper's `waitpid(-1)` (see the module docs of [`crate::process`]). A
//!   [`SpawnPermit`] is held from before the start until the record is inserted; the
//!   reaper holds a [`ReapPermit`] around `waitpid`.
//! - **The agent's own `oom_score_adj`.** As a container's init the agent shields
//!   itself from the OOM killer (-1000; the machine's init needs no shield, see
//!   [`crate::init::oom`]), and a child inherits its parent's score. So each start
//!   lowers the agent's score to 0 and restores it after ([`OomUnshield`]). Two
//!   starts overlapping would break that: the second would read the lowered 0 as
//!   "not shielded", or the first would restore -1000 while the second was still
//!   starting, whose child would then run shielded. Only a [`SpawnPermit`] hands out
//!   an [`OomUnshield`], so starts are serialised by the lock, not by the runtime
//!   having one thread: the code stays correct if the runtime gains threads or a
//!   start moves to the blocking pool.
//!
//! Starts are never concurrent with each other or with reaping; both are short (a
//! `clone3` or `posix_spawn`, a `waitpid(WNOHANG)` loop), so one mutex costs nothing
//! measurable. The gate also covers the one other `waitpid`: a child cloned into
//! its cgroup whose `exec` failed is reaped by its starter (see [`crate::sys::spawn`]).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::init::oom::{OomScore, OwnOomScore};

/// Serialises child starts against each other and against the reaper.
#[derive(Debug)]
pub struct SpawnGate {
    oom: Mutex<OomShield>,
}

impl Default for SpawnGate {
    fn default() -> Self {
        Self::new()
    }
}

impl SpawnGate {
    /// A gate over the agent's own OOM score.
    pub fn new() -> Self {
        Self::with_oom_score(Box::new(OwnOomScore))
    }

    /// A gate over `score` instead of the agent's own (for tests).
    pub fn with_oom_score(score: Box<dyn OomScore>) -> Self {
        Self {
            oom: Mutex::new(OomShield {
                score,
                shielded: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, OomShield> {
        // A panic while the gate was held cannot leave the score lowered: the
        // `OomUnshield` restores it while unwinding. So the state is usable.
        self.oom.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Held while one child is started and inserted into the table.
    pub fn spawn(&self) -> SpawnPermit<'_> {
        SpawnPermit { oom: self.lock() }
    }

    /// Held by the reaper around `waitpid`.
    pub fn reap(&self) -> ReapPermit<'_> {
        ReapPermit { _held: self.lock() }
    }
}

/// The right to start one child; see the module docs.
#[derive(Debug)]
pub struct SpawnPermit<'g> {
    oom: MutexGuard<'g, OomShield>,
}

impl SpawnPermit<'_> {
    /// Whether the agent shields itself from the OOM killer (learned at the first
    /// start). A child cloned with [`crate::sys::spawn`] then resets its own score
    /// before `exec`, one write instead of the three of [`Self::unshield_oom`].
    pub fn oom_shielded(&mut self) -> bool {
        self.oom.is_shielded()
    }

    /// Lowers the agent's OOM shield until the returned guard is dropped; a no-op
    /// when the agent has none. Borrowing the permit mutably ties the lowered score
    /// to the lock: it cannot outlive the permit, and no other start can run.
    pub fn unshield_oom(&mut self) -> OomUnshield<'_> {
        let restore = self.oom.lower();
        OomUnshield {
            shield: &mut self.oom,
            restore,
        }
    }
}

/// The reaper's hold on the gate: no child is being started meanwhile.
#[derive(Debug)]
pub struct ReapPermit<'g> {
    _held: MutexGuard<'g, OomShield>,
}

/// The agent's OOM score, and whether the agent shields itself at all.
#[derive(Debug)]
struct OomShield {
    score: Box<dyn OomScore>,
    /// Learned at the first start: init sets the score before it serves, and an
    /// agent that is not shielded then never touches the file again.
    shielded: Option<bool>,
}

impl OomShield {
    fn is_shielded(&mut self) -> bool {
        let score = &self.score;
        *self
            .shielded
            .get_or_insert_with(|| score.read().is_ok_and(|s| s != 0))
    }

    /// Sets the score to 0 if it is not; returns the score to restore.
    fn lower(&mut self) -> Option<i32> {
        if !self.is_shielded() {
            return None;
        }
        let current = match self.score.read() {
            Ok(0) => return None,
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(%error, "cannot read the agent's OOM score; child keeps it");
                return None;
            }
        };
        // Raising the score is always allowed, so this fails only if /proc is gone.
        match self.score.write(0) {
            Ok(()) => Some(current),
            Err(error) => {
                tracing::warn!(%error, "cannot lower the agent's OOM shield; child inherits it");
                None
            }
        }
    }
}

/// The agent's OOM shield, lowered for one child start: children inherit the
/// default score from their first instruction (and so does whatever they fork at
/// once). Dropping it restores the shield, on every path out of the start: success,
/// an error returned with `?`, or a panic unwinding.
///
/// Invariant: the score is process-global, so at most one `OomUnshield` may exist
/// at a time. It is obtainable only from [`SpawnPermit::unshield_oom`], which
/// borrows the permit, which holds the gate's mutex.
///
/// Resetting the score in the parent after the start left a window, and resetting
/// it in the child needs steps before `exec`: a child cloned into its cgroup does
/// that (see [`SpawnPermit::oom_shielded`]), while posix_spawn cannot and fork costs
/// milliseconds per exec in an emulated guest. The agent is briefly unshielded, which is harmless
/// where shielding happens at all: the kernel never picks the global init (PID 1) as
/// an OOM victim, whatever its score.
#[derive(Debug)]
pub struct OomUnshield<'p> {
    shield: &'p mut OomShield,
    restore: Option<i32>,
}

impl Drop for OomUnshield<'_> {
    fn drop(&mut self) {
        if let Some(score) = self.restore {
            if let Err(error) = self.shield.score.write(score) {
                tracing::error!(%error, score, "cannot restore the agent's OOM shield");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::Arc;

    /// A score kept in memory, with every write recorded.
    #[derive(Debug, Clone)]
    struct FakeScore(Arc<Mutex<(i32, Vec<i32>)>>);

    impl FakeScore {
        fn at(score: i32) -> Self {
            Self(Arc::new(Mutex::new((score, Vec::new()))))
        }
        fn now(&self) -> i32 {
            self.0.lock().unwrap().0
        }
        fn writes(&self) -> Vec<i32> {
            self.0.lock().unwrap().1.clone()
        }
    }

    impl OomScore for FakeScore {
        fn read(&self) -> io::Result<i32> {
            Ok(self.now())
        }
        fn write(&mut self, score: i32) -> io::Result<()> {
            let mut state = self.0.lock().unwrap();
            state.0 = score;
            state.1.push(score);
            Ok(())
        }
    }

    #[test]
    fn a_shielded_agent_is_at_zero_while_the_guard_lives() {
        let score = FakeScore::at(-1000);
        let gate = SpawnGate::with_oom_score(Box::new(score.clone()));
        let mut permit = gate.spawn();
        let unshield = permit.unshield_oom();
        assert_eq!(score.now(), 0);
        drop(unshield);
        assert_eq!(score.now(), -1000);
        assert_eq!(score.writes(), [0, -1000]);
    }

    #[test]
    fn an_unshielded_agent_never_writes_its_score() {
        let score = FakeScore::at(0);
        let gate = SpawnGate::with_oom_score(Box::new(score.clone()));
        for _ in 0..3 {
            drop(gate.spawn().unshield_oom());
        }
        assert!(score.writes().is_empty());
    }

    #[test]
    fn the_shield_is_restored_when_a_start_fails() {
        fn start(gate: &SpawnGate) -> io::Result<()> {
            let mut permit = gate.spawn();
            let _unshield = permit.unshield_oom();
            Err(io::Error::from(io::ErrorKind::NotFound))
        }
        let score = FakeScore::at(-1000);
        let gate = SpawnGate::with_oom_score(Box::new(score.clone()));
        assert!(start(&gate).is_err());
        assert_eq!(score.now(), -1000);
    }

    #[test]
    fn the_shield_is_restored_when_a_start_panics() {
        let score = FakeScore::at(-1000);
        let gate = SpawnGate::with_oom_score(Box::new(score.clone()));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut permit = gate.spawn();
            let _unshield = permit.unshield_oom();
            panic!("a start panicked");
        }));
        assert!(panicked.is_err());
        assert_eq!(score.now(), -1000);
        // The poisoned gate still works and still lowers the shield.
        let mut permit = gate.spawn();
        let unshield = permit.unshield_oom();
        assert_eq!(score.now(), 0);
        drop(unshield);
        assert_eq!(score.now(), -1000);
    }

    #[test]
    fn starts_on_many_threads_never_overlap_their_unshield() {
        // Regression guard for the single-thread assumption: with the gate, a start
        // on another thread waits, so every start sees the shield up and leaves it up.
        let score = FakeScore::at(-1000);
        let gate = Arc::new(SpawnGate::with_oom_score(Box::new(score.clone())));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (gate, score) = (gate.clone(), score.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mut permit = gate.spawn();
                        let unshield = permit.unshield_oom();
                        assert_eq!(score.now(), 0);
                        std::thread::yield_now();
                        drop(unshield);
                        assert_eq!(score.now(), -1000);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(score.writes().len(), 4 * 50 * 2);
        assert_eq!(score.now(), -1000);
    }

    #[test]
    fn a_child_started_while_unshielded_inherits_zero() {
        // The real file: any process may raise its own score, and lower it back to 0,
        // so "shielded" here is +500 rather than init's -1000 (lowering below 0 needs
        // CAP_SYS_RESOURCE, which even root in a container may lack).
        struct RestoreOwnScore(i32);
        impl Drop for RestoreOwnScore {
            fn drop(&mut self) {
                let _ = OwnOomScore.write(self.0);
            }
        }
        let original = OwnOomScore.read().unwrap();
        if original != 0 {
            eprintln!("skipped: the test process starts at oom_score_adj {original}");
            return;
        }
        let _restore = RestoreOwnScore(original);
        OwnOomScore.write(500).unwrap();
        let gate = SpawnGate::new();
        let mut permit = gate.spawn();
        let unshield = permit.unshield_oom();
        let child = std::process::Command::new("cat")
            .arg("/proc/self/oom_score_adj")
            .output()
            .unwrap();
        drop(unshield);
        assert_eq!(String::from_utf8_lossy(&child.stdout).trim(), "0");
        assert_eq!(OwnOomScore.read().unwrap(), 500);
    }
}
