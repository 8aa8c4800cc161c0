//! Processes: the child subreaper, signalling process groups, and what a forked
//! child does between `fork` and `exec`.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use super::check;

/// Makes this process adopt orphaned descendants, as PID 1 does, so the one reaper
/// sees every exit in the sandbox even when the agent is not init.
pub fn set_child_subreaper() -> io::Result<()> {
    Ok(nix::sys::prctl::set_child_subreaper(true)?)
}

/// Sends `signal` to every process in process group `pgid`. Takes a raw number
/// rather than `nix`'s `Signal` because clients may send real-time signals, which
/// that enum cannot name.
pub fn kill_process_group(pgid: i32, signal: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill takes plain integers; a negative pid addresses the group.
    check(unsafe { libc::kill(-pgid, signal) })?;
    Ok(())
}

/// How many processes are in process group `pgid` now (from `/proc/*/stat`). While
/// one is, the kernel keeps the number allocated (a pid attached to a task as its
/// group is never handed to a new process), so signalling the group reaches only them.
pub fn process_group_members(pgid: i32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            // After the command's closing parenthesis: state, ppid, pgrp.
            let fields = stat.rsplit_once(')').map(|(_, rest)| rest);
            let pgrp = fields.and_then(|rest| rest.split_whitespace().nth(2));
            let zombie = fields.and_then(|rest| rest.split_whitespace().next()) == Some("Z");
            !zombie && pgrp.and_then(|p| p.parse::<i32>().ok()) == Some(pgid)
        })
        .count()
}

/// Sends `signal` to the single process `pid` (a member of a workload cgroup).
pub fn kill_process(pid: i32, signal: i32) -> io::Result<()> {
    if pid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill takes plain integers; a positive pid addresses one process.
    check(unsafe { libc::kill(pid, signal) })?;
    Ok(())
}

/// Puts the calling thread in `SCHED_IDLE`: it runs only when nothing else on its
/// CPU wants to (raw call: musl's `sched_setscheduler` always fails, as POSIX says
/// the policy is per process, where Linux keeps it per thread).
pub fn run_this_thread_when_idle() -> io::Result<()> {
    // The kernel's `struct sched_param` is one int (libc's may carry more fields).
    let priority: libc::c_int = 0;
    // SAFETY: sched_setscheduler reads one sched_param (an int) from a live value;
    // pid 0 is the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            libc::c_long::from(libc::SCHED_IDLE),
            &priority,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The uid, gid and supplementary groups a child switches to, resolved before
/// `fork` (reading the group database allocates and takes locks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildUser {
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
}

/// What a child does in the forked process before `exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreExec {
    /// Write `0` to this open `cgroup.procs` file: the child moves itself into that
    /// cgroup before anything else, so the program and all it forks start there.
    /// (Only where the kernel cannot clone a child into its cgroup, see
    /// [`super::spawn`].)
    /// The caller keeps the descriptor open until the start returned (it is
    /// close-on-exec, so the program never sees it).
    pub join_cgroup: Option<RawFd>,
    /// Start a new session with stdin (a pty slave) as its controlling terminal.
    pub take_terminal: bool,
    /// Become this user.
    pub user: Option<ChildUser>,
    /// Put `SIGINT` and `SIGQUIT` back to their default action, whatever the agent
    /// inherited: an interpreter session is interrupted with `SIGINT`, and a shell
    /// cannot trap a signal that was ignored when it started.
    pub default_interrupt: bool,
}

impl PreExec {
    /// Whether there is anything to do; without a hook, std starts the child with
    /// `posix_spawn`, which is much cheaper than `fork`.
    pub fn is_empty(&self) -> bool {
        !self.take_terminal
            && self.user.is_none()
            && self.join_cgroup.is_none()
            && !self.default_interrupt
    }
}

/// Has `command` carry out `steps` in the child before `exec`. Adds no hook when
/// there is nothing to do, so std keeps its faster `posix_spawn` path.
pub fn set_pre_exec(command: &mut Command, steps: PreExec) {
    if steps.is_empty() {
        return;
    }
    // SAFETY: `pre_exec` requires the closure to be async-signal-safe, since it runs
    // in the forked child of a possibly multi-threaded parent: it only makes the raw
    // calls of `child_take_terminal`, `child_default_interrupt` and
    // `child_switch_user` (no allocation, no locks), and everything it reads
    // (`steps`, the group list) was built before the fork.
    unsafe {
        command.pre_exec(move || {
            if let Some(procs) = steps.join_cgroup {
                child_join_cgroup(procs)?;
            }
            if steps.default_interrupt {
                child_default_interrupt()?;
            }
            if steps.take_terminal {
                super::pty::child_take_terminal()?;
            }
            if let Some(user) = &steps.user {
                child_switch_user(user)?;
            }
            Ok(())
        });
    }
}

/// In a forked child: move into the cgroup whose `cgroup.procs` is open as `procs`
/// ("0" names the writer). Async-signal-safe.
fn child_join_cgroup(procs: RawFd) -> io::Result<()> {
    let pid = b"0";
    // SAFETY: write reads `pid.len()` bytes from a live array; `procs` was opened by
    // the parent before the fork and stays open until the start returns.
    let written = unsafe { libc::write(procs, pid.as_ptr().cast(), pid.len()) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// In a forked child: `SIGINT` and `SIGQUIT` to their default action.
/// Async-signal-safe: `sigaction` is, and the action is built on the stack.
fn child_default_interrupt() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags);
        // only its handler is set.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = libc::SIG_DFL;
        // SAFETY: `action` is a complete, live `sigaction`; the old action is not
        // asked for (null).
        check(unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// In a forked child: become `user`. Groups first, then gid, then uid: once the uid
/// is dropped the others can no longer be changed. Async-signal-safe.
fn child_switch_user(user: &ChildUser) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from a live slice.
    check(unsafe { libc::setgroups(user.groups.len(), user.groups.as_ptr()) })?;
    // SAFETY: setgid and setuid take plain integers.
    check(unsafe { libc::setgid(user.gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setuid(user.uid) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_groups_up_to_init_are_refused() {
        for pgid in [-5, 0, 1] {
            let error = kill_process_group(pgid, 0).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn nothing_to_do_before_exec_keeps_the_fast_path() {
        assert!(PreExec::default().is_empty());
        assert!(!PreExec {
            take_terminal: true,
            ..PreExec::default()
        }
        .is_empty());
        assert!(!PreExec {
            join_cgroup: Some(3),
            ..PreExec::default()
        }
        .is_empty());
        assert!(!PreExec {
            default_interrupt: true,
            ..PreExec::default()
        }
        .is_empty());
    }
}
