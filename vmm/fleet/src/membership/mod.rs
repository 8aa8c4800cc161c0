//! Membership: this node's record in etcd under a lease it keeps alive, and the
//! fleet as etcd holds it.
//!
//! A background task connects, grants a lease of `ttl`, and every
//! [`REFRESH`] (or at once when [`Membership::changed`] is called) re-puts the
//! node's record and syncs the owner and durable records of its claimed
//! sandboxes, then renews the lease. Any failure (etcd down, the lease expired
//! while the process was paused) drops the connection and starts over with a new
//! lease: the node never runs without a record silently, it logs and retries.
//! [`Membership::leave`] revokes the lease, so the node's records go at once.

pub mod parked;
pub mod record;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::Notify;

pub use parked::{ParkedSandbox, Take};
pub use record::{
    token_sha256, CheckpointRecord, Keys, LostSandbox, NodeRecord, ParkedRecord, SandboxRecord,
    Stored,
};

/// How often the record is re-put and the lease renewed.
pub const REFRESH: Duration = Duration::from_secs(1);

/// A record not refreshed for this long marks its node as not alive: its lease
/// may outlive a hung process (a lease TTL can be an hour), its refreshes cannot.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// How long one etcd call may take before etcd counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Where and as whom the node registers.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// The key prefix (`/sandbox`).
    pub prefix: String,
    /// This node's id.
    pub node_id: String,
    /// The lease's time to live.
    pub ttl: Duration,
}

/// What the node holds now, read at every refresh.
#[derive(Debug, Clone, Default)]
pub struct LocalState {
    /// The node's record (its `id` and `updated_unix` are filled in here).
    pub record: NodeRecord,
    /// Claimed sandboxes, by id.
    pub sandboxes: BTreeMap<String, LocalSandbox>,
}

/// One claimed sandbox of this node, as its durable record says it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalSandbox {
    /// Its template.
    pub template: String,
    /// When it was claimed (Unix seconds).
    pub created_unix: u64,
    /// The SHA-256 of its token ([`token_sha256`]).
    pub token_sha256: String,
}

/// Reads the node's current state.
pub type StateSource = Arc<dyn Fn() -> LocalState + Send + Sync>;

/// The fleet cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// etcd does not answer.
    #[error("etcd is unreachable ({endpoints}): {why}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// What failed.
        why: String,
    },
    /// A record does not decode.
    #[error(transparent)]
    Decode(#[from] record::DecodeError),
}

/// One peer as the fleet sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    /// Its record.
    #[serde(flatten)]
    pub record: NodeRecord,
    /// Whether it refreshed its record within [`STALE_AFTER`]: a dead node's record
    /// goes with its lease, a hung node's stays but stops being refreshed.
    pub alive: bool,
    /// Whether it is this node.
    pub this_node: bool,
}

/// The fleet: every registered node and every lost sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fleet {
    /// Registered nodes, by id.
    pub nodes: Vec<Peer>,
    /// Sandboxes whose node vanished.
    pub lost: Vec<LostSandbox>,
    /// Hibernated sandboxes handed to the fleet, waiting for a node to wake them.
    #[serde(default)]
    pub parked: Vec<ParkedSandbox>,
}

/// Where the fleet says one sandbox is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A live node owns it.
    Owned {
        /// The owner's id.
        node_id: String,
        /// Where clients reach the owner (empty when its node record is gone,
        /// the instant between its lease's keys expiring).
        addr: String,
        /// The SHA-256 of the sandbox's token, from its durable record (empty
        /// while that is not written yet).
        token_sha256: String,
    },
    /// Hibernated, its image in the object store, owned by no node: the first node
    /// with room that is asked for it takes it.
    Parked(ParkedRecord),
    /// Its durable record outlived its owner: its node vanished.
    Lost(SandboxRecord),
    /// The fleet holds no record of it.
    Unknown,
}

/// Whether the node is registered now.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Registration {
    /// The lease held, when registered.
    pub lease: Option<i64>,
    /// The last failure, when not.
    pub last_error: Option<String>,
}

struct Shared {
    config: MembershipConfig,
    keys: Keys,
    client: Mutex<Option<Client>>,
    registration: Mutex<Registration>,
    changed: Notify,
    stop: Notify,
}

