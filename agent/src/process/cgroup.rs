//! Confinement in cgroups v2: every exec, spawn and pty runs in a cgroup of its own
//! under one workload parent whose limits leave the agent room to answer.
//!
//! # The tree
//! ```text
//! /sys/fs/cgroup            root: +memory +pids (+cpu) for its children
//! ├── agent                 the agent (PID 1) alone: memory.min, cpu.weight 1000
//! └── workload              memory.max = RAM − reserve, pids.max; +memory +pids
//!     ├── exec-1            one per tracked process, memory.oom.group = 1
//!     ├── spawn-2
//!     └── pty-3
//! ```
//! The agent leaves the root cgroup for a leaf of its own rather than staying in the
//! root: as a leaf it can carry `memory.min` (its pages are the last reclaimed when
//! the machine runs short) and a `cpu.weight` ten times the workload's, so a fork
//! bomb that saturates every vCPU still leaves the agent about 90 % of one when it
//! has work. In the root it would compete as one task against the workload group
//! (about 50 %) and could carry no protection at all.
//!
//! A child is born in its cgroup (`clone3` with `CLONE_INTO_CGROUP`, see
//! [`crate::sys::spawn`]), so the program and everything it forks, double-forks or
//! `setsid`s start inside. On a kernel older than 5.7 it joins its cgroup in a forked
//! process before `exec` instead (see [`crate::sys::PreExec::join_cgroup`]).
//!
//! # Cgroup I/O on the exec path
//! Measured in a TCG guest: a `mkdir` here costs about 0.55 ms with the
//! `memory.oom.group` write, an `rmdir` 0.4 ms, a read of `cgroup.events` 0.4 ms,
//! a move through `cgroup.procs` 1.5 ms (a fork of the agent costs more still).
//! A start makes its cgroup and clones the child into it, no move; a finished exec
//! reads `cgroup.events` (are there leftovers?) after its reply is out, and
//! `memory.events` (was it the OOM killer?) only when it died of `SIGKILL`; the
//! cgroups of forgotten processes are removed on a thread ([`super::remover`]).
//!
//! A finished exec's cgroup, once empty, goes to the next exec (up to
//! [`RECYCLED_MAX`] wait): a cgroup is a memory cgroup with its per-CPU statistics
//! and some forty kernfs files, about 26 KiB of kernel memory that no cgroup
//! limits, and making one costs more than its `mkdir` (about 1 ms of a 9-10 ms exec
//! of `true` over a kept connection, measured against execs all run in one cgroup).
//! Kept for their records' five minutes, as they were, 500 quick execs held 13 MiB
//! of a 512 MiB guest and every exec slowed as they piled up (9 ms, then 13 ms
//! after 2,000), and a client exec'ing in a loop could fill the guest with them.
//!
//! # Lifecycle of a process's cgroup
//! - A timed-out or cancelled exec has its whole cgroup killed (`cgroup.kill`, else
//!   `SIGKILL` to every member while the cgroup is frozen, until it is empty).
//! - A finished exec's leftovers (`sh -c 'server &'`) keep running in its cgroup
//!   until the exec's deadline, when the cgroup is killed (see
//!   [`super::exec`]); the exec's record is not forgotten while the cgroup has
//!   processes, so `ps` lists it (`ps_detail` counts them) and `kill PID` ends them
//!   all. A spawn or a terminal has no deadline: what it leaves stays, listed and
//!   killable the same way.
//! - A finished exec whose cgroup is empty and not frozen, and that did not die of
//!   `SIGKILL` (the OOM killer's kills stay counted in `memory.events`), gives its
//!   cgroup to a later exec right after its reply: its record keeps the path (the
//!   cgroup it ran in) but no longer acts on it. The knobs stay as the last exec
//!   left them: the agent sets only `memory.oom.group`, and a workload that writes
//!   its own cgroup's limits (it is root) has them apply to the execs after it.
//! - Once the record is forgotten (its cgroup empty, the forget delay passed) the
//!   cgroup directory is removed, unless it was given on: no directory outlives
//!   its last record.
//! - The OOM killer is reported per cgroup (`oom_kill` in `memory.events`), and
//!   `memory.oom.group` makes it end the whole process tree at once, as a container
//!   runtime does, instead of leaving a shell whose child vanished.
//!
//! # A workload that breaks the tree
//! The workload is root: it can `umount -l /sys/fs/cgroup` (or `/proc`), mount a
//! tmpfs over it, or remount it read-only, and every start would then fail to make
//! its cgroup. Before each start the agent checks that the mount is still the tree it
//! set up (the same cgroup2 root, writable, `/proc` a procfs, the workload parent in
//! place) and, when not, puts it back ([`CgroupTree::repair`]: it mounts `/proc` and
//! cgroup2 again, over whatever covers them, or remounts read-write, then redoes the
//! idempotent set-up; cgroup2 has one hierarchy, so the remount shows the same
//! cgroups with their processes). A start whose cgroup still cannot be made runs in
//! its own process group instead, and `confinement` says so (mode process groups,
//! with the reason) until a later start finds the tree whole again: exec is never
//! lost. Running unconfined gives the workload nothing it lacks: as root it can
//! leave its cgroup anyway.
//!
//! # When not
//! Only the machine's real init confines: the agent is PID 1 of the initial pid
//! namespace. As an ordinary process (a Unix socket in development) or as PID 1 of a
//! namespace (tests), the cgroup tree is someone else's; the agent then keeps to
//! process groups ([`Confinement::ProcessGroups`]) and says so in `confinement`
//! and the handshake's capabilities. So does any failure while setting the tree up.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use sandbox_protocol::{ConfinementMode, OomKill, Pid, ProcessKind};

