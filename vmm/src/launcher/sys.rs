//! The syscalls the launcher needs that neither std nor nix wraps: process file
//! descriptors (`pidfd_open`, `pidfd_send_signal`), a non-blocking `flock`, and the
//! exit watcher of a detached VM. Every `unsafe` block of the launcher lives here.

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

    /// A second descriptor on the same process (`dup`), e.g. to wait on it while the
    /// first is kept for signals.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(Self(self.0.try_clone()?))
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

/// Starts a watcher process that waits for `watched` (a VM's QEMU) to exit and then
/// cleans up after it: stops `victim` (`SIGTERM`, up to `grace_ms` for it to exit,
/// then `SIGKILL`), and unlinks `unlink` (the VM's RAM file on the tmpfs). It is what
/// stops a detached VM's daemon when the guest powers off or panics and QEMU exits
/// with nobody left to notice, and what frees a dead VM's memory at once, whoever
/// owned it: a guest that panicked or powered off, or an owner killed outright (its
/// QEMU dies by its death signal), left 0.2-0.5 GiB in `/dev/shm` per VM until a
/// later boot swept the run folder, forever in a home nobody booted from again.
///
/// The RAM file is this QEMU's alone (its name is fresh for every start, see
/// `Launcher::ram_file`), and once QEMU is gone nothing reads it: a hibernation or a
/// checkpoint copied it while QEMU was paused. So the unlink needs no check.
///
/// The watcher holds nothing but the two pidfds (so it keeps no lock, socket or pipe
/// of this process open), runs in a session of its own, and is nobody's child to reap
/// (a double fork: this process reaps the short-lived middle child at once). This
/// process has other threads, so the child side makes only async-signal-safe system
/// calls on descriptors and memory prepared before the fork: no allocation, no locks.
pub(crate) fn spawn_exit_watcher(
    watched: &PidFd,
    victim: Option<&PidFd>,
    grace_ms: i32,
    unlink: Option<&std::ffi::CStr>,
) -> io::Result<()> {
    let watched = watched.as_raw_fd();
    let victim = victim.map(AsRawFd::as_raw_fd);
    let unlink = unlink.map(std::ffi::CStr::as_ptr);
    // SAFETY: fork(2) duplicates only the calling thread. The child runs
    // `exit_watcher`, which makes raw system calls only and ends in `_exit`, never
    // returning into Rust code that could touch state other threads held locked.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        exit_watcher(watched, victim, grace_ms, unlink);
    }
    // The middle child exits at once; reap exactly it (never `waitpid(-1)`: this is a
    // library in someone else's process).
    loop {
        let mut status = 0;
        // SAFETY: waitpid on the pid just forked, with a valid pointer to a local.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
}

/// The forked side of [`spawn_exit_watcher`]. Async-signal-safe: raw system calls only.
fn exit_watcher(
    watched: RawFd,
    victim: Option<RawFd>,
    grace_ms: i32,
    unlink: Option<*const libc::c_char>,
) -> ! {
    // SAFETY: each call below is a plain system call on integers, a stack-allocated
    // pollfd, or the NUL-terminated path the parent prepared before the fork (the
    // child's copy of its memory stays valid: nothing in the child frees it); none
    // allocates, locks, or returns into the parent's Rust state, and the process ends
    // with `_exit`.
    unsafe {
        libc::setsid();
        // The middle child leaves at once, so the watcher is re-parented to init (or
        // the nearest subreaper) and nobody here has to reap it.
        if libc::fork() != 0 {
            libc::_exit(0);
        }
        // A name that says what it is in `ps` (its command line stays the caller's).
        libc::prctl(libc::PR_SET_NAME, c"sandbox-watch".as_ptr());
        // Keep only the pidfds.
        let keep = victim.unwrap_or(watched);
        let (low, high) = (watched.min(keep), watched.max(keep));
        let close = |from: RawFd, to: RawFd| {
            if from <= to {
                libc::syscall(
                    libc::SYS_close_range,
                    libc::c_uint::try_from(from).unwrap_or(0),
                    libc::c_uint::try_from(to).unwrap_or(0),
                    0,
                );
            }
        };
        close(0, low - 1);
        close(low + 1, high - 1);
        close(high + 1, RawFd::MAX);
        let wait_readable = |fd: RawFd, timeout_ms: i32| -> bool {
            let mut poll_fd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            loop {
                let rc = libc::poll(&mut poll_fd, 1, timeout_ms);
                if rc > 0 {
                    return true;
                }
                if rc == 0 || *libc::__errno_location() != libc::EINTR {
                    return false;
                }
            }
        };
        let signal = |fd: RawFd, signal: libc::c_int| {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        };
        wait_readable(watched, -1);
        if let Some(victim) = victim {
            signal(victim, libc::SIGTERM);
            if !wait_readable(victim, grace_ms) {
                signal(victim, libc::SIGKILL);
            }
        }
        if let Some(path) = unlink {
            libc::unlink(path);
        }
        libc::_exit(0)
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

/// Takes a `flock` on `file`, shared or exclusive, waiting for it (retried on
/// `EINTR`). The lock lives until every descriptor sharing the open file
/// description is closed.
pub(crate) fn lock_blocking(file: &File, exclusive: bool) -> io::Result<()> {
    let operation = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: flock only reads the descriptor number, which `file` keeps open for
        // the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
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
