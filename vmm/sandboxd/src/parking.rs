//! Hibernated sandboxes that leave a draining node through the fleet, and wake
//! on another with the same id, token, files and processes.
//!
//! **Park** ([`park`], on the node that holds it): the engine hands over the
//! hibernated sandbox while nothing can wake it (`Node::move_out`); its image goes
//! to the object store (`PREFIX/parked/<id>.json`, blobs shared with checkpoints),
//! then one etcd transaction replaces its owner and durable records by
//! `P/parked/<id>`, which keeps a digest of its token, never the token. Only then
//! does this node forget it and remove its image. A failure anywhere before the
//! transaction leaves it hibernated here, as it was.
//!
//! **Take** ([`take`], on a node asked for it by a caller with its token or the
//! operator's, that is not draining): an owner record on this node's lease (a
//! compare-and-swap: of two nodes asked at once one wins, the other redirects to
//! it), the image downloaded into a run folder under the VM's own id (every blob
//! checked by digest), registered asleep (`Node::move_in`); then the parked record
//! goes. The call that asked goes on and wakes it. A failed download or adoption
//! gives it back to the fleet (the owner record goes, the parked record stayed),
//! and a taker that dies midway lets its lease take the owner record with it: the
//! next node asked takes it again. Takes of one id on one node run one at a time.
//!
//! Parking happens when the node drains (`POST /v1/drain`: the hibernated
//! sandboxes; with `{"hibernate": true}` the running ones too, hibernated first)
//! and when a sandbox is hibernated on a draining node.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use sandbox_engine::moving::{MoveInError, MoveOutError};
use sandbox_engine::node::vm_id_of;
use sandbox_engine::record::{Owner, OwnerKind, RecordError, SandboxRecord, RECORD_VERSION};
use sandbox_engine::sandbox::{Sandbox, SandboxId};
use sandbox_fleet::membership::{self, token_sha256, FleetError, ParkedRecord, Take};
use sandbox_vmm::launcher::snapshot::SnapshotError;

use crate::api::{ApiError, AppState};
use crate::store::NodeStoreError;

/// The log event of each sandbox parked (the e2e test counts them).
pub const PARKED_EVENT: &str = "sandbox parked in the fleet";

/// How often a park whose etcd answer was lost asks again what became of it.
const RE_READS: usize = 10;

/// The log event of each parked sandbox taken by this node.
pub const TAKEN_EVENT: &str = "parked sandbox taken from the fleet";

