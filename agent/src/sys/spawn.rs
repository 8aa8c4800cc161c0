//! Starting a child straight into its cgroup: `clone3` with `CLONE_INTO_CGROUP`
//! (Linux 5.7), sharing the agent's memory until `exec` as `posix_spawn` does.
//!
//! # Why not `fork`
//! Measured in a TCG guest, a `fork` of the agent costs milliseconds more than
//! `posix_spawn` (the page tables are copied, then every page either side touches
//! faults), and joining a cgroup from the child by writing to `cgroup.procs` is a
//! migration, the slowest way into a cgroup. `clone3` with
//! `CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP | CLONE_CLEAR_SIGHAND` has neither
//! cost: the child borrows the agent's memory on a stack of its own, is born in its
//! cgroup (so the program and all it forks start there), and has no signal handler
//! of the agent's from its first instruction. The calling thread sleeps until the
//! child has called `execve` or exited, so the outcome is known when the call
//! returns: an `exec` that failed left its `errno` in memory the two share (as
//! glibc's and musl's `posix_spawn` report it), and the child is reaped here.
//!
//! # What the child may do
//! It shares the agent's memory with the agent's other threads, which keep running:
//! it only reads the [`ChildImage`] built before the clone, writes to its own stack
//! and to the shared error word, and makes raw system calls. No allocation, no
//! locks, no libc function that keeps process-wide state: the user switch uses the
//! raw `setgroups`/`setgid`/`setuid` calls, because libc's broadcast the change to
//! every thread of the process, which would be the agent's.
//!
//! # Where
//! The entry into the child is a few lines of assembly (a new stack cannot be
//! entered from Rust), written for x86-64, the guest's architecture. Elsewhere, or
//! on a kernel without these flags, [`clone_into_cgroup`] answers
//! [`CloneError::Unsupported`] and the caller forks as before.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use super::check;
use super::proc::ChildUser;