use super::remover::{self, CgroupRemover};
use crate::sys;
use crate::sys::spawn::{ChildImage, ChildStack, CloneError};

/// Where cgroup2 is mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The agent's own leaf, under the mount.
pub const AGENT_CGROUP: &str = "agent";

/// The parent of every process's cgroup, under the mount.
pub const WORKLOAD_CGROUP: &str = "workload";

/// Kept out of the workload's `memory.max` whatever the RAM: the agent (a few MiB),
/// the kernel's own unaccounted allocations and the initramfs root, which lives in
/// RAM and is charged to the root cgroup. Measured on the default template, the
/// guest uses about 35 MiB before any workload runs.
pub const WORKLOAD_RESERVE_BYTES: u64 = 64 << 20;

/// Plus 1/32 of the RAM (about 3 %): what the kernel spends per page of RAM (page
/// structs, page tables) grows with it.
pub const WORKLOAD_RESERVE_RAM_DIVISOR: u64 = 32;

/// The workload's `pids.max` where the kernel allows that many tasks: enough for
/// `make -j` and test runners, small enough that a fork bomb stops there and its
/// tasks' kernel memory (about 20 KiB each) stays within the memory limit.
pub const WORKLOAD_PIDS_MAX: u64 = 4096;

/// Most cgroups of finished execs kept for later execs: one start at a time takes
/// one, so a few cover execs sent back to back on several connections.
pub const RECYCLED_MAX: usize = 8;

/// Tasks left to the agent and the kernel below `kernel.threads-max`, which on a
/// 512 MiB guest is only about 3,900: the workload may use the rest.
pub const PIDS_RESERVE: u64 = 256;

/// The agent's `memory.min`: its working set (tens of MiB at most with full output
/// rings) is never reclaimed to make room for the workload.
pub const AGENT_MEMORY_MIN_BYTES: u64 = 32 << 20;

/// The agent's `cpu.weight`; the workload keeps the default 100.
pub const AGENT_CPU_WEIGHT: u32 = 1000;

/// Rounds of "signal every member" when the kernel has no `cgroup.kill` (< 5.14).
const KILL_ROUNDS: usize = 100;

/// Why the cgroup tree could not be set up (the agent then uses process groups).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The agent is not the machine's init.
    #[error("The agent is not the init of the machine")]
    NotInit,
    /// cgroup2 is not mounted and cannot be.
    #[error("Cannot mount cgroup2 on {}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The agent is in a cgroup it did not make (someone else owns the tree).
    #[error("The agent runs in cgroup {cgroup}, not the root")]
    NotRoot {
        /// Its cgroup.
        cgroup: String,
    },
    /// A controller the workload limits need is not available.
    #[error("The {controller} controller is not available")]
    Controller {
        /// Its name.
        controller: &'static str,
    },
    /// A cgroup file or directory could not be read, written or made.
    #[error("Cannot {action} {}", path.display())]
    Io {
        /// What was tried: "read", "write", "create", "remove".
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_owned();
    move |error| CgroupError::Io {
        action,
        path,
        error,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(io_error("write", path))
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(io_error("read", path))
}

/// The workload parent's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadLimits {
    /// Its `memory.max`.
    pub memory_max_bytes: u64,
    /// Its `pids.max`.
    pub pids_max: u64,
}

