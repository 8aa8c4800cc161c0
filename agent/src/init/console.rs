//! The console on stdin, stdout and stderr.
//!
//! The kernel opens `/dev/console` as init's fds 0, 1 and 2 when the node exists in
//! the initramfs; when it does not (or a runtime started us with closed fds), logs
//! and children would go nowhere. This fills whichever of the three is closed.

use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{fcntl, open, FcntlArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{close, dup2};

use super::InitError;

/// The kernel console device.
pub const CONSOLE_PATH: &str = "/dev/console";

/// What [`attach_stdio`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConsoleReport {
    /// The standard fds (0, 1, 2) that were closed and now point at the console.
    pub attached: Vec<i32>,
}

/// Points each closed standard fd at [`CONSOLE_PATH`]. Open ones are left alone.
pub fn attach_stdio() -> Result<ConsoleReport, InitError> {
    let missing: Vec<i32> = (0..=2).filter(|fd| !is_open(*fd)).collect();
    if missing.is_empty() {
        return Ok(ConsoleReport::default());
    }
    let console_error = |error: Errno| InitError::Console {
        path: Path::new(CONSOLE_PATH).to_owned(),
        error: error.into(),
    };
    // Not O_CLOEXEC: children inherit stdio. O_NOCTTY: PID 1 must not own a
    // controlling terminal, or a hangup on it would signal init.
    let console = open(CONSOLE_PATH, OFlag::O_RDWR | OFlag::O_NOCTTY, Mode::empty())
        .map_err(console_error)?;
    for fd in &missing {
        if *fd != console {
            dup2(console, *fd).map_err(console_error)?;
        }
    }
    if console > 2 {
        close(console).map_err(console_error)?;
    }
    Ok(ConsoleReport { attached: missing })
}

fn is_open(fd: i32) -> bool {
    fcntl(fd, FcntlArg::F_GETFD).is_ok()
}
