//! Hibernated sandboxes handed from one node to the fleet, and taken by another.
//!
//! A sandbox moves in three compare-and-swap steps, so that at every instant
//! exactly one party may wake it and a node that dies in between loses nothing:
//!
//! 1. [`Membership::park`] (the node that held it, once its image is in the object
//!    store): its owner and durable records go, `P/parked/<id>` comes, in one
//!    transaction that holds only while this node still owns it. From here the
//!    parking node must not wake it (it forgets it).
//! 2. [`Membership::take`] (a node asked for it, with room): an owner record on
//!    the taker's lease and a durable record naming it, only while no owner record
//!    exists and the parked record is the one it read. Two nodes asked at once: one wins, the other is told who did. A taker
//!    that dies now lets its lease and owner record go, and the sandbox is parked
//!    again for the next node.
//! 3. [`Membership::settle`] (the taker, once the image is in its run folder and
//!    the sandbox registered): the parked record goes, the durable record names the
//!    taker. [`Membership::untake`] instead gives it back when the download or the
//!    adoption failed.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{timed, FleetError, Membership, ParkedRecord, SandboxRecord, Stored as _};

/// A parked sandbox in the fleet's listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedSandbox {
    /// The sandbox's id.
    pub id: String,
    /// What its parked record says.
    #[serde(flatten)]
    pub record: ParkedRecord,
}

/// What [`Membership::take`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// This node owns it now: download its image and settle.
    Taken(ParkedRecord),
    /// Another node took it first (its id).
    TakenBy(String),
    /// It is not parked (any more).
    NotParked,
}

impl Membership {
    /// Sandbox `id`'s parked record, when it is parked.
    pub async fn parked(&self, id: &str) -> Result<Option<ParkedRecord>, FleetError> {
        let mut client = self.client().await?;
        let key = self.shared.keys.parked_sandbox(id);
        let found = timed("read a parked record", client.get(key.clone(), None))
            .await
            .map_err(|why| self.unreachable(why))?;
        match found.kvs().first() {
            Some(kv) => Ok(Some(ParkedRecord::decode(&key, kv.value())?)),
            None => Ok(None),
        }
    }

    /// Hands sandbox `id`, owned by this node, to the fleet as `record` (step 1 of
    /// the module docs). False when this node does not own it in etcd (another node
    /// does): nothing changed. A sandbox whose owner record was not published yet
    /// (claimed less than a refresh ago) is parked too.
    pub async fn park(&self, id: &str, record: &ParkedRecord) -> Result<bool, FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let me = self.node_id().as_bytes().to_vec();
        let hand_over = || {
            [
                TxnOp::put(keys.parked_sandbox(id), record.encode(), None),
                TxnOp::delete(keys.owner(id), None),
                TxnOp::delete(keys.sandbox(id), None),
            ]
        };
        let owned = Txn::new()
            .when([Compare::value(keys.owner(id), CompareOp::Equal, me)])
            .and_then(hand_over());
        let done = timed("park a sandbox", client.txn(owned))
            .await
            .map_err(|why| self.unreachable(why))?;
        if done.succeeded() {
            return Ok(true);
        }
        let unowned = Txn::new()
            .when([Compare::version(keys.owner(id), CompareOp::Equal, 0)])
            .and_then(hand_over());
        let done = timed("park a sandbox", client.txn(unowned))
            .await
            .map_err(|why| self.unreachable(why))?;
        Ok(done.succeeded())
    }

    /// Takes the parked sandbox `id` for this node (step 2): its owner record, on
    /// this node's lease. Refused (unreachable) while the node is not registered:
    /// an owner record needs the lease.
    pub async fn take(&self, id: &str) -> Result<Take, FleetError> {
        let Some(lease) = self.registration().lease else {
            return Err(self.unreachable("this node is not registered in the fleet".to_owned()));
        };
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let key = keys.parked_sandbox(id);
        let found = timed("read a parked record", client.get(key.clone(), None))
            .await
            .map_err(|why| self.unreachable(why))?;
        let Some(kv) = found.kvs().first() else {
            return Ok(Take::NotParked);
        };
        let record = ParkedRecord::decode(&key, kv.value())?;
        // The durable record too, with the token's digest: a caller with the token
        // who asks another node meanwhile is told where it is, not refused.
        let durable = SandboxRecord {
            node_id: self.node_id().to_owned(),
            template: record.template.clone(),
            created_unix: record.created_unix,
            token_sha256: record.token_sha256.clone(),
        };
        let take = Txn::new()
            .when([
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
                Compare::version(keys.owner(id), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    keys.owner(id),
                    self.node_id(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(keys.sandbox(id), durable.encode(), None),
            ])
            .or_else([TxnOp::get(keys.owner(id), None)]);
        let done = timed("take a parked sandbox", client.txn(take))
            .await
            .map_err(|why| self.unreachable(why))?;
        if done.succeeded() {
            return Ok(Take::Taken(record));
        }
        let owner = done.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        });
        Ok(owner.map_or(Take::NotParked, Take::TakenBy))
    }

    /// Ends the move of sandbox `id` to this node (step 3): its parked record goes
    /// and its durable record is `durable`. False when this node no longer owns it
    /// (its lease expired meanwhile).
    pub async fn settle(&self, id: &str, durable: &SandboxRecord) -> Result<bool, FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let me = self.node_id().as_bytes().to_vec();
        let settle = Txn::new()
            .when([Compare::value(keys.owner(id), CompareOp::Equal, me)])
            .and_then([
                TxnOp::delete(keys.parked_sandbox(id), None),
                TxnOp::put(keys.sandbox(id), durable.encode(), None),
            ]);
        let done = timed("settle a taken sandbox", client.txn(settle))
            .await
            .map_err(|why| self.unreachable(why))?;
        Ok(done.succeeded())
    }

    /// Gives the taken sandbox `id` back to the fleet (its parked record was kept):
    /// this node's owner and durable records go. Harmless when this node did not
    /// take it (a take whose answer was lost calls it to be sure).
    pub async fn untake(&self, id: &str) -> Result<(), FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let me = self.node_id().as_bytes().to_vec();
        let untake = Txn::new()
            .when([
                Compare::value(keys.owner(id), CompareOp::Equal, me),
                Compare::version(keys.parked_sandbox(id), CompareOp::Greater, 0),
            ])
            .and_then([
                TxnOp::delete(keys.owner(id), None),
                TxnOp::delete(keys.sandbox(id), None),
            ]);
        timed("give back a taken sandbox", client.txn(untake))
            .await
            .map(|_| ())
            .map_err(|why| self.unreachable(why))
    }

    /// Removes the parked sandbox `id` for good (released while parked). False when
    /// it was not parked or a node took it meanwhile.
    pub async fn drop_parked(&self, id: &str) -> Result<bool, FleetError> {
        let mut client = self.client().await?;
        let keys = &self.shared.keys;
        let drop = Txn::new()
            .when([
                Compare::version(keys.parked_sandbox(id), CompareOp::Greater, 0),
                Compare::version(keys.owner(id), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::delete(keys.parked_sandbox(id), None),
                TxnOp::delete(keys.sandbox(id), None),
            ]);
        let done = timed("remove a parked sandbox", client.txn(drop))
            .await
            .map_err(|why| self.unreachable(why))?;
        Ok(done.succeeded())
    }
}