/// The child's stack. Its code makes a handful of calls, none deep; glibc's
/// `posix_spawn` gets by with 32 KiB for the same work.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// One page below the stack, never mapped, so an overflow faults in the child
/// instead of writing over the agent's memory.
const GUARD_BYTES: usize = 4096;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Debug, Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Why a child could not be started.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    /// This kernel or architecture cannot clone into a cgroup: fork instead.
    #[error("Cannot clone into a cgroup here")]
    Unsupported,
    /// `clone3` failed (`EAGAIN` at the cgroup's `pids.max`, `ENOMEM`, ...).
    #[error("Cannot clone a child")]
    Clone(#[source] io::Error),
    /// The child failed before its program ran (`ENOENT`, `EACCES` from `execve`,
    /// or a step before it); it has been reaped.
    #[error("The child failed before exec")]
    Exec(#[source] io::Error),
}

/// A stack for children, reused from one start to the next (starts are serialised
/// by the spawn gate, and a child leaves it at `execve`).
#[derive(Debug)]
pub struct ChildStack {
    /// The mapping: the guard page, then the stack.
    base: *mut c_void,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone; moving it to another thread moves
// nothing but the address, and `&mut self` is needed to lend it to a child.
unsafe impl Send for ChildStack {}

impl ChildStack {
    /// Maps a stack with a guard page below it.
    pub fn new() -> io::Result<Self> {
        let len = CHILD_STACK_BYTES + GUARD_BYTES;
        // SAFETY: an anonymous private mapping at an address the kernel picks touches
        // no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the first page of the mapping just made, which nothing uses yet.
        check(unsafe { libc::mprotect(base, GUARD_BYTES, libc::PROT_NONE) })?;
        Ok(stack)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unused once its owner is dropped (a child
        // leaves it before the clone returns).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// How the child's process group and session are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildSession {
    /// A process group of its own (`setpgid(0, 0)`).
    OwnGroup,
    /// A session of its own with stdin (a pty slave) as its controlling terminal.
    Terminal,
}

/// Everything the child reads, built (and allocated) before the clone.
#[derive(Debug)]
pub struct ChildImage {
    program: CString,
    /// Owns the strings `argv_ptrs` points to.
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    /// Owns the strings `envp_ptrs` points to.
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const c_char>,
    cwd: CString,
    /// Descriptors that become the child's 0, 1 and 2; none of them is below 3.
    stdio: [OwnedFd; 3],
    session: ChildSession,
    user: Option<ChildUser>,
    /// Set `oom_score_adj` to 0 (the agent's shield is not for its children).
    reset_oom_score: bool,
    /// Put `SIGINT` and `SIGQUIT` back to their default action.
    default_interrupt: bool,
}

/// A string with a NUL byte inside cannot be passed to the kernel.
fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A NULL-terminated array of pointers into `strings`, which must outlive it.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// `fd` moved to a number of 3 or more, so that putting the three streams in place
/// in the child never overwrites one that is still to be moved.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC takes an integer and returns a new fd or -1.
    let moved = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: `moved` is a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

impl ChildImage {
    /// The image of `program` run as `argv` (`argv[0]` as the child sees it) with
    /// exactly `env`, in `cwd`, on the given streams (stdin, stdout, stderr).
    pub fn new(
        program: &std::path::Path,
        argv: &[&str],
        env: &[(String, String)],
        cwd: &str,
        stdio: [OwnedFd; 3],
        session: ChildSession,
        user: Option<ChildUser>,
    ) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let program = CString::new(program.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let argv = argv
            .iter()
            .map(|arg| c_string(arg))
            .collect::<io::Result<Vec<_>>>()?;
        let envp = env
            .iter()
            .map(|(key, value)| c_string(&format!("{key}={value}")))
            .collect::<io::Result<Vec<_>>>()?;
        let [stdin, stdout, stderr] = stdio;
        Ok(Self {
            program,
            argv_ptrs: pointers(&argv),
            _argv: argv,
            envp_ptrs: pointers(&envp),
            _envp: envp,
            cwd: c_string(cwd)?,
            stdio: [
                above_stdio(stdin)?,
                above_stdio(stdout)?,
                above_stdio(stderr)?,
            ],
            session,
            user,
            reset_oom_score: false,
            default_interrupt: false,
        })
    }

    /// Has the child set its `oom_score_adj` to 0 before `exec` (a vfork child's
    /// score is its own: the kernel does not pass it to the agent that shares its
    /// memory). Best effort: a child that cannot keeps the agent's score, as a
    /// forked child does when the agent cannot lower its own.
    pub fn with_oom_score_reset(mut self, reset: bool) -> Self {
        self.reset_oom_score = reset;
        self
    }

    /// Has the child put `SIGINT` and `SIGQUIT` back to their default action, even
    /// when the agent ignores them (CLONE_CLEAR_SIGHAND resets only handled ones):
    /// an interpreter session is interrupted with `SIGINT`, and a shell cannot trap
    /// a signal that was ignored when it started.
    pub fn with_default_interrupt(mut self, default: bool) -> Self {
        self.default_interrupt = default;
        self
    }

    /// The child's streams back, for a start that has to fork after all.
    pub fn into_stdio(self) -> [OwnedFd; 3] {
        self.stdio
    }
}

/// What the child shares with the parent for the length of the clone.
struct Shared<'a> {
    image: &'a ChildImage,
    /// The `errno` of the step that failed, 0 while none did.
    error: AtomicI32,
}

/// Starts `image` in the cgroup whose directory is open as `cgroup`, on `stack`;
/// returns its pid once it has called `execve`. The caller must hold the spawn
/// gate: a child whose `exec` failed is reaped here, and the child must be in the
/// process table before the reaper can see its exit.
pub fn clone_into_cgroup(
    stack: &mut ChildStack,
    image: &ChildImage,
    cgroup: BorrowedFd<'_>,
) -> Result<i32, CloneError> {
    let shared = Shared {
        image,
        error: AtomicI32::new(0),
    };
    let fd = u64::try_from(cgroup.as_raw_fd()).map_err(|_| CloneError::Unsupported)?;
    let mut args = CloneArgs {
        flags: CLONE_VM | CLONE_VFORK | CLONE_CLEAR_SIGHAND | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        // The lowest address of the stack; the kernel starts the child at its top.
        stack: stack.base as u64 + GUARD_BYTES as u64,
        stack_size: CHILD_STACK_BYTES as u64,
        cgroup: fd,
        ..CloneArgs::default()
    };
    let arg = std::ptr::from_ref(&shared).cast_mut().cast::<c_void>();
    // SAFETY: `args` describes a live stack that only this child uses (the `&mut`
    // borrow) and a live cgroup fd; `child_main` gets `shared`, which lives on this
    // frame until the call returns, and with CLONE_VFORK the call returns only once
    // the child has exec'd or exited, so it never sees `shared` freed.
    let rc = unsafe { clone3(&mut args, child_main, arg) };
    if rc < 0 {
        let errno = c_int::try_from(-rc).unwrap_or(libc::EINVAL);
        return Err(match errno {
            // No clone3 (< 5.3), or no CLONE_CLEAR_SIGHAND (< 5.5) or
            // CLONE_INTO_CGROUP (< 5.7, which also refuses the larger argument).
            libc::ENOSYS | libc::EINVAL | libc::E2BIG => CloneError::Unsupported,
            errno => CloneError::Clone(io::Error::from_raw_os_error(errno)),
        });
    }
    let pid = i32::try_from(rc).map_err(|_| CloneError::Clone(io::Error::other("bad pid")))?;
    match shared.error.load(Ordering::Acquire) {
        0 => Ok(pid),
        errno => {
            reap(pid);
            Err(CloneError::Exec(io::Error::from_raw_os_error(errno)))
        }
    }
}

/// Collects the exit of a child that failed before `exec`.
fn reap(pid: i32) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes one int into `status`, alive for the call.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// The raw `clone3` call; in the child, `child(arg)` runs on the new stack and never
/// returns. Answers the child's pid or `-errno`.
///
/// # Safety
/// `args` must name a stack that nothing else uses while the child runs, and `arg`
/// must stay valid for what `child` does with it until the child has exec'd or exited.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3(
    args: &mut CloneArgs,
    child: extern "C" fn(*mut c_void) -> !,
    arg: *mut c_void,
) -> i64 {
    let rc: i64;
    // SAFETY: the caller's contract above. In the parent this is a plain system call
    // (rcx and r11 clobbered). The child starts after `syscall` with rax = 0 and rsp at
    // the top of its 16-byte-aligned stack, clears the frame pointer (the end of the
    // call chain for unwinders) and calls `child` with `arg`; `child` never returns,
    // and `ud2` stops the child if it ever did.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => rc,
            in("rdi") std::ptr::from_mut(args),
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") child,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    rc
}

/// Elsewhere the child cannot be entered: the caller forks instead.
///
/// # Safety
/// None needed; the signature matches the x86-64 one.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3(
    _args: &mut CloneArgs,
    _child: extern "C" fn(*mut c_void) -> !,
    _arg: *mut c_void,
) -> i64 {
    -i64::from(libc::ENOSYS)
}

/// The child, on its own stack in the agent's memory: the steps before `execve`,
/// then `execve`; on failure the `errno` goes to the parent and the child exits.
extern "C" fn child_main(arg: *mut c_void) -> ! {
    // SAFETY: `arg` is the `Shared` that `clone_into_cgroup` passed; it outlives the
    // child's use of it (the parent sleeps until the child exec'd or exited).
    let shared = unsafe { &*arg.cast::<Shared<'_>>() };
    let errno = child_exec(shared.image);
    shared.error.store(errno, Ordering::Release);
    // SAFETY: _exit ends this process (a thread group of its own) without running
    // anything of the agent's.
    unsafe { libc::_exit(127) }
}

/// The child's steps; returns the `errno` of the one that failed. Async-signal-safe
/// and free of shared state (see the module docs): raw calls on data built before
/// the clone only.
fn child_exec(image: &ChildImage) -> c_int {
    match child_steps(image) {
        Ok(()) => {}
        Err(errno) => return errno,
    }
    // SAFETY: the three pointers are a NUL-terminated path and two NULL-terminated
    // arrays of NUL-terminated strings, all owned by `image`, alive in the shared memory.
    unsafe {
        libc::execve(
            image.program.as_ptr(),
            image.argv_ptrs.as_ptr(),
            image.envp_ptrs.as_ptr(),
        )
    };
    errno()
}

/// This thread's `errno`. Reading it neither allocates nor locks.
fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

/// A raw call's result: `Err(errno)` when it returned -1.
fn ok(rc: libc::c_long) -> Result<(), c_int> {
    if rc < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// The kernel's `struct sigaction` (not libc's, whose layout differs).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Puts `signal` back to its default action. Raw: libc's wrapper may take a lock.
fn set_default_action(signal: c_int) -> Result<(), c_int> {
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: rt_sigaction reads one kernel sigaction from a live value and writes
    // nothing (NULL old action); the size is the kernel's sigset size.
    ok(unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            libc::c_long::from(signal),
            &default,
            std::ptr::null_mut::<KernelSigaction>(),
            std::mem::size_of::<u64>(),
        )
    })
}

fn child_steps(image: &ChildImage) -> Result<(), c_int> {
    // Signals as std leaves them for a child: SIGPIPE (which the Rust runtime ignores)
    // back to its default, nothing blocked. CLONE_CLEAR_SIGHAND already reset every
    // handled signal; ignored ones other than SIGPIPE (and a session's SIGINT and
    // SIGQUIT) stay ignored, as across exec.
    set_default_action(libc::SIGPIPE)?;
    if image.default_interrupt {
        set_default_action(libc::SIGINT)?;
        set_default_action(libc::SIGQUIT)?;
    }
    let empty: u64 = 0;
    let sigset_bytes = std::mem::size_of::<u64>();
    // SAFETY: rt_sigprocmask reads one sigset from a live value and writes nothing.
    ok(unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::c_long::from(libc::SIG_SETMASK),
            &empty,
            std::ptr::null_mut::<u64>(),
            sigset_bytes,
        )
    })?;

    if image.session == ChildSession::OwnGroup {
        // SAFETY: setpgid takes plain integers.
        ok(unsafe { libc::setpgid(0, 0) }.into())?;
    } else {
        // SAFETY: setsid takes no arguments.
        ok(unsafe { libc::setsid() }.into())?;
    }
    for (target, source) in (0..).zip(&image.stdio) {
        put_stdio(source.as_raw_fd(), target)?;
    }
    if image.session == ChildSession::Terminal {
        // SAFETY: TIOCSCTTY takes an integer (0: do not steal); fd 0 is the pty slave.
        ok(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) }.into())?;
    }
    // Before the user switch, which would make the file root's.
    if image.reset_oom_score {
        reset_oom_score();
    }
    if let Some(user) = &image.user {
        switch_user(user)?;
    }
    // SAFETY: chdir reads a NUL-terminated path owned by `image`.
    ok(unsafe { libc::chdir(image.cwd.as_ptr()) }.into())
}

