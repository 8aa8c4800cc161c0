//! A hibernated sandbox leaves this node for another, or arrives from one: the
//! engine's half of the fleet's parking (the node daemon moves the bytes and keeps
//! the fleet's records).
//!
//! - [`Node::move_out`] hands a hibernated sandbox's run folder to the caller's
//!   `send` (an upload, then a hand-over in etcd) while nothing can wake it; once
//!   `send` succeeds the sandbox is gone from this node (its id answers
//!   `Gone::Moved`) and its image removed. A failed `send` leaves it hibernated
//!   here, as it was.
//! - [`Node::move_in`] registers, asleep, a sandbox whose run folder the caller
//!   made with [`sandbox_vmm::launcher::Launcher::receive_hibernated`] and filled
//!   (its image and its `sandbox.json`); its first call wakes it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use sandbox_vmm::launcher::run_dir::{self, VmId};

use crate::node::{vm_id_of, Node};
use crate::record::{self, ClaimRecord};
use crate::sandbox::{HandOffError, Sandbox, SandboxId};

/// In a run folder: its sandbox was handed to another node (the folder is
/// removed, never adopted).
pub const MOVED_FILE: &str = "moved";

/// What a hibernated sandbox leaving this node is made of.
#[derive(Debug, Clone)]
pub struct Parcel {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Its VM's id (the run folder's name: it keeps it on the next node).
    pub vm_id: String,
    /// Its run folder.
    pub run_folder: PathBuf,
    /// Its hibernation image's folder name inside the run folder.
    pub image: String,
    /// Its claim (id, token, template, size, deadline, lineage).
    pub claim: ClaimRecord,
    /// The token of the agent inside the VM.
    pub vm_token: String,
}

