//! The only way PID 1 ends: an orderly power-off (or reboot).
//!
//! 1. `SIGTERM` to every process (`kill(-1)` spares the caller),
//! 2. wait up to the grace period while reaping, until no child is left,
//! 3. `SIGKILL` to whatever remains and reap once more,
//! 4. remount `/` read-only (best effort) and `sync`,
//! 5. `reboot(RB_POWER_OFF)` or `reboot(RB_AUTOBOOT)`.
//!
//! **Reaping here breaks the one-reaper rule on purpose:** in the running agent a
//! single reaper task owns `waitpid`. [`power_off`] is called at the very end, after
//! the server and that task have stopped, so nothing else waits any more and exit
//! statuses no longer matter.
//!
//! When the agent is not PID 1 (development), signalling every process would hit the
//! developer's own session, so [`power_off`] just exits the process instead.

use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sys::reboot::{reboot, RebootMode};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{sync, Pid};
use tracing::{error, info, warn};

/// How long PID 1 waits for processes to die after `SIGKILL`.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(1);

/// How often the wait loops poll.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What to do with the machine once every process is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Turn the VM off (the VMM process exits).
    PowerOff,
    /// Restart the guest kernel.
    Reboot,
}

/// Stops every process and powers off (or reboots). Never returns and never panics.
///
/// Outside PID 1 it exits the process with status 0 after logging.
pub fn power_off(grace: Duration, action: PowerAction) -> ! {
    if std::process::id() != 1 {
        info!(
            ?action,
            "not PID 1: exiting instead of shutting the machine down"
        );
        std::process::exit(0);
    }
    info!(?action, grace_ms = grace.as_millis(), "shutting down");

    if signal_all(Signal::SIGTERM) {
        if reap_until_empty(grace) {
            info!("all processes exited");
        } else {
            warn!("processes left after the grace period; killing them");
        }
    }
    if signal_all(Signal::SIGKILL) {
        reap_until_empty(AFTER_KILL_WAIT);
    }

    // Best effort: a read-only root has nothing left to replay. Fails harmlessly on
    // an initramfs root or while something still holds a file open for writing.
    if let Err(errno) = mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    ) {
        info!(%errno, "root not remounted read-only");
    }
    sync();

    let mode = match action {
        PowerAction::PowerOff => RebootMode::RB_POWER_OFF,
        PowerAction::Reboot => RebootMode::RB_AUTOBOOT,
    };
    let Err(errno) = reboot(mode);
    // Only without CAP_SYS_BOOT. Exiting PID 1 makes the kernel panic, and the
    // `panic=-1` the templates set turns that into a reboot, which a VMM started
    // with `-no-reboot` turns into an exit: the VM still ends.
    error!(%errno, "reboot failed; exiting PID 1");
    std::process::exit(1)
}

/// Sends `signal` to every process but this one; false when there was none.
fn signal_all(signal: Signal) -> bool {
    match kill(Pid::from_raw(-1), signal) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(errno) => {
            warn!(%errno, ?signal, "signalling all processes failed");
            false
        }
    }
}

/// Reaps children until none is left or `limit` passes; true when none is left.
fn reap_until_empty(limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            // ECHILD: no children. PID 1 adopts every orphan, so none are left at all.
            Err(_) => return true,
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL_INTERVAL);
    }
}
