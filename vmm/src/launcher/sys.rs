//! The syscalls the launcher needs that neither std nor nix wraps: process file
//! descriptors (`pidfd_open`, `pidfd_send_signal`) and a non-blocking `flock`. Every
//! `unsafe` block of the launcher lives here.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::Signal;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A file descriptor that refers to one process, immune to pid reuse: it becomes
/// readable when that process exits and signals sent through it can never reach a
/// different process that later got the same pid.
#[derive(Debug)]
pub(crate) struct PidFd(OwnedFd);

impl PidFd {
    /// Opens a pidfd for `pid`. Works for children and non-children alike, and for a
    /// child that exited but was not reaped yet.
    pub(crate) fn open(pid: u32) -> io::Result<Self> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
        // SAFETY: pidfd_open takes a pid and a flags word and returns a new descriptor or
        // -1; no memory is shared with the kernel.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pidfd out of range"))?;
        // SAFETY: the kernel just returned this descriptor (close-on-exec by definition
        // of pidfd_open) and nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `signal` to the process this descriptor refers to. Fails with `ESRCH` once
    /// it has exited.
    pub(crate) fn send_signal(&self, signal: Signal) -> io::Result<()> {
        // SAFETY: pidfd_send_signal with a null siginfo and zero flags behaves like
        // kill(2) on the referenced process; the descriptor is valid for `self`'s lifetime.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Registers the descriptor with the current tokio reactor; it polls readable once
    /// the process has exited. Needs a runtime.
    pub(crate) fn into_async(self) -> io::Result<AsyncFd<PidFd>> {
        // SAFETY: a `PidFd` owns its descriptor (an `OwnedFd` it never replaces), so
        // `as_raw_fd` returns the same open descriptor for as long as the `AsyncFd`
        // owns the `PidFd`.
        unsafe { AsyncFd::register_with_interest(self, Interest::READABLE) }
            .map_err(io::Error::from)
    }
}

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Takes an exclusive `flock` on `file` without blocking. `Ok(false)` when another
/// open file description holds it. The lock lives until every descriptor sharing the
/// open file description is closed.
pub(crate) fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock only reads the descriptor number, which `file` keeps open for the
    // duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_refuses_signals_once_its_process_is_reaped() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = PidFd::open(child.id()).unwrap();
        child.wait().unwrap();
        let err = pidfd.send_signal(Signal::SIGKILL).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
    }

    #[tokio::test]
    async fn async_pidfd_turns_readable_when_the_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.1")
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id()).unwrap().into_async().unwrap();
        let guard = tokio::time::timeout(std::time::Duration::from_secs(5), fd.readable())
            .await
            .unwrap()
            .unwrap();
        drop(guard);
        assert!(child.try_wait().unwrap().is_some());
    }

    #[test]
    fn flock_is_exclusive_across_open_file_descriptions() {
        let path = std::env::temp_dir().join(format!("sbx-flock-{}", std::process::id()));
        let a = File::create(&path).unwrap();
        let b = File::open(&path).unwrap();
        assert!(try_lock_exclusive(&a).unwrap());
        assert!(!try_lock_exclusive(&b).unwrap());
        drop(a);
        assert!(try_lock_exclusive(&b).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}