/// Why a sandbox did not move out.
#[derive(Debug, thiserror::Error)]
pub enum MoveOutError<E> {
    /// Not a sandbox of this node.
    #[error(transparent)]
    Lookup(#[from] crate::error::LookupError),
    /// Only a hibernated sandbox of a VM this node runs moves.
    #[error("Sandbox {id} cannot move: {why}")]
    NotMovable {
        /// The sandbox.
        id: String,
        /// Why.
        why: String,
    },
    /// Its run folder is not what a hibernated sandbox leaves.
    #[error("Sandbox {id} cannot move: its run folder {}: {why}", folder.display())]
    Folder {
        /// The sandbox.
        id: String,
        /// The folder.
        folder: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The caller's sending failed: the sandbox stays hibernated here.
    #[error(transparent)]
    Send(E),
}

/// Why an arrived sandbox was not registered.
#[derive(Debug, thiserror::Error)]
pub enum MoveInError {
    /// This node runs no VMs (attach mode).
    #[error("This node runs no VMs of its own")]
    NoLauncher,
    /// Its run folder cannot be read.
    #[error("The arrived VM {vm_id}'s run folder is unusable: {why}")]
    Folder {
        /// The VM.
        vm_id: String,
        /// Why.
        why: String,
    },
}

impl Node {
    /// The run folders' root; `None` in attach mode.
    pub fn run_root(&self) -> Option<PathBuf> {
        let pool = self.pool()?;
        Some(pool.factory().launcher().config().run_root.clone())
    }

    /// Moves the hibernated sandbox `id` out through `send` (see the module docs).
    /// Also answers whether it was still this node's when `send` was done: false
    /// when it was released (or expired) while `send` ran, which the caller must
    /// then undo elsewhere (the release was answered as done).
    pub async fn move_out<T, E, F, Fut>(
        &self,
        id: &str,
        send: F,
    ) -> Result<(T, bool), MoveOutError<E>>
    where
        F: FnOnce(Parcel) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let sandbox = self.sandbox(id)?;
        let not_movable = |why: &str| MoveOutError::NotMovable {
            id: id.to_owned(),
            why: why.to_owned(),
        };
        let run_root = self
            .run_root()
            .ok_or_else(|| not_movable("it is the attached agent"))?;
        let sent = sandbox
            .hand_off(|image| async move {
                let run = run_root.join(&image.vm_id);
                let parcel = parcel_of(id, &run)?;
                let sent = send(parcel).await.map_err(MoveOutError::Send)?;
                // Another node's now: should this node die before the folder is
                // removed, its next start removes it instead of adopting it.
                if let Err(error) = std::fs::write(run.join(MOVED_FILE), b"") {
                    tracing::warn!(sandbox = %id, %error, "cannot mark a moved sandbox's run folder");
                }
                Ok(sent)
            })
            .await;
        let sent = match sent {
            Ok(sent) => sent,
            Err(HandOffError::NotHibernated(why)) => return Err(not_movable(why)),
            Err(HandOffError::Send(error)) => return Err(error),
        };
        let still_here = self.registry.remove_moved(id).is_ok();
        if still_here {
            tracing::info!(sandbox = %id, "moved out of this node");
        } else {
            tracing::warn!(sandbox = %id, "released or expired while it moved out");
        }
        Ok((sent, still_here))
    }

    /// Registers, asleep, the sandbox that arrived as VM `vm_id` (see the module
    /// docs).
    pub async fn move_in(&self, vm_id: &VmId) -> Result<Arc<Sandbox>, MoveInError> {
        let folder_error = |why: String| MoveInError::Folder {
            vm_id: vm_id.to_string(),
            why,
        };
        let (Some(pool), Some(snapshots)) = (self.pool(), self.snapshots()) else {
            return Err(MoveInError::NoLauncher);
        };
        let entries = pool
            .factory()
            .launcher()
            .list()
            .map_err(|e| folder_error(sandbox_vmm::error_chain(&e)))?;
        let entry = entries
            .into_iter()
            .find(|entry| entry.name == vm_id.as_str())
            .ok_or_else(|| folder_error("it is not in the run root".to_owned()))?;
        let claim = record::read(&entry.path)
            .map_err(|e| folder_error(sandbox_vmm::error_chain(&e)))?
            .and_then(|record| record.claim)
            .ok_or_else(|| folder_error("it holds no claim record".to_owned()))?;
        let id = claim.id.clone();
        let found = self
            .adopt_claimed(pool, snapshots, vm_id, &entry, claim)
            .await;
        match self.sandbox(&id) {
            Ok(sandbox) if found == crate::adopt::Found::Asleep => {
                tracing::info!(sandbox = %id, "moved in, asleep until its first call");
                Ok(sandbox)
            }
            _ => Err(folder_error(format!(
                "it was not adopted as a hibernated sandbox ({found:?}; see the log)"
            ))),
        }
    }
}

/// What the run folder `run` of the hibernated sandbox `id` holds.
fn parcel_of<E>(id: &str, run: &std::path::Path) -> Result<Parcel, MoveOutError<E>> {
    let folder_error = |why: String| MoveOutError::Folder {
        id: id.to_owned(),
        folder: run.to_owned(),
        why,
    };
    let vm = run_dir::read_record(run).ok_or_else(|| folder_error("no VM record".to_owned()))?;
    let image = vm
        .hibernation
        .ok_or_else(|| folder_error("its VM record says it is not hibernated".to_owned()))?;
    let claim = record::read(run)
        .map_err(|e| folder_error(sandbox_vmm::error_chain(&e)))?
        .and_then(|record| record.claim)
        .ok_or_else(|| folder_error("it holds no claim record".to_owned()))?;
    if vm_id_of(&SandboxId::new(claim.id.clone())).as_ref() != Some(&vm.id) {
        return Err(folder_error(format!(
            "its claim names sandbox {}",
            claim.id
        )));
    }
    let vm_token =
        run_dir::read_token(run).ok_or_else(|| folder_error("no agent token".to_owned()))?;
    Ok(Parcel {
        sandbox_id: id.to_owned(),
        vm_id: vm.id.to_string(),
        run_folder: run.to_owned(),
        image,
        claim,
        vm_token,
    })
}
