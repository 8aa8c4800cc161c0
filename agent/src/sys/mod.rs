//! The agent's system calls: the one module allowed `unsafe`, so the unsafe surface
//! is a single folder to audit.
//!
//! The crate roots deny `unsafe_code` and this module alone allows it back, so the
//! compiler (not a convention) keeps raw calls from spreading. Every function here is
//! safe to call; every `unsafe` block inside carries a `// SAFETY:` line saying which
//! rule of the call makes it sound. Where `nix` has a safe wrapper it is used instead
//! of raw `libc`.
//!
//! Functions marked "async-signal-safe" run in a forked child before `exec` and so
//! must not allocate or take locks.
//!
//! # Layout
//! - [`fd`]: non-blocking mode, reads and writes on a raw descriptor, and handing a
//!   descriptor to tokio's reactor.
//! - [`inotify`]: an inotify instance on tokio's reactor (`wait_for_text` on files).
//! - [`pty`]: opening a pseudo-terminal pair, its window size, and a child taking it
//!   as its controlling terminal.
//! - [`proc`]: the child subreaper, signalling process groups and single processes,
//!   and what a forked child does before `exec` (join its cgroup, terminal, user
//!   switch).
//! - [`spawn`]: starting a child straight into its cgroup (`clone3` with
//!   `CLONE_INTO_CGROUP`, sharing memory until `exec` as `posix_spawn` does).
//! - [`cgroup`]: recognising and mounting cgroup2.
//! - [`net`]: network interface flags (bringing `lo` up).
//! - [`random`]: random bytes and ids, and feeding and reseeding the kernel's pool.
//! - [`clock`]: reading and setting the wall clock.
//! - [`alloc`]: allocator tuning (large buffers go back to the kernel).
//! - [`limits`]: the agent's own resource limits (open files).

#![allow(unsafe_code)]

pub mod alloc;
pub mod cgroup;
pub mod clock;
pub mod fd;
pub mod inotify;
pub mod limits;
pub mod net;
pub mod proc;
pub mod pty;
pub mod random;
pub mod spawn;

use std::io;

pub use alloc::return_large_allocations_to_the_kernel;
pub use cgroup::{
    is_cgroup2, is_procfs, is_read_only, mount_cgroup2, mount_proc, remount_read_write,
};
pub use clock::{set_wall_clock, unix_time_ms};
pub use fd::{
    bytes_queued, read, read_into_spare, register_async, set_fresh_pipe_nonblocking,
    set_nonblocking, set_pipe_size, write,
};
pub use limits::raise_open_file_limit;
pub use net::{interface_flags, set_interface_flags};
pub use proc::{
    kill_process, kill_process_group, run_this_thread_when_idle, set_child_subreaper, set_pre_exec,
    ChildUser, PreExec,
};
pub use pty::{open_pty, set_window_size, PtyPair};
pub use random::{add_entropy_and_reseed, random_bytes, random_hex};

/// Turns the `-1`-and-`errno` convention of a raw call into a `Result`.
/// Async-signal-safe: reading `errno` neither allocates nor locks.
fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
