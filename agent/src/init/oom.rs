//! The OOM killer's view of init: never PID 1, and the workload first.
//!
//! The agent sets its own `oom_score_adj` to the minimum. The value is inherited
//! across `fork`, so the process layer gives every child the default back right
//! after starting it (`crate::sys::reset_oom_score_adj`).

use std::fs;

use super::InitError;

/// This process's OOM score adjustment.
pub const OOM_SCORE_ADJ_PATH: &str = "/proc/self/oom_score_adj";

/// The lowest adjustment: the OOM killer never picks this process.
pub const OOM_SCORE_ADJ_MIN: i32 = -1000;

/// Makes the agent exempt from the OOM killer. Needs `CAP_SYS_RESOURCE`.
pub fn protect_self() -> Result<(), InitError> {
    fs::write(OOM_SCORE_ADJ_PATH, OOM_SCORE_ADJ_MIN.to_string()).map_err(|error| {
        InitError::OomScoreAdj {
            path: OOM_SCORE_ADJ_PATH.into(),
            error,
        }
    })
}

/// Whether the agent shields itself from the OOM killer (as init it runs at -1000).
/// Read once: init sets the score before the first child starts.
pub fn agent_is_oom_shielded() -> bool {
    static SHIELDED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHIELDED.get_or_init(|| own_oom_score_adj().is_some_and(|score| score != "0"))
}

fn own_oom_score_adj() -> Option<String> {
    std::fs::read_to_string(OOM_SCORE_ADJ_PATH)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Lowers the agent's OOM shield while children are started, so they inherit the
/// default score from their first instruction (and so does whatever they fork at
/// once); dropping it restores the shield. Resetting the score in the parent after
/// the start left a window, and resetting it in the child needs fork instead of
/// posix_spawn, which costs milliseconds per exec in an emulated guest. The agent
/// is briefly unshielded, which is harmless where shielding happens at all: the
/// kernel never picks the global init (PID 1) as an OOM victim, whatever its score.
#[derive(Debug)]
pub struct OomUnshield {
    restore: Option<String>,
}

impl OomUnshield {
    /// Lowers the shield if the agent has one.
    pub fn new() -> Self {
        if !agent_is_oom_shielded() {
            return Self { restore: None };
        }
        let restore = own_oom_score_adj().filter(|score| score != "0");
        if restore.is_some() {
            // Raising the score is always allowed.
            let _ = std::fs::write(OOM_SCORE_ADJ_PATH, "0");
        }
        Self { restore }
    }
}

impl Default for OomUnshield {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OomUnshield {
    fn drop(&mut self) {
        if let Some(score) = &self.restore {
            if let Err(error) = std::fs::write(OOM_SCORE_ADJ_PATH, score) {
                tracing::error!(%error, "cannot restore the agent's OOM shield");
            }
        }
    }
}
