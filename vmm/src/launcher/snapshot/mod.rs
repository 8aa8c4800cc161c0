//! Snapshots of running microVMs: checkpoint, branch, fork.
//!
//! Only serial-transport VMs (the default) can be snapshotted: vhost-user-vsock
//! blocks QEMU's migration. Their guest RAM is a file on a tmpfs (`share=on`), so a
//! checkpoint keeps RAM out of QEMU's migration stream (`x-ignore-shared`):
//!
//! 1. **Checkpoint** ([`capture`]): `stop`; a disk, if any, moves to a fresh overlay
//!    (`blockdev-snapshot-sync`), so the old one is frozen and becomes the
//!    checkpoint's disk; the device state (~60 KB) is migrated to a file; the RAM file
//!    is copied sparsely; `cont`. The pause is that window, and it grows with the RAM
//!    in use, so a guest using 128 MiB or more is captured *live* instead (`live`:
//!    QEMU's background snapshot stops it only for the device state and the write
//!    protection of its RAM). Then the source's clock is corrected, and the
//!    checkpoint folder, written under a temporary name, is renamed into place: a
//!    failed checkpoint leaves nothing, and the VM's disk backs onto what it did
//!    before. One capture of a VM runs at a time (a `flock` in its run folder). A
//!    capture's future must be run to its end: the engine runs each in a task of its
//!    own, so a dropped request does not cut one short. An *incremental* checkpoint
//!    ([`diff`]) keeps only the RAM pages that differ from the VM's newest kept one,
//!    and is made whole at its first restore.
//! 2. **Branch** ([`restore`]): each child is the same machine (same device
//!    arguments, kept in `machine.json`) started with `-incoming defer`, its RAM the
//!    checkpoint's RAM file mapped copy-on-write (`share=off`: children share the page
//!    cache and hold only the pages they write), its disk a new overlay on the
//!    checkpoint's disk. Once its agent attaches to the new relay, it gets `resumed`
//!    (host time, fresh entropy, a new machine id) and `reidentify` (its own token and
//!    hostname). All or nothing: if one child fails, every child goes.
//! 3. **Fork** = checkpoint + branch; its checkpoint is *ephemeral*: removed by the
//!    launcher once no VM maps it.
//! 4. **Start from a snapshot** ([`ready`]): a template's ready snapshot, taken after
//!    its first boot, or a promoted template's; `Launcher::boot` restores these.
//! 5. **Hibernate** ([`hibernate`]) = a capture into the VM's run folder that leaves
//!    the VM stopped, then QEMU ends; **wake** restores the same id in place.
//!
//! A child's RAM is private, so checkpointing a child puts its RAM into the stream
//! instead (slower, but a fork of a fork works); a branch from such a checkpoint
//! loads RAM from the stream into a fresh shared RAM file.
//!
//! Checkpoints live in `SANDBOX_HOME/checkpoints/<id>/` and outlive the process that
//! made them and host reboots (the RAM image is an ordinary file there): see
//! [`manifest`]. Deleting one that a VM maps or backs onto (running or hibernated,
//! through its record, its QEMU's mappings or its disks' chains: [`users`]), or that
//! a later checkpoint's disk is based on, is refused ([`SnapshotError::InUse`]).

pub mod capture;
pub mod diff;
pub mod hibernate;
mod live;
pub mod manifest;
pub mod ready;
pub mod received;
pub mod restore;
pub mod users;

use std::path::PathBuf;

pub use capture::{CaptureMethod, Checkpoint, CheckpointSpec};
pub use diff::flatten;
pub use hibernate::{Hibernation, NotHibernated, Wake};
pub use manifest::{CheckpointInfo, Manifest, RamImage};
pub use ready::Promotion;
pub use received::Received;
pub use restore::{BranchSpec, Fork};

use super::qmp::QmpError;
use super::LaunchError;

/// The folder under `SANDBOX_HOME` that holds checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";