/// Sets this process's `oom_score_adj` to 0; failures are ignored (see
/// [`ChildImage::with_oom_score_reset`]).
fn reset_oom_score() {
    // Raw: musl's `open` follows an O_CLOEXEC open with an `fcntl` for kernels that
    // ignored the flag, one system call more on every start.
    // SAFETY: openat reads a NUL-terminated literal path; it returns a new fd or -1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::c_long::from(libc::AT_FDCWD),
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::c_long::from(libc::O_WRONLY | libc::O_CLOEXEC),
        )
    };
    let Ok(fd) = c_int::try_from(rc) else {
        return;
    };
    if fd < 0 {
        return;
    }
    // SAFETY: write reads one byte from a live literal; `fd` was just opened.
    unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    // SAFETY: `fd` is this function's own descriptor.
    unsafe { libc::close(fd) };
}

/// Puts `source` at `target` (0, 1 or 2), open across `execve`. The sources are all
/// above 2 (see [`above_stdio`]), so no move overwrites a source still to come.
fn put_stdio(source: RawFd, target: RawFd) -> Result<(), c_int> {
    // SAFETY: dup2 takes two integers; the new descriptor is not close-on-exec.
    ok(unsafe { libc::dup2(source, target) }.into())
}

/// Groups first, then gid, then uid: once the uid is dropped the others can no
/// longer be changed. Raw calls: libc's wrappers would change every thread of the
/// process, and this process shares the agent's memory and so its thread list.
fn switch_user(user: &ChildUser) -> Result<(), c_int> {
    // SAFETY: setgroups reads `groups.len()` gids from a live slice.
    ok(unsafe { libc::syscall(libc::SYS_setgroups, user.groups.len(), user.groups.as_ptr()) })?;
    // SAFETY: setgid takes a plain integer.
    ok(unsafe { libc::syscall(libc::SYS_setgid, libc::c_long::from(user.gid)) })?;
    // SAFETY: setuid takes a plain integer.
    ok(unsafe { libc::syscall(libc::SYS_setuid, libc::c_long::from(user.uid)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn pointer_arrays_end_with_null() {
        let strings = vec![c_string("a").unwrap(), c_string("bc").unwrap()];
        let ptrs = pointers(&strings);
        assert_eq!(ptrs.len(), 3);
        assert!(ptrs[2].is_null());
        assert_eq!(ptrs[1], strings[1].as_ptr());
    }

    #[test]
    fn clone_args_have_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }

    /// This process's own cgroup2 directory, open, when there is one to clone into.
    fn own_cgroup() -> Option<std::fs::File> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = mounts.lines().find_map(|line| {
            let (fields, fs) = line.split_once(" - ")?;
            fs.starts_with("cgroup2 ")
                .then(|| fields.split(' ').nth(4))?
        })?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        std::fs::File::open(format!("{mount}{own}")).ok()
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
    }

    fn image(program: &str, script: &str, stdio: [OwnedFd; 3]) -> ChildImage {
        ChildImage::new(
            std::path::Path::new(program),
            &["sh", "-c", script],
            &[("FOO".into(), "bar baz".into())],
            "/tmp",
            stdio,
            ChildSession::OwnGroup,
            None,
        )
        .unwrap()
    }

    /// Clones `image` into this process's cgroup; `None` (test skipped) where the
    /// kernel or the sandbox the tests run in does not allow it.
    fn clone_here(image: &ChildImage) -> Option<Result<i32, CloneError>> {
        let Some(cgroup) = own_cgroup() else {
            eprintln!("skipped: no cgroup2 directory of our own");
            return None;
        };
        let mut stack = ChildStack::new().unwrap();
        match clone_into_cgroup(&mut stack, image, cgroup.as_fd()) {
            Err(CloneError::Unsupported) => {
                eprintln!("skipped: this kernel cannot clone into a cgroup");
                None
            }
            Err(CloneError::Clone(error)) => {
                eprintln!("skipped: clone3 refused: {error}");
                None
            }
            other => Some(other),
        }
    }

    #[test]
    fn a_cloned_child_runs_in_its_own_group_with_its_streams_env_and_cwd() {
        use std::io::Read;
        let (out_read, out_write) = pipe();
        let (err_read, err_write) = pipe();
        let stdin = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let script = "echo \"$FOO\"; pwd; grep ^0:: /proc/self/cgroup; \
                      echo $$ $(cut -d' ' -f5 /proc/$$/stat); \
                      grep -E '^Sig(Blk|Ign)' /proc/self/status; echo oops >&2; exit 3";
        let image = image("/bin/sh", script, [stdin, out_write, err_write]);
        let Some(cloned) = clone_here(&image) else {
            return;
        };
        let pid = cloned.unwrap();
        drop(image); // the agent's copies of the child's ends
        let mut out = String::new();
        std::fs::File::from(out_read)
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        std::fs::File::from(err_read)
            .read_to_string(&mut err)
            .unwrap();
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 3)
        );
        assert_eq!(err, "oops\n");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "bar baz", "{out}");
        assert_eq!(lines[1], "/tmp", "{out}");
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(own.lines().any(|l| l == lines[2]), "{out} vs {own}");
        // Its own process group: pgid = pid.
        assert_eq!(lines[3], format!("{pid} {pid}"), "{out}");
        // Nothing blocked, and SIGPIPE (which the test harness ignores) back to its
        // default. (Signals ignored by whoever started the tests stay ignored.)
        assert_eq!(lines[4], "SigBlk:\t0000000000000000", "{out}");
        let ignored = lines[5].strip_prefix("SigIgn:\t").unwrap();
        let ignored = u64::from_str_radix(ignored, 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
    }

    #[test]
    fn a_failed_exec_comes_back_as_its_errno_and_is_reaped() {
        let stdio = [(); 3].map(|()| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let image = image("/definitely/not/here", "true", stdio);
        let Some(cloned) = clone_here(&image) else {
            return;
        };
        match cloned {
            Err(CloneError::Exec(error)) => {
                assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn streams_below_three_are_moved_up_first() {
        // 0, 1 and 2 of the test process itself stand in for pipes that landed there.
        let low = [0, 1, 2].map(|fd| {
            // SAFETY: dup of a standard stream returns a new fd or -1.
            let dup = unsafe { libc::dup(fd) };
            assert!(dup >= 0);
            // SAFETY: `dup` is a fresh fd that nothing else owns.
            let dup = unsafe { OwnedFd::from_raw_fd(dup) };
            above_stdio(dup).unwrap()
        });
        assert!(low.iter().all(|fd| fd.as_raw_fd() > 2));
    }
}
