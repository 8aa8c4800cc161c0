//! The agent's system calls that need `unsafe` or raw `libc`, in one place.
//!
//! Functions marked "async-signal-safe" run in a forked child before `exec` and so
//! must not allocate or take locks.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{SystemTime, UNIX_EPOCH};

use sandbox_protocol::WindowSize;

/// Makes this process adopt orphaned descendants, as PID 1 does, so the one reaper
/// sees every exit in the sandbox even when the agent is not init.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `signal` to every process in process group `pgid`.
pub fn kill_process_group(pgid: i32, signal: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill takes plain integers; a negative pid addresses the group.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

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
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if master < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `master` is a fresh fd that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: grantpt/unlockpt take the master fd, which is valid for these calls.
    if unsafe { libc::grantpt(master.as_raw_fd()) } != 0
        // SAFETY: as above.
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
    let slave = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
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
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts `fd` into non-blocking mode (for tokio's `AsyncFd`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid fd touch no memory.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// In a forked child: start a new session and make stdin its controlling terminal.
/// Async-signal-safe.
pub fn child_take_terminal() -> io::Result<()> {
    // SAFETY: setsid and ioctl(TIOCSCTTY) take no pointers; fd 0 is the pty slave.
    unsafe {
        if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In a forked child: become `uid`/`gid` with supplementary `groups`. Async-signal-safe.
pub fn child_switch_user(uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from a live slice; setgid/setuid take ints.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the agent shields itself from the OOM killer (as init it runs at -1000).
/// Read once: init sets the score before the first child starts.
pub fn agent_is_oom_shielded() -> bool {
    static SHIELDED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHIELDED.get_or_init(|| own_oom_score_adj().is_some_and(|score| score != "0"))
}

fn own_oom_score_adj() -> Option<String> {
    std::fs::read_to_string(OWN_OOM_SCORE_ADJ)
        .ok()
        .map(|s| s.trim().to_owned())
}

const OWN_OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// Lowers the agent's OOM shield while children are started, so they inherit the
/// default score from their first instruction (and so does whatever they fork at
/// once); dropping it restores the shield. Resetting the score in the parent after
/// the start left a window, and resetting it in the child needs fork instead of
/// posix_spawn, which costs milliseconds per exec in an emulated guest. The agent
/// is briefly unshielded, which is harmless where shielding happens at all: the
/// kernel never picks the global init (PID 1) as an OOM victim, whatever its score.
#[derive(Debug)]
pub struct OomUnshield {
    restore: Option<String>,
}

impl OomUnshield {
    /// Lowers the shield if the agent has one.
    pub fn new() -> Self {
        if !agent_is_oom_shielded() {
            return Self { restore: None };
        }
        let restore = own_oom_score_adj().filter(|score| score != "0");
        if restore.is_some() {
            // Raising the score is always allowed.
            let _ = std::fs::write(OWN_OOM_SCORE_ADJ, "0");
        }
        Self { restore }
    }
}

impl Default for OomUnshield {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OomUnshield {
    fn drop(&mut self) {
        if let Some(score) = &self.restore {
            if let Err(error) = std::fs::write(OWN_OOM_SCORE_ADJ, score) {
                tracing::error!(%error, "cannot restore the agent's OOM shield");
            }
        }
    }
}

/// `len` random bytes as hex, for ids and temp names: from the kernel's generator
/// without waiting for it to be seeded (`GRND_INSECURE`: uniqueness, not secrecy, is
/// needed). Should that fail, the kernel's per-boot id, the wall clock and a
/// process-wide counter still make every value distinct.
pub fn random_hex(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the live buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_INSECURE) };
    if usize::try_from(n).ok() != Some(len) {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let boot_id =
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mixed = format!("{boot_id}{nanos}{count}{}", std::process::id());
        // FNV-1a over the mix, spread across the requested length.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, byte) in bytes.iter_mut().enumerate() {
            for b in mixed.bytes().chain(i.to_le_bytes()) {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            *byte = hash.to_le_bytes()[i % 8];
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_time_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `RNDADDENTROPY` from `<linux/random.h>`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG` from `<linux/random.h>`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Credits `entropy` to the kernel's pool and forces the CRNG to reseed from it, so
/// two VMs restored from one snapshot stop producing the same random numbers.
pub fn add_entropy_and_reseed(entropy: &[u8]) -> io::Result<()> {
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    if !entropy.is_empty() {
        // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
        let len = i32::try_from(entropy.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut info: Vec<u8> = Vec::with_capacity(8 + entropy.len());
        info.extend_from_slice(&len.saturating_mul(8).to_ne_bytes());
        info.extend_from_slice(&len.to_ne_bytes());
        info.extend_from_slice(entropy);
        // SAFETY: `info` is a complete rand_pool_info with `buf_size` bytes of payload,
        // alive for the call; the kernel only reads it.
        if unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets `CLOCK_REALTIME` to `unix_ns` nanoseconds since the epoch.
pub fn set_wall_clock(unix_ns: u64) -> io::Result<()> {
    use nix::time::{clock_settime, ClockId};
    let time = nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(unix_ns));
    clock_settime(ClockId::CLOCK_REALTIME, time).map_err(io::Error::from)
}

/// Makes the allocator hand large buffers (a 1 MiB file read, a reply) back to the
/// kernel when they are freed. glibc raises its mmap threshold each time such a
/// buffer is freed, after which they come from its heaps and the memory a flood of
/// requests made stays with the agent after the client is gone; a fixed threshold
/// stops that. musl (the guest build) returns large allocations already.
pub fn return_large_allocations_to_the_kernel() {
    #[cfg(target_env = "gnu")]
    {
        /// Allocations from this size up are mapped, and unmapped when freed.
        const MMAP_THRESHOLD_BYTES: libc::c_int = 128 * 1024;
        // SAFETY: mallopt only changes allocator tuning; it is called once at start-up,
        // before the runtime starts any thread.
        let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    }
}