/// The limits for a machine with `mem_total_bytes` of RAM and the kernel's
/// `threads-max`: RAM minus [`WORKLOAD_RESERVE_BYTES`] and 1/32 of the RAM (but at
/// least half the RAM on a tiny machine), and [`WORKLOAD_PIDS_MAX`] tasks, or fewer
/// when the kernel allows fewer than that plus [`PIDS_RESERVE`].
pub fn workload_limits(mem_total_bytes: u64, threads_max: Option<u64>) -> WorkloadLimits {
    let reserve = WORKLOAD_RESERVE_BYTES + mem_total_bytes / WORKLOAD_RESERVE_RAM_DIVISOR;
    let memory = mem_total_bytes
        .saturating_sub(reserve)
        .max(mem_total_bytes / 2);
    // Whole pages: the kernel rounds down anyway, and the figure then reads back as set.
    let memory_max_bytes = memory & !0xFFF;
    let pids_max = match threads_max {
        Some(threads) => WORKLOAD_PIDS_MAX.min(threads.saturating_sub(PIDS_RESERVE).max(64)),
        None => WORKLOAD_PIDS_MAX,
    };
    WorkloadLimits {
        memory_max_bytes,
        pids_max,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The value of `key` in a flat-keyed cgroup file (`memory.events`, `cgroup.events`).
pub fn parse_flat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// A `memory.max`: a byte count, or `None` for `max` (no limit) or garbage.
pub fn parse_memory_max(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The unified-hierarchy cgroup in a `/proc/PID/cgroup` (the `0::` line).
pub fn parse_own_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

/// The name of the `seq`-th process cgroup: its kind and a number never reused in
/// this boot (pids are, and a cgroup cannot be renamed once the pid is known).
pub fn cgroup_name(kind: ProcessKind, seq: u64) -> String {
    format!("{}-{seq}", kind.as_str())
}

/// How the agent confines the processes it starts.
#[derive(Debug)]
pub enum Confinement {
    /// Process groups only (see the module docs for when).
    ProcessGroups {
        /// Why not cgroups.
        reason: String,
    },
    /// A cgroup per process under the workload parent.
    Cgroups(CgroupTree),
}

/// Where `/proc` is mounted: the tree's set-up and repair read it.
const PROC_MOUNT: &str = "/proc";

impl Confinement {
    /// Process groups, for `reason`.
    pub fn process_groups(reason: impl Into<String>) -> Self {
        Self::ProcessGroups {
            reason: reason.into(),
        }
    }

    /// Sets the tree up under [`CGROUP_MOUNT`] when the agent is the machine's init;
    /// otherwise, or when that fails, process groups.
    pub fn set_up(is_init: bool) -> Self {
        let tree = if is_init && crate::init::is_machine_init() {
            CgroupTree::set_up(Path::new(CGROUP_MOUNT))
        } else {
            Err(CgroupError::NotInit)
        };
        match tree {
            Ok(tree) => {
                tracing::info!(
                    memory_max = tree.limits.memory_max_bytes,
                    pids_max = tree.limits.pids_max,
                    "workloads confined in cgroups"
                );
                Self::Cgroups(tree)
            }
            Err(error) => {
                let reason = crate::init::ErrorChain(&error).to_string();
                if is_init {
                    tracing::warn!(%reason, "workloads confined by process group only");
                } else {
                    tracing::debug!(%reason, "workloads confined by process group only");
                }
                Self::process_groups(reason)
            }
        }
    }

    /// The mode in force: process groups also while a broken tree could not be
    /// repaired (see the module docs).
    pub fn mode(&self) -> ConfinementMode {
        match self {
            Self::Cgroups(tree) if tree.lost().is_none() => ConfinementMode::Cgroups,
            Self::Cgroups(_) | Self::ProcessGroups { .. } => ConfinementMode::ProcessGroups,
        }
    }

    /// A fresh cgroup for a process of `kind`, or `None` in process-group mode, and
    /// when the tree is broken past repair (the process then runs in its own process
    /// group; see the module docs).
    pub fn create(&self, kind: ProcessKind) -> io::Result<Option<NewCgroup>> {
        match self {
            Self::ProcessGroups { .. } => Ok(None),
            Self::Cgroups(tree) => Ok(tree.create_or_repair(kind)),
        }
    }

    /// Gives the cgroup of a finished exec, empty, to a later exec (see the module
    /// docs).
    pub fn recycle(&self, cgroup: &ProcessCgroup) {
        match self {
            Self::Cgroups(tree) => tree.recycle(cgroup),
            Self::ProcessGroups { .. } => self.discard(cgroup),
        }
    }

    /// Removes the cgroup of a forgotten process, off the caller's thread when the
    /// remover has one.
    pub fn discard(&self, cgroup: &ProcessCgroup) {
        match self {
            Self::Cgroups(tree) => tree.remover.remove_later(cgroup.path.clone()),
            // Only tests give records cgroups without a tree.
            Self::ProcessGroups { .. } => {
                if let Err(error) = cgroup.remove() {
                    tracing::warn!(cgroup = cgroup.relative(), %error, "cannot remove a cgroup");
                }
            }
        }
    }

    /// What `confinement` answers.
    pub fn report(&self) -> sandbox_protocol::Confinement {
        match self {
            Self::ProcessGroups { reason } => sandbox_protocol::Confinement {
                mode: ConfinementMode::ProcessGroups,
                agent_cgroup: None,
                workload_cgroup: None,
                memory_max_bytes: None,
                pids_max: None,
                reason: Some(reason.clone()),
            },
            Self::Cgroups(tree) if tree.lost().is_some() => sandbox_protocol::Confinement {
                mode: ConfinementMode::ProcessGroups,
                agent_cgroup: Some(format!("/{AGENT_CGROUP}")),
                workload_cgroup: Some(format!("/{WORKLOAD_CGROUP}")),
                memory_max_bytes: Some(tree.limits.memory_max_bytes),
                pids_max: Some(tree.limits.pids_max),
                reason: tree.lost(),
            },
            Self::Cgroups(tree) => sandbox_protocol::Confinement {
                mode: ConfinementMode::Cgroups,
                agent_cgroup: Some(format!("/{AGENT_CGROUP}")),
                workload_cgroup: Some(format!("/{WORKLOAD_CGROUP}")),
                memory_max_bytes: Some(tree.limits.memory_max_bytes),
                pids_max: Some(tree.limits.pids_max),
                reason: None,
            },
        }
    }
}

/// The agent's cgroup tree.
#[derive(Debug)]
pub struct CgroupTree {
    mount: PathBuf,
    workload: PathBuf,
    limits: WorkloadLimits,
    /// The kernel has `cgroup.kill` (5.14 and later).
    has_kill: bool,
    next: AtomicU64,
    remover: CgroupRemover,
    /// Children are cloned into their cgroup (until the kernel says it cannot).
    clones: AtomicBool,
    /// The stack children are cloned on, mapped at the first start.
    stack: Mutex<Option<ChildStack>>,
    /// Device and inode of the cgroup2 root at `mount` when it was set up: a mount
    /// showing anything else (a tmpfs over it, a sub-cgroup bound onto it, the
    /// bare directory under a lazily unmounted one) is not the tree.
    root: (u64, u64),
    /// Why the last start could not have its cgroup, while the tree is broken past
    /// repair; `None` when it is whole.
    lost: Mutex<Option<String>>,
    /// Cgroups of finished execs, empty, for the next execs (see the module docs).
    recycled: Mutex<Vec<NewCgroup>>,
}

impl CgroupTree {
    /// Mounts cgroup2 on `mount` when needed, moves the agent into its leaf, makes
    /// the workload parent and sets its limits. Idempotent: an agent started again
    /// on the same tree (after a switch into a root disk) finds it in place.
    pub fn set_up(mount: &Path) -> Result<Self, CgroupError> {
        if !sys::is_cgroup2(mount).unwrap_or(false) {
            mount_cgroup2(mount)?;
        }
        let root = identity(mount).map_err(io_error("read", mount))?;
        let (limits, has_kill) = build(mount)?;
        Ok(Self {
            mount: mount.to_owned(),
            workload: mount.join(WORKLOAD_CGROUP),
            next: AtomicU64::new(1),
            remover: CgroupRemover::start(),
            limits,
            has_kill,
            clones: AtomicBool::new(true),
            stack: Mutex::new(None),
            root,
            lost: Mutex::new(None),
            recycled: Mutex::new(Vec::new()),
        })
    }

    /// Why starts run unconfined now, if they do.
    pub fn lost(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the tree is as it was set up: `/proc` a procfs, the same cgroup2 root
    /// at the mount, writable, the workload parent in it. Three `stat`s, against the
    /// ~0.55 ms of the `mkdir` that follows.
    pub fn intact(&self) -> bool {
        sys::is_procfs(Path::new(PROC_MOUNT)).unwrap_or(false)
            && identity(&self.mount).is_ok_and(|found| found == self.root)
            && !sys::is_read_only(&self.mount).unwrap_or(true)
            && self.workload.join("cgroup.procs").exists()
    }

    /// Puts back what a workload broke: `/proc` mounted again if it is gone or
    /// covered, cgroup2 mounted again over whatever is at the mount (or remounted
    /// read-write), then the idempotent set-up redone (controllers, the agent's
    /// leaf, the workload parent and its limits, which a workload may have removed
    /// or loosened).
    pub fn repair(&self) -> Result<(), CgroupError> {
        let proc = Path::new(PROC_MOUNT);
        if !sys::is_procfs(proc).unwrap_or(false) {
            let _ = fs::create_dir_all(proc);
            sys::mount_proc(proc).map_err(|error| CgroupError::Mount {
                path: proc.to_owned(),
                error,
            })?;
            tracing::warn!(path = PROC_MOUNT, "/proc was gone: mounted it again");
        }
        if identity(&self.mount).ok() != Some(self.root) {
            // The bare mount point may be gone with what held it (`umount -l /sys`).
            let _ = fs::create_dir_all(&self.mount);
            mount_cgroup2(&self.mount)?;
            tracing::warn!(path = %self.mount.display(), "the cgroup tree was gone: mounted it again");
        }
        if sys::is_read_only(&self.mount).unwrap_or(false) {
            sys::remount_read_write(&self.mount).map_err(|error| CgroupError::Mount {
                path: self.mount.clone(),
                error,
            })?;
            tracing::warn!(path = %self.mount.display(), "the cgroup tree was read-only: remounted it read-write");
        }
        if identity(&self.mount).ok() != Some(self.root) {
            return Err(CgroupError::Io {
                action: "find the cgroup root at",
                path: self.mount.clone(),
                error: io::Error::other("another filesystem is still there"),
            });
        }
        build(&self.mount).map(|_| ())
    }

    /// A cgroup for a start: repaired first when the tree is broken, tried again
    /// after a repair when making it fails anyway; `None` (the start runs in its own
    /// process group, and [`CgroupTree::lost`] says why) when it still cannot be
    /// made.
    fn create_or_repair(&self, kind: ProcessKind) -> Option<NewCgroup> {
        let mut repaired = None;
        if !self.intact() {
            repaired = Some(self.repair());
        }
        // A recycled cgroup only in a whole tree: its directory is open, so a child
        // could be cloned into it under any cover, but what acts on it later (kill,
        // leftovers) goes through the mount.
        if kind == ProcessKind::Exec && !matches!(repaired, Some(Err(_))) {
            if let Some(cgroup) = self.recycled().pop() {
                *self.lost.lock().unwrap_or_else(PoisonError::into_inner) = None;
                return Some(cgroup);
            }
        }
        let made = self.create_fresh(kind).or_else(|first| {
            if repaired.is_some() {
                return Err(first);
            }
            // Broken in a way the check does not see, or between it and the mkdir.
            repaired = Some(self.repair());
            self.create_fresh(kind)
        });
        let lost = match made {
            Ok(cgroup) => {
                if let Some(Ok(())) = repaired {
                    tracing::info!("the cgroup tree is whole again");
                }
                *self.lost.lock().unwrap_or_else(PoisonError::into_inner) = None;
                return Some(cgroup);
            }
            Err(error) => {
                let error = CgroupError::Io {
                    action: "create a cgroup in",
                    path: self.workload.clone(),
                    error,
                };
                match repaired {
                    Some(Err(repair)) => format!(
                        "the cgroup tree was broken and cannot be repaired ({}): {}",
                        crate::init::ErrorChain(&repair),
                        crate::init::ErrorChain(&error)
                    ),
                    _ => format!(
                        "the cgroup tree was broken: {}",
                        crate::init::ErrorChain(&error)
                    ),
                }
            }
        };
        let reason = format!("{lost}; new processes run in process groups until it is whole");
        tracing::warn!(%reason, "a start runs without its cgroup");
        *self.lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
        None
    }
}

/// Mounts cgroup2 on `mount`.
fn mount_cgroup2(mount: &Path) -> Result<(), CgroupError> {
    sys::mount_cgroup2(mount).map_err(|error| CgroupError::Mount {
        path: mount.to_owned(),
        error,
    })
}

/// Device and inode of `path`.
fn identity(path: &Path) -> io::Result<(u64, u64)> {
    fs::metadata(path).map(|meta| (meta.dev(), meta.ino()))
}

/// The tree under cgroup2 at `mount`, made or found in place: the agent in its leaf,
/// the workload parent with its limits. Idempotent. Returns the limits and whether
/// the kernel has `cgroup.kill`.
fn build(mount: &Path) -> Result<(WorkloadLimits, bool), CgroupError> {
    let own = read(Path::new("/proc/self/cgroup"))?;
    let own = parse_own_cgroup(&own).unwrap_or("?").trim().to_owned();
    if own != "/" && own != format!("/{AGENT_CGROUP}") {
        return Err(CgroupError::NotRoot { cgroup: own });
    }
    let available = read(&mount.join("cgroup.controllers"))?;
    let has = |name: &str| available.split_whitespace().any(|c| c == name);
    for controller in ["memory", "pids"] {
        if !has(controller) {
            return Err(CgroupError::Controller { controller });
        }
    }
    let cpu = has("cpu");
    let root_control = mount.join("cgroup.subtree_control");
    write(&root_control, "+memory +pids")?;
    if cpu {
        // Optional: without it the agent is only one task among the workload's.
        if let Err(error) = write(&root_control, "+cpu") {
            tracing::warn!(error = %crate::init::ErrorChain(&error), "no cpu controller");
        }
    }

    let agent = mount.join(AGENT_CGROUP);
    make_dir(&agent)?;
    write(&agent.join("cgroup.procs"), &std::process::id().to_string())?;
    write(
        &agent.join("memory.min"),
        &AGENT_MEMORY_MIN_BYTES.to_string(),
    )?;
    if cpu {
        let _ = write(&agent.join("cpu.weight"), &AGENT_CPU_WEIGHT.to_string());
    }

    let meminfo = read(Path::new("/proc/meminfo"))?;
    let mem_total = parse_mem_total(&meminfo).unwrap_or(0);
    let threads_max = fs::read_to_string("/proc/sys/kernel/threads-max")
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let limits = workload_limits(mem_total, threads_max);
    let workload = mount.join(WORKLOAD_CGROUP);
    make_dir(&workload)?;
    write(
        &workload.join("memory.max"),
        &limits.memory_max_bytes.to_string(),
    )?;
    // No swap in the guest, but never let the limit be dodged by one.
    let _ = fs::write(workload.join("memory.swap.max"), "0");
    write(&workload.join("pids.max"), &limits.pids_max.to_string())?;
    write(&workload.join("cgroup.subtree_control"), "+memory +pids")?;
    let has_kill = workload.join("cgroup.kill").exists();
    Ok((limits, has_kill))
}

impl CgroupTree {
    /// The workload parent's limits.
    pub fn limits(&self) -> WorkloadLimits {
        self.limits
    }

    /// A new cgroup of `kind` (never a recycled one).
    pub fn create_fresh(&self, kind: ProcessKind) -> io::Result<NewCgroup> {
        loop {
            let name = cgroup_name(kind, self.next.fetch_add(1, Ordering::Relaxed));
            let path = self.workload.join(&name);
            match fs::create_dir(&path) {
                // Left by an agent that ran before on this tree: take the next number.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(error),
                Ok(()) => {}
            }
            let cgroup = ProcessCgroup {
                relative: format!("/{WORKLOAD_CGROUP}/{name}"),
                path,
                mount: self.mount.clone(),
                has_kill: self.has_kill,
            };
            if let Err(error) = fs::write(cgroup.path.join("memory.oom.group"), "1") {
                tracing::warn!(cgroup = %cgroup.relative, %error, "cannot set memory.oom.group");
            }
            let dir = match fs::File::open(&cgroup.path) {
                Ok(dir) => OwnedFd::from(dir),
                Err(error) => {
                    let _ = cgroup.remove();
                    return Err(error);
                }
            };
            return Ok(NewCgroup {
                cgroup,
                dir,
                recycled: false,
            });
        }
    }

    /// Removes a cgroup no process got (off the caller's thread).
    pub fn discard(&self, cgroup: &ProcessCgroup) {
        self.remover.remove_later(cgroup.path.clone());
    }

    fn recycled(&self) -> MutexGuard<'_, Vec<NewCgroup>> {
        self.recycled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the cgroup of a finished exec, empty, for a later exec (removed instead
    /// when [`RECYCLED_MAX`] wait already, or when it cannot be opened).
    fn recycle(&self, cgroup: &ProcessCgroup) {
        let mut recycled = self.recycled();
        if recycled.len() < RECYCLED_MAX {
            if let Ok(dir) = fs::File::open(&cgroup.path) {
                recycled.push(NewCgroup {
                    cgroup: cgroup.clone(),
                    dir: OwnedFd::from(dir),
                    recycled: true,
                });
                return;
            }
        }
        drop(recycled);
        self.remover.remove_later(cgroup.path.clone());
    }

    /// Starts `image` in `cgroup` with `clone3` (see [`crate::sys::spawn`]); the caller
    /// holds the spawn gate. [`CloneError::Unsupported`] (then and for every later
    /// start) when the kernel cannot, and the caller forks instead.
    pub fn clone_into(&self, image: &ChildImage, cgroup: &NewCgroup) -> Result<i32, CloneError> {
        if !self.clones.load(Ordering::Relaxed) {
            return Err(CloneError::Unsupported);
        }
        // The gate serialises starts, so this lock is never contended.
        let mut stack = self.stack.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = match &mut *stack {
            Some(stack) => stack,
            empty => empty.insert(ChildStack::new().map_err(CloneError::Clone)?),
        };
        let cloned = sys::spawn::clone_into_cgroup(stack, image, cgroup.dir.as_fd());
        if matches!(cloned, Err(CloneError::Unsupported)) {
            tracing::info!("this kernel cannot clone into a cgroup; children fork and join theirs");
            self.clones.store(false, Ordering::Relaxed);
        }
        cloned
    }
}

/// A cgroup made for a process about to start.
#[derive(Debug)]
pub struct NewCgroup {
    /// What the process's record keeps.
    pub cgroup: ProcessCgroup,
    /// Its directory, open for `CLONE_INTO_CGROUP`; closed once the child started.
    pub dir: OwnedFd,
    /// A finished exec's, reused: a start that cannot clone into it (removed, or
    /// given sub-cgroups with controllers by the workload) takes a fresh one.
    pub recycled: bool,
}

fn make_dir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
            Err(io_error("create", path)(error))
        }
        _ => Ok(()),
    }
}

/// The cgroup of one tracked process.
#[derive(Debug, Clone)]
pub struct ProcessCgroup {
    path: PathBuf,
    relative: String,
    mount: PathBuf,
    has_kill: bool,
}

impl ProcessCgroup {
    /// A cgroup at `path` (for tests of its users: a plain directory stands in).
    #[cfg(test)]
    pub(crate) fn at(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            relative: path.display().to_string(),
            mount: PathBuf::from("/"),
            has_kill: false,
        }
    }

    /// Its path relative to the mount (`/workload/exec-3`), as `/proc/PID/cgroup` shows it.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// Opens its `cgroup.procs` for a child to join it before `exec`.
    pub fn open_procs(&self) -> io::Result<fs::File> {
        fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.procs"))
    }

    /// Every process in it and in any cgroup the workload made below it.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.path.clone()];
        while let Some(dir) = dirs.pop() {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            dirs.extend(sub_cgroups(&dir));
        }
        pids
    }

    /// Whether another exec may run in it now: nothing left in it and not frozen
    /// (one read of `cgroup.events`, which the check for leftovers makes anyway).
    pub fn reusable(&self) -> bool {
        let Ok(events) = fs::read_to_string(self.path.join("cgroup.events")) else {
            return false;
        };
        parse_flat_key(&events, "populated") == Some(0)
            && parse_flat_key(&events, "frozen").unwrap_or(0) == 0
    }

    /// Whether any process is left in it (or below it).
    pub fn populated(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.events"))
            .ok()
            .and_then(|text| parse_flat_key(&text, "populated"))
            .map_or_else(|| !self.pids().is_empty(), |populated| populated != 0)
    }

    /// Kills everything in it, `setsid`'d and double-forked processes included.
    pub fn kill(&self) -> io::Result<()> {
        if self.has_kill {
            return fs::write(self.path.join("cgroup.kill"), "1");
        }
        // Frozen, nothing in it can fork while its members are signalled one by one.
        let freeze = self.path.join("cgroup.freeze");
        let frozen = fs::write(&freeze, "1").is_ok();
        for _ in 0..KILL_ROUNDS {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = sys::kill_process(pid, libc::SIGKILL);
            }
            if !frozen {
                std::thread::yield_now();
            }
        }
        if frozen {
            // A killed task dies only once thawed.
            let _ = fs::write(&freeze, "0");
        }
        Ok(())
    }

    /// Sends `signal` to every process in it; `SIGKILL` kills the cgroup.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        if signal == libc::SIGKILL {
            return self.kill();
        }
        let mut last = Ok(());
        for pid in self.pids() {
            match sys::kill_process(pid, signal) {
                Err(error) if error.raw_os_error() != Some(libc::ESRCH) => last = Err(error),
                _ => {}
            }
        }
        last
    }

    /// The OOM killer's kills in it, with the memory limit it ran under, once any.
    pub fn oom_kill(&self, pid: Pid) -> Option<OomKill> {
        let events = fs::read_to_string(self.path.join("memory.events")).ok()?;
        let kills = parse_flat_key(&events, "oom_kill").filter(|&k| k > 0)?;
        Some(OomKill {
            pid,
            kills,
            memory_max_bytes: self.memory_limit(),
        })
    }

    /// The lowest `memory.max` from this cgroup up to the mount.
    pub fn memory_limit(&self) -> Option<u64> {
        self.path
            .ancestors()
            .take_while(|dir| *dir != self.mount)
            .filter_map(|dir| fs::read_to_string(dir.join("memory.max")).ok())
            .filter_map(|text| parse_memory_max(&text))
            .min()
    }

    /// Removes it (and cgroups the workload made below it); fails while populated.
    pub fn remove(&self) -> io::Result<()> {
        remover::remove_tree(&self.path)
    }
}

