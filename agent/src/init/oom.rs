//! The OOM killer's view of init: never PID 1, and the workload first.
//!
//! The agent sets its own `oom_score_adj` to the minimum. The value is inherited
//! across `fork`, so every child resets it to 0 before `exec` with
//! [`reset_oom_score_adj_in_child`].

use std::fs;
use std::io;

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

/// Resets the calling process's `oom_score_adj` to 0, for children between `fork`
/// and `exec` (`CommandExt::pre_exec`).
///
/// Async-signal-safe: only `open`, `write` and `close` on static data, no allocation,
/// no locks. Raising the value always works; when the agent is not PID 1 and its own
/// value was above 0, lowering to 0 is refused (`EACCES`), so callers outside a VM
/// should ignore the error.
pub fn reset_oom_score_adj_in_child() -> io::Result<()> {
    const PATH: &std::ffi::CStr = c"/proc/self/oom_score_adj";
    const ZERO: &[u8] = b"0";
    // SAFETY: PATH is a valid NUL-terminated string with static lifetime; open has no
    // other preconditions.
    let fd = unsafe { libc::open(PATH.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened by this function; ZERO is valid for ZERO.len() bytes.
    let written = unsafe { libc::write(fd, ZERO.as_ptr().cast(), ZERO.len()) };
    let result = if written < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    };
    // SAFETY: fd is owned by this function and closed exactly once.
    unsafe { libc::close(fd) };
    result
}