/// Why a sandbox was not parked: it stays hibernated here (or running, when it
/// was not hibernated).
#[derive(Debug, thiserror::Error)]
pub enum ParkError {
    /// Parking needs both.
    #[error("This node has no object store and fleet (--store and --etcd): its sandboxes cannot leave it")]
    NoFleet,
    /// The engine would not hand it over (not hibernated, unknown, ...).
    #[error(transparent)]
    Engine(#[from] MoveOutError<Box<ParkError>>),
    /// The upload failed.
    #[error(transparent)]
    Store(#[from] NodeStoreError),
    /// etcd failed.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The fleet's records say another node owns it.
    #[error("Sandbox {0} is another node's in the fleet's records: not parked")]
    OwnedElsewhere(String),
    /// This node's QEMU version cannot be told.
    #[error("This node's QEMU version cannot be told: no other node could be known to restore its sandboxes")]
    UnknownQemu,
    /// Released while it was being parked: gone.
    #[error("Sandbox {0} was released while it was being parked")]
    Released(String),
    /// The park's task failed.
    #[error("The park failed: {0}")]
    Task(String),
}

/// Why a parked sandbox was not taken here.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// Another node took it first.
    #[error("Sandbox {id} was taken by node {node} meanwhile")]
    TakenBy {
        /// The sandbox.
        id: String,
        /// The node.
        node: String,
    },
    /// It is not parked any more (taken and settled, or released).
    #[error("Sandbox {0} is not parked in the fleet any more")]
    NotParked(String),
    /// No VM id in the sandbox id.
    #[error("Sandbox id {0} names no VM")]
    BadId(String),
    /// The download failed.
    #[error(transparent)]
    Store(#[from] NodeStoreError),
    /// etcd failed.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// Its run folder could not be made or recorded.
    #[error("Cannot make the arrived sandbox's run folder")]
    Folder(#[from] SnapshotError),
    /// Its claim record could not be written.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The engine would not register it.
    #[error(transparent)]
    MoveIn(#[from] MoveInError),
    /// Its claim ran out while it was parked.
    #[error("Sandbox {0} reached its deadline while parked and was removed")]
    Expired(String),
    /// The stored image names another token than the fleet's record.
    #[error("Sandbox {0}'s stored image does not match its fleet record: refused")]
    Mismatch(String),
    /// The take's task failed.
    #[error("The take failed: {0}")]
    Task(String),
    /// This node has no launcher or no fleet.
    #[error("This node cannot take sandboxes from the fleet (it needs --store, --etcd and VMs of its own)")]
    NoFleet,
}

/// Takes under way on this node, one per sandbox id.
#[derive(Debug, Default)]
pub struct Takes {
    flights: crate::flights::Flights,
}

impl Takes {
    /// Whether a take of `id` runs on this node now.
    pub fn under_way(&self, id: &str) -> bool {
        self.flights.under_way(id)
    }
}

/// What a park did.
#[derive(Debug, Clone)]
pub struct Parked {
    /// Data bytes of the image.
    pub data_bytes: u64,
    /// How long the upload took.
    pub upload_ms: u64,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn unix_secs(ms: u64) -> u64 {
    ms / 1000
}

/// Whether this node can park and take: an object store and a fleet.
pub fn enabled(state: &AppState) -> bool {
    state.store.is_some() && state.membership.is_some()
}

/// Parks the hibernated sandbox `id` (see the module docs). Runs to its end in
/// a task of its own: a caller that goes away halfway (a client that hangs up)
/// does not leave it half-moved.
pub async fn park(state: &AppState, id: &str) -> Result<Parked, ParkError> {
    let (state, owned_id) = (state.clone(), id.to_owned());
    tokio::spawn(async move { park_now(&state, &owned_id).await })
        .await
        .unwrap_or_else(|error| Err(ParkError::Task(error.to_string())))
}

async fn park_now(state: &AppState, id: &str) -> Result<Parked, ParkError> {
    let (Some(store), Some(membership)) = (&state.store, &state.membership) else {
        return Err(ParkError::NoFleet);
    };
    if store.qemu_version().is_none() {
        // No node could ever be told able to restore it.
        return Err(ParkError::UnknownQemu);
    }
    let moved = state
        .node
        .move_out(id, |parcel| async move {
            let uploaded = store
                .upload_parked(&parcel)
                .await
                .map_err(|e| Box::new(ParkError::Store(e)))?;
            let record = ParkedRecord {
                node_id: membership.node_id().to_owned(),
                manifest_key: store.parked_manifest_key(id),
                qemu_version: store.qemu_version().unwrap_or_default().to_owned(),
                machine: std::env::consts::ARCH.to_owned(),
                token_sha256: token_sha256(&parcel.claim.token),
                template: parcel.claim.template.clone(),
                created_unix: unix_secs(parcel.claim.claimed_at_unix_ms),
                deadline_unix: unix_secs(parcel.claim.deadline_unix_ms),
                data_bytes: uploaded.data_bytes,
                parked_unix: now_unix(),
                image: parcel.image.clone(),
            };
            match membership.park(id, &record).await {
                Ok(true) => {}
                Ok(false) => {
                    // Refused for sure: the image in the store is nobody's.
                    if let Err(cleanup) = store.delete_parked(id).await {
                        tracing::warn!(sandbox = %id, error = %cleanup, "cannot remove an image that was not parked");
                    }
                    return Err(Box::new(ParkError::OwnedElsewhere(id.to_owned())));
                }
                Err(error) => {
                    // The answer may be lost after the hand-over was done: this
                    // park's record (its image's name) says which, once etcd
                    // answers again.
                    let mut handed = None;
                    for _ in 0..RE_READS {
                        match membership.parked(id).await {
                            Ok(found) => {
                                handed = Some(found.is_some_and(|found| {
                                    found.node_id == record.node_id && found.image == record.image
                                }));
                                break;
                            }
                            Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
                        }
                    }
                    if handed != Some(true) {
                        // Not done, or unknown: the sandbox stays here, and the image
                        // stays in the store in case a record names it.
                        return Err(Box::new(ParkError::Fleet(error)));
                    }
                }
            }
            Ok(Parked {
                data_bytes: uploaded.data_bytes,
                upload_ms: uploaded.took_ms,
            })
        })
        .await;
    let (parked, still_here) = moved.map_err(|error| match error {
        MoveOutError::Send(inner) => *inner,
        other => ParkError::Engine(other),
    })?;
    state.use_changed();
    if !still_here {
        // Released while it moved: the release was answered as done, so it goes
        // from the fleet too.
        let dropped = membership.drop_parked(id).await;
        if !matches!(dropped, Ok(true)) {
            tracing::warn!(sandbox = %id, ?dropped, "released during its park, but its parked record could not be removed");
        }
        if let Err(error) = store.delete_parked(id).await {
            tracing::warn!(sandbox = %id, error = %error, "cannot remove a released sandbox's image manifest");
        }
        return Err(ParkError::Released(id.to_owned()));
    }
    tracing::info!(
        sandbox = %id,
        data_bytes = parked.data_bytes,
        upload_ms = parked.upload_ms,
        "{PARKED_EVENT}"
    );
    Ok(parked)
}

/// Takes the parked sandbox `id` for this node (see the module docs): the
/// sandbox, registered asleep, or why not. In a task of its own, like [`park`].
pub async fn take(state: &AppState, id: &str) -> Result<Arc<Sandbox>, TakeError> {
    let (state, owned_id) = (state.clone(), id.to_owned());
    tokio::spawn(async move { take_in_flight(&state, &owned_id).await })
        .await
        .unwrap_or_else(|error| Err(TakeError::Task(error.to_string())))
}

async fn take_in_flight(state: &AppState, id: &str) -> Result<Arc<Sandbox>, TakeError> {
    state
        .takes
        .flights
        .one_at_a_time(id, async {
            // A take of the same id that went first may have brought it.
            match state.node.sandbox(id) {
                Ok(sandbox) => Ok(sandbox),
                Err(_) => take_once(state, id).await,
            }
        })
        .await
}

async fn take_once(state: &AppState, id: &str) -> Result<Arc<Sandbox>, TakeError> {
    let (Some(store), Some(membership), Some(launcher)) = (
        &state.store,
        &state.membership,
        state.node.snapshots().map(|host| host.launcher()),
    ) else {
        return Err(TakeError::NoFleet);
    };
    let vm_id = vm_id_of(&SandboxId::new(id)).ok_or_else(|| TakeError::BadId(id.to_owned()))?;
    let give_back = || async {
        if let Err(error) = membership.untake(id).await {
            tracing::warn!(sandbox = %id, error = %error, "cannot give a parked sandbox back: it is parked again once this node's lease expires");
        }
    };
    let record = match membership.take(id).await {
        Ok(Take::Taken(record)) => record,
        Ok(Take::TakenBy(node)) => {
            return Err(TakeError::TakenBy {
                id: id.to_owned(),
                node,
            })
        }
        Ok(Take::NotParked) => return Err(TakeError::NotParked(id.to_owned())),
        Err(error) => {
            // The take may have been done with its answer lost.
            give_back().await;
            return Err(error.into());
        }
    };
    if record.deadline_unix <= now_unix() {
        // Its claim ran out while it was parked: nobody wakes it any more.
        give_back().await;
        let _ = membership.drop_parked(id).await;
        let _ = store.delete_parked(id).await;
        tracing::info!(sandbox = %id, "a parked sandbox reached its deadline: removed");
        return Err(TakeError::Expired(id.to_owned()));
    }
    let run_root = state.node.run_root();
    let committed = std::sync::atomic::AtomicBool::new(false);
    let arrived = async {
        let received = launcher.receive_hibernated(&vm_id)?;
        let mut arrived = store.download_parked(id, received.path()).await?;
        // What etcd says wins over what the store says: a store that was written
        // to cannot hand out another token or a longer life.
        if token_sha256(&arrived.claim.token) != record.token_sha256 {
            return Err(TakeError::Mismatch(id.to_owned()));
        }
        arrived.claim.deadline_unix_ms = record.deadline_unix.saturating_mul(1000);
        let claim_record = SandboxRecord {
            version: RECORD_VERSION,
            owner: Owner::this(OwnerKind::Node),
            claim: Some(arrived.claim.clone()),
        };
        sandbox_engine::record::write(received.path(), &claim_record)?;
        received.commit(&arrived.image, &arrived.vm_token)?;
        committed.store(true, std::sync::atomic::Ordering::SeqCst);
        let sandbox = state.node.move_in(&vm_id).await?;
        Ok::<_, TakeError>((sandbox, arrived.report))
    }
    .await;
    let (sandbox, report) = match arrived {
        Ok(arrived) => arrived,
        Err(error) => {
            tracing::warn!(sandbox = %id, error = %sandbox_vmm::error_chain(&error), "a parked sandbox could not be taken: given back to the fleet");
            if committed.load(std::sync::atomic::Ordering::SeqCst) {
                // Recorded as this host's VM but not registered: it must not come
                // back at this node's next start, the fleet's copy is the one.
                if let Some(root) = &run_root {
                    let _ = std::fs::remove_dir_all(root.join(vm_id.as_str()));
                }
            }
            give_back().await;
            return Err(error);
        }
    };
    let durable = membership::SandboxRecord {
        node_id: membership.node_id().to_owned(),
        template: record.template.clone(),
        created_unix: record.created_unix,
        token_sha256: record.token_sha256.clone(),
    };
    match membership.settle(id, &durable).await {
        Ok(true) => {
            if let Err(error) = store.delete_parked(id).await {
                tracing::warn!(sandbox = %id, error = %error, "cannot remove its image manifest from the store");
            }
        }
        Ok(false) => {
            // This node's lease expired meanwhile: another node may take it from
            // the store, so this copy goes (unwoken, nothing of it is lost).
            tracing::warn!(sandbox = %id, "this node's lease expired while it took the sandbox: its copy here is dropped");
            let _ = state.node.release(id).await;
            return Err(TakeError::NotParked(id.to_owned()));
        }
        Err(error) => {
            // Unknown: kept here (its owner record, on this node's lease, holds it);
            // the store's copy stays in case the parked record does.
            tracing::warn!(sandbox = %id, error = %error, "cannot remove its parked record");
        }
    }
    state.use_changed();
    tracing::info!(
        sandbox = %id,
        from = %record.node_id,
        data_bytes = report.data_bytes,
        download_ms = report.took_ms,
        "{TAKEN_EVENT}"
    );
    Ok(sandbox)
}

/// Hibernates (with `hibernate`) and parks every sandbox of this node that can
/// leave: the ids parked, and those that stayed with why.
pub async fn evacuate(state: &AppState, hibernate: bool) -> (Vec<String>, Vec<(String, String)>) {
    let mut parked = Vec::new();
    let mut stayed = Vec::new();
    if !enabled(state) {
        return (parked, stayed);
    }
    for sandbox in state.node.registry().list() {
        if sandbox.is_attached() {
            continue;
        }
        let id = sandbox.id.to_string();
        if !sandbox.is_hibernated().await {
            if !hibernate {
                continue;
            }
            if let Err(error) = state.node.hibernate(&id).await {
                stayed.push((id, sandbox_vmm::error_chain(&error)));
                continue;
            }
        }
        match park(state, &id).await {
            Ok(_) => parked.push(id),
            Err(ParkError::Released(_)) => {}
            Err(error) => stayed.push((id, sandbox_vmm::error_chain(&error))),
        }
    }
    (parked, stayed)
}

impl From<ParkError> for ApiError {
    fn from(error: ParkError) -> Self {
        match error {
            ParkError::Store(error) => error.into(),
            ParkError::Fleet(error) => error.into(),
            ParkError::Engine(MoveOutError::Lookup(error)) => error.into(),
            other => ApiError::new(
                StatusCode::CONFLICT,
                "not_parked",
                sandbox_vmm::error_chain(&other),
            ),
        }
    }
}

impl From<TakeError> for ApiError {
    fn from(error: TakeError) -> Self {
        match error {
            TakeError::Store(error) => error.into(),
            TakeError::Fleet(error) => error.into(),
            TakeError::Expired(_) => ApiError::new(StatusCode::GONE, "gone", error.to_string()),
            other => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "wake_elsewhere_failed",
                sandbox_vmm::error_chain(&other),
            ),
        }
    }
}
