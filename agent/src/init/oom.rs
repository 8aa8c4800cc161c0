//! The OOM killer's view of init: never PID 1, and the workload first.
//!
//! The kernel never picks the machine's init (PID 1 of the initial pid namespace)
//! as a victim, whatever its score, so there the agent leaves its `oom_score_adj`
//! at the default 0 and its children start with the default too: nothing to reset
//! on every start (three system calls in each child, about 0.2 ms of an exec in a
//! TCG guest). PID 1 of a container is not spared by the kernel: there the agent
//! sets its score to the minimum. The value is inherited across `fork`, so every
//! child start of such an agent lowers its score to 0 for the moment of the start
//! and restores it after (`crate::process::gate::OomUnshield`, which only the spawn
//! gate hands out), or has a cloned child reset its own. [`OomScore`] is the seam
//! both use, so tests can watch the score change without touching the test
//! process's own.

use std::fs;
use std::io;

use super::InitError;

/// This process's OOM score adjustment.
pub const OOM_SCORE_ADJ_PATH: &str = "/proc/self/oom_score_adj";

/// The lowest adjustment: the OOM killer never picks this process.
pub const OOM_SCORE_ADJ_MIN: i32 = -1000;

/// Reads and writes one process's `oom_score_adj`.
///
/// The kernel lets any process raise its own score, but lowering it below the lowest
/// value it set while privileged needs `CAP_SYS_RESOURCE`.
pub trait OomScore: Send + std::fmt::Debug {
    /// The current adjustment.
    fn read(&self) -> io::Result<i32>;
    /// Sets the adjustment.
    fn write(&mut self, score: i32) -> io::Result<()>;
}

/// The agent's own score, through [`OOM_SCORE_ADJ_PATH`].
#[derive(Debug, Default, Clone, Copy)]
pub struct OwnOomScore;

impl OomScore for OwnOomScore {
    fn read(&self) -> io::Result<i32> {
        fs::read_to_string(OOM_SCORE_ADJ_PATH)?
            .trim()
            .parse()
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
    }

    fn write(&mut self, score: i32) -> io::Result<()> {
        fs::write(OOM_SCORE_ADJ_PATH, score.to_string())
    }
}

/// What keeps init from the OOM killer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// The kernel: this is the machine's init. The score stays 0.
    Kernel,
    /// Its score, set to the minimum: this is a container's init.
    Score,
}

/// Makes the agent exempt from the OOM killer: nothing to do as the machine's
/// init; as a container's, its score goes to the minimum (needs
/// `CAP_SYS_RESOURCE`). Runs before the runtime starts, so before any child start
/// can lower the score.
pub fn protect_self() -> Result<Protection, InitError> {
    if super::is_machine_init() {
        return Ok(Protection::Kernel);
    }
    OwnOomScore
        .write(OOM_SCORE_ADJ_MIN)
        .map(|()| Protection::Score)
        .map_err(|error| InitError::OomScoreAdj {
            path: OOM_SCORE_ADJ_PATH.into(),
            error,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_score_reads_as_a_number() {
        let score = OwnOomScore.read().unwrap();
        assert!((OOM_SCORE_ADJ_MIN..=1000).contains(&score));
    }
}