/// This node's membership; cloning shares it.
#[derive(Clone)]
pub struct Membership {
    shared: Arc<Shared>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("node_id", &self.shared.config.node_id)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether a record refreshed at `updated_unix` is recent at `now` (a clock a
/// little ahead on the writer counts as fresh).
fn is_fresh(updated_unix: u64, now: u64) -> bool {
    now.saturating_sub(updated_unix) <= STALE_AFTER.as_secs()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn timed<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(format!("{what}: {error}")),
        Err(_) => Err(format!("{what}: no answer within {CALL_TIMEOUT:?}")),
    }
}

impl Membership {
    /// Starts registering; returns at once (etcd may be down: the task retries).
    pub fn start(config: MembershipConfig, source: StateSource) -> Self {
        let shared = Arc::new(Shared {
            keys: Keys::new(&config.prefix),
            config,
            client: Mutex::new(None),
            registration: Mutex::new(Registration::default()),
            changed: Notify::new(),
            stop: Notify::new(),
        });
        let task = tokio::spawn(run(shared.clone(), source));
        Self {
            shared,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.shared.config.node_id
    }

    /// Re-publish now (a drain, a claim, a release).
    pub fn changed(&self) {
        self.shared.changed.notify_one();
    }

    /// Whether the node is registered now.
    pub fn registration(&self) -> Registration {
        lock(&self.shared.registration).clone()
    }

    fn unreachable(&self, why: String) -> FleetError {
        FleetError::Unreachable {
            endpoints: self.shared.config.endpoints.join(","),
            why,
        }
    }

    /// The registered nodes as etcd holds them now (one read: what placement needs).
    pub async fn nodes(&self) -> Result<Vec<Peer>, FleetError> {
        let mut client = self.client().await?;
        let prefix = Some(GetOptions::new().with_prefix());
        let nodes = timed("read nodes", client.get(self.shared.keys.nodes(), prefix))
            .await
            .map_err(|why| self.unreachable(why))?;
        self.peers_of(&nodes)
    }

    fn peers_of(&self, nodes: &etcd_client::GetResponse) -> Result<Vec<Peer>, FleetError> {
        let now = now_unix();
        nodes
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let record = NodeRecord::decode(&key, kv.value())?;
                Ok(Peer {
                    this_node: record.id == self.shared.config.node_id,
                    alive: is_fresh(record.updated_unix, now),
                    record,
                })
            })
            .collect()
    }

