//! Pseudo-terminals: opening a pair, setting its size, and (in a forked child)
//! taking the terminal as the controlling one.
//!
//! Both ends are opened close-on-exec in the same call, so a child started
//! concurrently never inherits a terminal that is not its own.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use sandbox_protocol::WindowSize;

use super::check;

/// A pseudo-terminal pair, both ends close-on-exec so no other child inherits them.
#[derive(Debug)]
pub struct PtyPair {
    /// The agent's end.
    pub master: OwnedFd,
    /// The child's end (its controlling terminal).
    pub slave: OwnedFd,
}

/// Opens a pseudo-terminal of the given size.
pub fn open_pty(size: WindowSize) -> io::Result<PtyPair> {
    // SAFETY: posix_openpt takes flags and returns a new fd or -1.
    let master =
        check(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `master` is a fresh fd that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: grantpt takes the master fd, which is open for the call.
    if unsafe { libc::grantpt(master.as_raw_fd()) } != 0
        // SAFETY: as above, for unlockpt.
        || unsafe { libc::unlockpt(master.as_raw_fd()) } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: ptsname_r writes at most `name.len()` bytes, NUL-terminated, into `name`.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: on success ptsname_r left a NUL-terminated path in `name`, which is alive here.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) };
    // SAFETY: `path` is a valid C string; open returns a new fd or -1.
    let slave = check(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `slave` is a fresh fd that nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    set_window_size(master.as_fd(), size)?;
    Ok(PtyPair { master, slave })
}

/// Sets a terminal's size; the kernel sends `SIGWINCH` to its foreground group.
pub fn set_window_size(fd: BorrowedFd<'_>, size: WindowSize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which is valid for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) })?;
    Ok(())
}

/// In a forked child: start a new session and make stdin its controlling terminal.
/// Async-signal-safe.
pub(super) fn child_take_terminal() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() })?;
    // SAFETY: TIOCSCTTY takes an integer (0: do not steal); fd 0 is the pty slave.
    check(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_opens_with_the_size_asked_for() {
        let pair = open_pty(WindowSize {
            rows: 30,
            cols: 100,
        })
        .unwrap();
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into `size`, alive for the call.
        let rc = unsafe { libc::ioctl(pair.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
        assert_eq!(rc, 0);
        assert_eq!((size.ws_row, size.ws_col), (30, 100));
    }
}
