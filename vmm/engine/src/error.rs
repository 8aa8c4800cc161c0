//! What each operation of the [`crate::Node`] can fail with: one enum per operation,
//! each variant carrying its context. The messages say what happened in the domain's
//! terms only; what to do next (call this tool, pass that flag, HTTP 409) is the front
//! end's to say, at its edge.

use sandbox_vmm::launcher::snapshot::SnapshotError;

use crate::pool::launcher::BootError;
use crate::pool::ClaimError;
use crate::registry::Lookup;
use crate::sandbox::{HibernateError, SandboxId, Unreachable};

/// A claim's failure in the pool: no room, a failed boot, or shutdown.
pub type PoolError = ClaimError<BootError>;

/// An id the node does not hold (now).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe_lookup(.id, .why))]
pub struct LookupError {
    /// The id asked for.
    pub id: String,
    /// Never seen, gone, or the node is closing.
    pub why: Lookup,
    /// The ids that are live, for the front end to offer.
    pub live: Vec<String>,
}

fn describe_lookup(id: &str, why: &Lookup) -> String {
    match why {
        Lookup::Unknown => format!("Unknown sandbox {id:?}"),
        Lookup::Gone(crate::registry::Gone::Released) => format!("Sandbox {id:?} was released"),
        Lookup::Gone(crate::registry::Gone::Expired(_)) => {
            format!("Sandbox {id:?} reached its deadline and was destroyed")
        }
        Lookup::Gone(crate::registry::Gone::Moved) => {
            format!(
                "Sandbox {id:?} was handed to the fleet while hibernated: another node wakes it"
            )
        }
        Lookup::Closed => "The node is shutting down".to_owned(),
    }
}

/// A sandbox could not be added to the registry.
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    /// No random bytes for its token.
    #[error("Cannot make the sandbox's token: no random bytes from the kernel")]
    Token(#[source] std::io::Error),
    /// The node is shutting down (the VM was destroyed).
    #[error("The node is shutting down")]
    Closed,
    /// Its record could not be written (the VM was destroyed: a sandbox the node
    /// could not re-adopt after a restart would be lost then).
    #[error("Cannot write the sandbox's record")]
    Record(#[source] crate::record::RecordError),
}

/// A `ttl_seconds` that cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ttl_seconds may be at most {max}; got {asked}")]
pub struct TtlError {
    /// Asked for.
    pub asked: u64,
    /// The longest allowed.
    pub max: u64,
}

/// A network a claim cannot have.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `allow` without `net: egress`.
    #[error("allow applies to net \"egress\" only")]
    AllowWithoutEgress,
    /// The attached agent runs in no VM of the node's.
    #[error("The attached agent runs in no VM this node launched, so it has no egress to give")]
    Attached,
    /// The operator set no allowlist.
    #[error("This node gives no egress: its operator set no allowlist")]
    NoAllowlist,
    /// The sandbox's own `allow` does not parse.
    #[error(transparent)]
    Allow(sandbox_vmm::egress::EntryError),
}

/// A template or size a claim cannot use.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SpecError {
    /// A size name the launcher does not know.
    #[error("Size {0} is not one the launcher knows")]
    UnknownSize(String),
    /// The template cannot be loaded.
    #[error("Template {template} cannot be used: {error}")]
    Template {
        /// As asked for.
        template: String,
        /// Why (the launcher's error chain).
        error: String,
        /// The templates the node holds.
        available: Vec<String>,
    },
}

/// Why `create` (one claim) failed; nothing was kept.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The TTL is too long.
    #[error(transparent)]
    Ttl(TtlError),
    /// The network cannot be had.
    #[error(transparent)]
    Net(NetError),
    /// The template or size cannot be used.
    #[error(transparent)]
    Spec(SpecError),
    /// No VM could be had.
    #[error("Could not start a sandbox from template {template:?}")]
    Claim {
        /// The template.
        template: String,
        /// Why.
        #[source]
        error: PoolError,
    },
    /// It could not be registered.
    #[error(transparent)]
    Insert(InsertError),
    /// Attach mode: the one sandbox there is is claimed already.
    #[error("The attached agent is the only sandbox, and it is claimed")]
    AttachedTaken,
    /// The node is draining: it takes no new claims.
    #[error("The node is draining: it takes no new claims")]
    Draining,
    /// The claim named an image reference that could not become a template.
    #[error(transparent)]
    Image(crate::image_build::ImageBuildError),
}

/// A capture (fork, checkpoint, promote) of a running sandbox that failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Its guest could not be reached (or woken).
    #[error(transparent)]
    Unreachable(Unreachable),
    /// The launcher's snapshot failed.
    #[error(transparent)]
    Snapshot(SnapshotError),
    /// The capture's task ended before it did (the node is shutting down).
    #[error("The capture was interrupted: the node is shutting down")]
    Interrupted,
}

/// New VMs (children of a fork or branch) that could not become sandboxes; none of
/// them was kept.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// One child's agent did not answer.
    #[error("A new sandbox's agent did not answer")]
    Connect(#[source] BootError),
    /// One could not be registered.
    #[error(transparent)]
    Insert(InsertError),
}