pub(super) fn sub_cgroups(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn limits_leave_the_reserve_and_scale_with_ram() {
        // The small size: ~480 MiB visible → 64 + 15 MiB kept back.
        let small = workload_limits(480 * MIB, Some(3_900));
        assert_eq!(small.memory_max_bytes, 401 * MIB);
        assert_eq!(small.pids_max, 3_900 - PIDS_RESERVE);
        let big = workload_limits(16 * 1024 * MIB, Some(100_000));
        assert_eq!(big.memory_max_bytes, (16 * 1024 - 64 - 512) * MIB);
        assert_eq!(big.pids_max, WORKLOAD_PIDS_MAX);
    }

    #[test]
    fn a_tiny_machine_still_gives_the_workload_half() {
        let tiny = workload_limits(100 * MIB, None);
        assert_eq!(tiny.memory_max_bytes, 50 * MIB);
        assert_eq!(tiny.pids_max, WORKLOAD_PIDS_MAX);
        assert_eq!(workload_limits(0, Some(10)).pids_max, 64);
        assert_eq!(workload_limits(4097, None).memory_max_bytes % 4096, 0);
    }

    #[test]
    fn memory_events_and_cgroup_events_parse() {
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(parse_flat_key(events, "oom_kill"), Some(2));
        assert_eq!(parse_flat_key(events, "oom"), Some(1));
        assert_eq!(parse_flat_key(events, "missing"), None);
        assert_eq!(
            parse_flat_key("populated 1\nfrozen 0\n", "populated"),
            Some(1)
        );
        assert_eq!(parse_flat_key("oom_kill x\n", "oom_kill"), None);
    }

    #[test]
    fn memory_max_and_meminfo_parse() {
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(parse_memory_max("33554432\n"), Some(32 * MIB));
        let meminfo = "MemTotal:         491520 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(480 * MIB));
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn own_cgroup_is_the_unified_line() {
        assert_eq!(parse_own_cgroup("0::/agent\n"), Some("/agent"));
        assert_eq!(parse_own_cgroup("4:memory:/x\n0::/\n"), Some("/"));
        assert_eq!(parse_own_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn cgroup_names_carry_the_kind_and_a_sequence() {
        assert_eq!(cgroup_name(ProcessKind::Exec, 1), "exec-1");
        assert_eq!(cgroup_name(ProcessKind::Spawn, 22), "spawn-22");
        assert_eq!(cgroup_name(ProcessKind::Pty, 3), "pty-3");
    }

    #[test]
    fn an_ordinary_process_confines_by_process_group() {
        let confinement = Confinement::set_up(false);
        assert_eq!(confinement.mode(), ConfinementMode::ProcessGroups);
        assert!(confinement.create(ProcessKind::Exec).unwrap().is_none());
        let report = confinement.report();
        assert!(report.reason.is_some_and(|r| r.contains("not the init")));
    }
}