    /// The fleet as etcd holds it now.
    pub async fn fleet(&self) -> Result<Fleet, FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let prefix = Some(GetOptions::new().with_prefix());
        let nodes = timed("read nodes", client.get(keys.nodes(), prefix.clone()))
            .await
            .map_err(|why| self.unreachable(why))?;
        let owners = timed("read owners", client.get(keys.owners(), prefix.clone()))
            .await
            .map_err(|why| self.unreachable(why))?;
        let sandboxes = timed(
            "read sandboxes",
            client.get(keys.sandboxes(), prefix.clone()),
        )
        .await
        .map_err(|why| self.unreachable(why))?;
        let parked = timed("read parked sandboxes", client.get(keys.parked(), prefix))
            .await
            .map_err(|why| self.unreachable(why))?;
        let mut fleet = Fleet {
            nodes: self.peers_of(&nodes)?,
            ..Fleet::default()
        };
        let owner_map: BTreeMap<String, String> = owners
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                (
                    key.trim_start_matches(&keys.owners()).to_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )
            })
            .collect();
        let mut durable = BTreeMap::new();
        for kv in sandboxes.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let record = SandboxRecord::decode(&key, kv.value())?;
            durable.insert(key.trim_start_matches(&keys.sandboxes()).to_owned(), record);
        }
        for kv in parked.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            fleet.parked.push(ParkedSandbox {
                id: key.trim_start_matches(&keys.parked()).to_owned(),
                record: ParkedRecord::decode(&key, kv.value())?,
            });
        }
        // A parked sandbox whose taker died midway has a durable record without its
        // owner, and is still parked, not lost.
        for parked in &fleet.parked {
            durable.remove(&parked.id);
        }
        fleet.lost = record::lost(&durable, &owner_map);
        Ok(fleet)
    }

    /// Where sandbox `id` is, by its owner and durable records.
    pub async fn locate(&self, id: &str) -> Result<Location, FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let owner = timed("read an owner record", client.get(keys.owner(id), None))
            .await
            .map_err(|why| self.unreachable(why))?;
        if let Some(kv) = owner.kvs().first() {
            let node_id = String::from_utf8_lossy(kv.value()).into_owned();
            let node = timed("read a node record", client.get(keys.node(&node_id), None))
                .await
                .map_err(|why| self.unreachable(why))?;
            let addr = match node.kvs().first() {
                Some(kv) => {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    NodeRecord::decode(&key, kv.value())?.addr
                }
                None => String::new(),
            };
            let durable = timed("read a sandbox record", client.get(keys.sandbox(id), None))
                .await
                .map_err(|why| self.unreachable(why))?;
            let token_sha256 = match durable.kvs().first() {
                Some(kv) => {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    SandboxRecord::decode(&key, kv.value())?.token_sha256
                }
                None => String::new(),
            };
            return Ok(Location::Owned {
                node_id,
                addr,
                token_sha256,
            });
        }
        if let Some(record) = self.parked(id).await? {
            return Ok(Location::Parked(record));
        }
        let durable = timed("read a sandbox record", client.get(keys.sandbox(id), None))
            .await
            .map_err(|why| self.unreachable(why))?;
        match durable.kvs().first() {
            Some(kv) => {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Ok(Location::Lost(SandboxRecord::decode(&key, kv.value())?))
            }
            None => Ok(Location::Unknown),
        }
    }

    /// The connected client, or a fresh connection while the task has none.
    async fn client(&self) -> Result<Client, FleetError> {
        let client = lock(&self.shared.client).clone();
        match client {
            Some(client) => Ok(client),
            None => connect(&self.shared.config)
                .await
                .map_err(|why| self.unreachable(why)),
        }
    }

    /// Forgets sandbox `id`'s durable record (a lost sandbox the operator gave up).
    pub async fn forget(&self, id: &str) -> Result<(), FleetError> {
        let client = lock(&self.shared.client).clone();
        let Some(mut client) = client else {
            return Err(self.unreachable("not connected".to_owned()));
        };
        timed("delete", client.delete(self.shared.keys.sandbox(id), None))
            .await
            .map(|_| ())
            .map_err(|why| self.unreachable(why))
    }

    /// Puts checkpoint `id`'s durable record (its manifest is in the store).
    pub async fn put_checkpoint(
        &self,
        id: &str,
        record: &CheckpointRecord,
    ) -> Result<(), FleetError> {
        let mut client = self.client().await?;
        timed(
            "put a checkpoint record",
            client.put(self.shared.keys.checkpoint(id), record.encode(), None),
        )
        .await
        .map(|_| ())
        .map_err(|why| self.unreachable(why))
    }

    /// Checkpoint `id`'s durable record, when there is one.
    pub async fn checkpoint(&self, id: &str) -> Result<Option<CheckpointRecord>, FleetError> {
        let mut client = self.client().await?;
        let key = self.shared.keys.checkpoint(id);
        let found = timed("read a checkpoint record", client.get(key.clone(), None))
            .await
            .map_err(|why| self.unreachable(why))?;
        match found.kvs().first() {
            Some(kv) => Ok(Some(CheckpointRecord::decode(&key, kv.value())?)),
            None => Ok(None),
        }
    }

    /// Removes checkpoint `id`'s durable record.
    pub async fn delete_checkpoint(&self, id: &str) -> Result<(), FleetError> {
        let mut client = self.client().await?;
        timed(
            "delete a checkpoint record",
            client.delete(self.shared.keys.checkpoint(id), None),
        )
        .await
        .map(|_| ())
        .map_err(|why| self.unreachable(why))
    }

    /// Stops the task and revokes the lease: the node's records go at once.
    pub async fn leave(&self) {
        self.shared.stop.notify_one();
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(CALL_TIMEOUT * 2, task).await;
        }
    }
}

async fn connect(config: &MembershipConfig) -> Result<Client, String> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CALL_TIMEOUT)
        .with_timeout(CALL_TIMEOUT);
    timed(
        "connect",
        Client::connect(config.endpoints.clone(), Some(options)),
    )
    .await
}

