//! The wall clock: reading it for timestamps, setting it after a restore.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::time::TimeSpec;
use nix::time::{clock_settime, ClockId};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_time_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sets `CLOCK_REALTIME` to `unix_ns` nanoseconds since the epoch (needs
/// `CAP_SYS_TIME`).
pub fn set_wall_clock(unix_ns: u64) -> io::Result<()> {
    let time = TimeSpec::from_duration(Duration::from_nanos(unix_ns));
    Ok(clock_settime(ClockId::CLOCK_REALTIME, time)?)
}