/// Why `fork` failed.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The node launches no VMs (attach mode).
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The count is out of range.
    #[error("count must be between 1 and {max}; got {count}")]
    Count {
        /// Asked for.
        count: u64,
        /// The node's fork limit.
        max: usize,
    },
    /// The parent is not one of the node's sandboxes.
    #[error(transparent)]
    Lookup(LookupError),
    /// Too few capacity slots.
    #[error("{wanted} more VMs do not fit")]
    NoRoom {
        /// Slots asked for.
        wanted: usize,
        /// Why.
        #[source]
        error: PoolError,
    },
    /// The capture failed.
    #[error(transparent)]
    Capture(CaptureError),
    /// The children could not be kept.
    #[error(transparent)]
    Children(AdoptError),
}

/// Why `checkpoint` failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The name is unusable.
    #[error(transparent)]
    Name(SnapshotError),
    /// The sandbox is not one of the node's.
    #[error(transparent)]
    Lookup(LookupError),
    /// The capture failed.
    #[error(transparent)]
    Capture(CaptureError),
}

/// Why a branch of a checkpoint failed; nothing was kept.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// No checkpoint id or name was given.
    #[error("No checkpoint id was given")]
    EmptyKey,
    /// The checkpoint is not in the store (or cannot be read).
    #[error(transparent)]
    Find(SnapshotError),
    /// Too few capacity slots.
    #[error("{wanted} more VMs do not fit")]
    NoRoom {
        /// Slots asked for.
        wanted: usize,
        /// Why.
        #[source]
        error: Box<PoolError>,
    },
    /// The launcher's branch failed.
    #[error(transparent)]
    Branch(SnapshotError),
    /// The children could not be kept.
    #[error(transparent)]
    Children(AdoptError),
    /// The node is draining.
    #[error("The node is draining: it takes no new claims")]
    Draining,
}

/// Why the checkpoints cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListCheckpointsError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The store cannot be read.
    #[error(transparent)]
    List(SnapshotError),
}

/// Who keeps a checkpoint from being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointUser {
    /// A sandbox of this node.
    Sandbox(SandboxId),
    /// A VM that is no sandbox of this node (started by the CLI, or another node).
    Vm(String),
    /// Something else the launcher reports (a template's ready snapshot, ...).
    Other(String),
}

impl std::fmt::Display for CheckpointUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sandbox(id) => write!(f, "sandbox {id}"),
            Self::Vm(vm) => write!(f, "VM {vm} (not a sandbox of this node)"),
            Self::Other(what) => f.write_str(what),
        }
    }
}

/// Why `delete_checkpoint` failed; the checkpoint is as it was.
#[derive(Debug, thiserror::Error)]
pub enum DeleteCheckpointError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The checkpoint is not in the store.
    #[error(transparent)]
    Find(SnapshotError),
    /// Sandboxes or VMs still use it.
    #[error("Checkpoint {id} is in use")]
    InUse {
        /// Its id.
        id: String,
        /// Who uses it.
        users: Vec<CheckpointUser>,
    },
    /// The launcher's delete failed.
    #[error(transparent)]
    Delete(SnapshotError),
}

/// Why `hibernate` failed.
#[derive(Debug, thiserror::Error)]
pub enum HibernateOpError {
    /// The sandbox is not one of the node's.
    #[error(transparent)]
    Lookup(LookupError),
    /// The hibernation failed.
    #[error(transparent)]
    Hibernate(HibernateError),
}

/// Why `promote` failed.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The template name is unusable.
    #[error(transparent)]
    Name(SnapshotError),
    /// The name is the node's default template (its warm pool serves it).
    #[error("{0:?} is the node's default template and cannot be replaced")]
    Default(String),
    /// The name is a built template, which promote does not replace.
    #[error("{0:?} is a built template, not one made by promote")]
    Built(String),
    /// The sandbox is not one of the node's.
    #[error(transparent)]
    Lookup(LookupError),
    /// The capture failed.
    #[error(transparent)]
    Capture(CaptureError),
}

/// Why a batch of sandboxes was not made (nothing of it was kept).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The node is attached to one agent: there is nothing to claim.
    #[error("This node is attached to one existing agent and claims no VMs")]
    Attached,
    /// The count is out of range.
    #[error("count must be between 1 and {max}; got {count}")]
    Count {
        /// Asked for.
        count: u64,
        /// The node's VM limit.
        max: usize,
    },
    /// The template or size cannot be used.
    #[error(transparent)]
    Spec(SpecError),
    /// No room, a failed boot, or shutdown.
    #[error(transparent)]
    Claim(#[from] PoolError),
    /// A sandbox could not be registered (the node is closing) or given a token.
    #[error(transparent)]
    Insert(InsertError),
    /// The node is draining.
    #[error("The node is draining: it takes no new claims")]
    Draining,
}

/// Why `renew` failed.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// The sandbox is not one of the node's.
    #[error(transparent)]
    Lookup(LookupError),
    /// The TTL is too long.
    #[error(transparent)]
    Ttl(TtlError),
    /// The attached agent has no deadline to renew.
    #[error("The attached agent has no deadline")]
    Attached,
}

/// Why a promoted template was not deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteTemplateError {
    /// The node launches no VMs.
    #[error("The node launches no microVMs")]
    NotLaunch,
    /// The name is the node's default template (its warm pool serves it).
    #[error("{0:?} is the node's default template and cannot be deleted")]
    Default(String),
    /// Live sandboxes were claimed from it.
    #[error("Template {name:?} is in use by {}: release them first", sandboxes.join(", "))]
    InUse {
        /// The template.
        name: String,
        /// The sandboxes of it.
        sandboxes: Vec<String>,
    },
    /// No such template, a built one, a bad name, or the files could not go.
    #[error(transparent)]
    Snapshot(SnapshotError),
}