/// Registers, refreshes, and starts over on any failure, until told to stop.
async fn run(shared: Arc<Shared>, source: StateSource) {
    loop {
        // `session` sees the stop itself, to revoke its lease on the way out.
        match session(&shared, &source).await {
            Ok(()) => return,
            Err(why) => {
                tracing::warn!(error = %why, "fleet membership lost; re-registering");
                *lock(&shared.client) = None;
                *lock(&shared.registration) = Registration {
                    lease: None,
                    last_error: Some(why),
                };
                tokio::select! {
                    () = shared.stop.notified() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

/// One lease's life: grant, publish every refresh, revoke on stop.
async fn session(shared: &Shared, source: &StateSource) -> Result<(), String> {
    let config = &shared.config;
    let mut client = connect(config).await?;
    let ttl = i64::try_from(config.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let lease = timed("grant a lease", client.lease_grant(ttl, None))
        .await?
        .id();
    let (mut keeper, mut stream) =
        timed("keep the lease alive", client.lease_keep_alive(lease)).await?;
    *lock(&shared.client) = Some(client.clone());
    let mut published: BTreeSet<String> = BTreeSet::new();
    let mut conflicts: BTreeSet<String> = BTreeSet::new();
    let mut first = true;
    let result = loop {
        let sets = (&mut published, &mut conflicts);
        if let Err(why) = publish(shared, &mut client, lease, source, sets).await {
            break Err(why);
        }
        if first {
            tracing::info!(node = %config.node_id, lease, "registered in the fleet");
            *lock(&shared.registration) = Registration {
                lease: Some(lease),
                last_error: None,
            };
            first = false;
        }
        let renewed = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(CALL_TIMEOUT, renewed).await {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {}
            Ok(Ok(_)) => break Err(format!("lease {lease} expired")),
            Ok(Err(error)) => break Err(format!("renew lease {lease}: {error}")),
            Err(_) => break Err(format!("renew lease {lease}: no answer")),
        }
        tokio::select! {
            () = shared.stop.notified() => {
                let _ = timed("revoke the lease", client.lease_revoke(lease)).await;
                // Released sandboxes were deleted as they went; the claimed ones
                // keep their durable record (this node may re-adopt them).
                tracing::info!(node = %config.node_id, "left the fleet (lease revoked)");
                break Ok(());
            }
            () = shared.changed.notified() => {}
            () = tokio::time::sleep(REFRESH) => {}
        }
    };
    result
}

/// Puts the node's record and syncs its sandboxes' records.
async fn publish(
    shared: &Shared,
    client: &mut Client,
    lease: i64,
    source: &StateSource,
    (published, conflicts): (&mut BTreeSet<String>, &mut BTreeSet<String>),
) -> Result<(), String> {
    let keys = &shared.keys;
    let state = source();
    let mut record = state.record;
    record.id = shared.config.node_id.clone();
    record.updated_unix = now_unix();
    let on_lease = || Some(PutOptions::new().with_lease(lease));
    timed(
        "put the node record",
        client.put(keys.node(&record.id), record.encode(), on_lease()),
    )
    .await?;
    for (id, sandbox) in &state.sandboxes {
        if published.contains(id) {
            continue;
        }
        let durable = SandboxRecord {
            node_id: record.id.clone(),
            template: sandbox.template.clone(),
            created_unix: sandbox.created_unix,
            token_sha256: sandbox.token_sha256.clone(),
        };
        // Only a sandbox no other node owns: a copy of a sandbox that moved away
        // (a node restarted on a run folder it had handed over) must not take the
        // records from the node that runs it.
        let owner = keys.owner(id);
        let put = || {
            [
                TxnOp::put(owner.clone(), record.id.clone(), on_lease()),
                TxnOp::put(keys.sandbox(id), durable.encode(), None),
            ]
        };
        let mine = Txn::new()
            .when([Compare::value(
                owner.clone(),
                CompareOp::Equal,
                record.id.as_bytes(),
            )])
            .and_then(put());
        let mut done = timed("put a sandbox's records", client.txn(mine))
            .await?
            .succeeded();
        if !done {
            let free = Txn::new()
                .when([Compare::version(owner.clone(), CompareOp::Equal, 0)])
                .and_then(put());
            done = timed("put a sandbox's records", client.txn(free))
                .await?
                .succeeded();
        }
        if !done {
            if conflicts.insert(id.clone()) {
                tracing::error!(sandbox = %id, "another node owns this sandbox in the fleet: this node's copy is not published (it moved away while this node was down?); release it here");
            }
            continue;
        }
        conflicts.remove(id);
        published.insert(id.clone());
    }
    let gone: Vec<String> = published
        .iter()
        .filter(|id| !state.sandboxes.contains_key(*id))
        .cloned()
        .collect();
    for id in gone {
        // Only while this node still owns it: a sandbox parked from here may be
        // another node's already, and its records with it.
        let mine = Compare::value(keys.owner(&id), CompareOp::Equal, record.id.as_bytes());
        // A parked record left by a take whose settle failed goes too: the
        // sandbox it names was this node's, and is released.
        let release = Txn::new().when([mine]).and_then([
            TxnOp::delete(keys.owner(&id), None),
            TxnOp::delete(keys.sandbox(&id), None),
            TxnOp::delete(keys.parked_sandbox(&id), None),
        ]);
        timed("delete a sandbox's records", client.txn(release)).await?;
        published.remove(&id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_not_refreshed_within_the_stale_limit_is_not_alive() {
        let limit = STALE_AFTER.as_secs();
        assert!(is_fresh(1000, 1000));
        assert!(is_fresh(1000, 1000 + limit));
        assert!(!is_fresh(1000, 1000 + limit + 1));
        // A writer whose clock runs ahead is not penalised.
        assert!(is_fresh(1005, 1000));
    }
}
