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