/// Most children one branch or fork may start.
pub const MAX_BRANCH: usize = 64;

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No VM with that id.
    #[error("No VM with id {id}")]
    NoVm {
        /// The id asked for.
        id: String,
    },
    /// The VM cannot be snapshotted (a vsock VM, or one started before snapshots).
    #[error("VM {id} cannot be checkpointed: {why}")]
    NotCapable {
        /// The VM.
        id: String,
        /// Why.
        why: String,
    },
    /// The VM is not running (stopped, paused, or its QEMU does not answer).
    #[error("VM {id} is not running ({state})")]
    NotRunning {
        /// The VM.
        id: String,
        /// What was found.
        state: String,
    },
    /// Another checkpoint or hibernation of the VM is under way (one QEMU runs one
    /// migration at a time, and a second would cancel the first's).
    #[error("VM {id} is being captured already; try again once that ends")]
    Busy {
        /// The VM.
        id: String,
    },
    /// QEMU refused or failed a step.
    #[error("QEMU failed to {step}")]
    Qemu {
        /// What was being done.
        step: &'static str,
        /// The cause.
        #[source]
        error: QmpError,
    },
    /// Writing the checkpoint failed (a full disk, say); nothing was left behind.
    #[error("Cannot write the checkpoint to {}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// A hibernated VM could not be restored; its image is kept.
    #[error("Cannot wake VM {id}; its image is kept")]
    Wake {
        /// The VM.
        id: String,
        /// The cause.
        #[source]
        error: Box<LaunchError>,
    },
    /// Wake of a VM that is not hibernated.
    #[error("VM {id} is not hibernated")]
    NotHibernated {
        /// The VM.
        id: String,
    },
    /// The run folder could not be updated.
    #[error(transparent)]
    RunDir(#[from] crate::launcher::run_dir::RunDirError),
    /// No checkpoint with that id or name.
    #[error("No checkpoint {0:?}")]
    NoCheckpoint(String),
    /// A checkpoint's files are missing or do not match what its manifest says.
    #[error("Checkpoint {id} is damaged: {why}")]
    Damaged {
        /// The checkpoint.
        id: String,
        /// What is wrong.
        why: String,
    },
    /// Another checkpoint has that name.
    #[error("A checkpoint named {0:?} exists already")]
    NameTaken(String),
    /// No template of that name.
    #[error("No template named {0:?}")]
    NoTemplate(String),
    /// The template was built, not promoted: delete does not remove it.
    #[error("{0:?} is a built template, not one made by promote; remove its folder to delete it")]
    NotPromoted(String),
    /// A name that is not 1-64 letters, digits, `-`, `_` or `.` (not starting with `.`).
    #[error("Invalid checkpoint name {0:?}: use 1-64 letters, digits, '-', '_' or '.'")]
    BadName(String),
    /// The checkpoint is still needed.
    #[error("Checkpoint {id} is in use by {users}: stop those first")]
    InUse {
        /// The checkpoint.
        id: String,
        /// Which VMs or checkpoints use it.
        users: String,
    },
    /// A branch asked for no children or too many.
    #[error("Cannot start {0} children: between 1 and {MAX_BRANCH}")]
    Count(usize),
    /// A child could not be started; none was kept.
    #[error("Child {index} of {count} failed; no child was kept")]
    Child {
        /// Which child (from 1).
        index: usize,
        /// How many were asked for.
        count: usize,
        /// The cause.
        #[source]
        error: Box<LaunchError>,
    },
    /// A child started but its agent refused `resumed` or `reidentify`.
    #[error("Child {id} did not take its new identity")]
    Identity {
        /// The child VM.
        id: String,
        /// The cause.
        #[source]
        error: crate::client::ClientError,
    },
    /// A child's agent did not take its new identity in time.
    #[error("Child {id} did not take its new identity within {after:?}")]
    IdentityTimeout {
        /// The child VM.
        id: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// The launcher itself failed (listing run folders, say).
    #[error(transparent)]
    Launch(#[from] LaunchError),
}
