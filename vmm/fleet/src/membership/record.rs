//! What one node publishes, where in etcd, and the lost rule.
//!
//! Keys under the prefix `P` (default `/sandbox`):
//! - `P/nodes/<node id>` → [`NodeRecord`] (JSON), on the node's lease.
//! - `P/owners/<sandbox id>` → the owning node's id, on the same lease.
//! - `P/sandboxes/<sandbox id>` → [`SandboxRecord`] (JSON), no lease: removed on
//!   release. Present without its owner record means the sandbox is lost.
//! - `P/checkpoints/<checkpoint id>` → [`CheckpointRecord`] (JSON), no lease: put
//!   once the checkpoint's manifest is in the object store, removed when it is
//!   deleted fleet-wide.
//! - `P/parked/<sandbox id>` → [`ParkedRecord`] (JSON), no lease: a hibernated
//!   sandbox whose image is in the object store and which no node owns now; the
//!   first node asked for it (with its token) with room takes it, downloads the
//!   image and wakes it (see `super::parked`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One node's published state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's stable id.
    pub id: String,
    /// Where clients reach it.
    pub addr: String,
    /// Most sandboxes it runs.
    pub capacity: usize,
    /// Sandboxes claimed now.
    pub used: usize,
    /// Warm VMs ready, by template.
    #[serde(default)]
    pub warm: BTreeMap<String, usize>,
    /// Templates it can claim.
    #[serde(default)]
    pub templates: Vec<String>,
    /// Checkpoints it holds locally, by id and by name (the newest
    /// [`MAX_LISTED_CHECKPOINTS`]): a claim from one prefers these nodes, and only
    /// they and nodes on an object store can take it.
    #[serde(default)]
    pub checkpoints: Vec<String>,
    /// Whether it keeps checkpoints in an object store (`--store`), so that it can
    /// fetch one it does not hold.
    #[serde(default)]
    pub store: bool,
    /// Whether it refuses claims.
    pub draining: bool,
    /// The host's QEMU (`qemu-system-x86_64 --version` first line), when known.
    #[serde(default)]
    pub qemu: String,
    /// The host's machine type (architecture).
    #[serde(default)]
    pub machine: String,
    /// When the record was written (Unix seconds).
    pub updated_unix: u64,
}

/// The most checkpoints a node record lists: enough for placement to find the
/// holders of those in use, small enough that re-putting the record every second
/// keeps etcd's history small.
pub const MAX_LISTED_CHECKPOINTS: usize = 64;

/// A claimed sandbox's durable record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The node that claimed it.
    pub node_id: String,
    /// Its template.
    pub template: String,
    /// When it was claimed (Unix seconds).
    pub created_unix: u64,
    /// The SHA-256 of its token (see [`token_sha256`]): any node can then tell a
    /// caller with the sandbox's token, and only such a caller, where it is.
    #[serde(default)]
    pub token_sha256: String,
}

/// A checkpoint whose manifest is in the object store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The node that took and uploaded it.
    pub node_id: String,
    /// Its manifest's key in the store (`PREFIX/checkpoints/<id>.json`).
    pub manifest_key: String,
    /// The QEMU version that made it.
    pub qemu_version: String,
    /// The machine type it ran on.
    pub machine: String,
    /// Data bytes of its files (holes excluded, uncompressed).
    pub data_bytes: u64,
    /// When it was stored (Unix seconds).
    pub stored_unix: u64,
}

/// A hibernated sandbox handed to the fleet: its image is in the object store, no
/// node owns it, and any node with room may take it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRecord {
    /// The node that parked it.
    pub node_id: String,
    /// Its image's manifest key in the store (`PREFIX/parked/<id>.json`).
    pub manifest_key: String,
    /// The QEMU version that made the image.
    pub qemu_version: String,
    /// The machine type it ran on.
    pub machine: String,
    /// The SHA-256 (lowercase hex) of the sandbox's token: a node asked for the
    /// sandbox checks the caller's token against it before it takes the sandbox.
    pub token_sha256: String,
    /// Its template.
    pub template: String,
    /// When it was claimed (Unix seconds).
    pub created_unix: u64,
    /// When its claim ends (Unix seconds).
    pub deadline_unix: u64,
    /// Data bytes of the image (holes excluded, uncompressed).
    pub data_bytes: u64,
    /// When it was parked (Unix seconds).
    pub parked_unix: u64,
    /// The hibernation image's name, unique to this park: what tells this park's
    /// record from another's when an answer from etcd was lost.
    #[serde(default)]
    pub image: String,
}

/// The SHA-256 of a sandbox token, lowercase hex: what a [`ParkedRecord`] keeps
/// instead of the token.
pub fn token_sha256(token: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("Undecodable fleet record at {key}")]
pub struct DecodeError {
    /// The key.
    pub key: String,
    #[source]
    source: serde_json::Error,
}

/// The key layout under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (a trailing `/` is dropped).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// `P/nodes/`.
    pub fn nodes(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    /// `P/nodes/<id>`.
    pub fn node(&self, id: &str) -> String {
        format!("{}{id}", self.nodes())
    }

    /// `P/owners/`.
    pub fn owners(&self) -> String {
        format!("{}/owners/", self.prefix)
    }

    /// `P/owners/<sandbox id>`.
    pub fn owner(&self, sandbox: &str) -> String {
        format!("{}{sandbox}", self.owners())
    }

    /// `P/sandboxes/`.
    pub fn sandboxes(&self) -> String {
        format!("{}/sandboxes/", self.prefix)
    }

    /// `P/sandboxes/<sandbox id>`.
    pub fn sandbox(&self, sandbox: &str) -> String {
        format!("{}{sandbox}", self.sandboxes())
    }

    /// `P/checkpoints/`.
    pub fn checkpoints(&self) -> String {
        format!("{}/checkpoints/", self.prefix)
    }

    /// `P/checkpoints/<checkpoint id>`.
    pub fn checkpoint(&self, id: &str) -> String {
        format!("{}{id}", self.checkpoints())
    }

    /// `P/parked/`.
    pub fn parked(&self) -> String {
        format!("{}/parked/", self.prefix)
    }

    /// `P/parked/<sandbox id>`.
    pub fn parked_sandbox(&self, sandbox: &str) -> String {
        format!("{}{sandbox}", self.parked())
    }
}

/// A record kept in etcd as JSON: node and sandbox records alike.
pub trait Stored: Serialize + serde::de::DeserializeOwned {
    /// The record as stored.
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record stored at `key`.
    fn decode(key: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        serde_json::from_slice(bytes).map_err(|source| DecodeError {
            key: key.to_owned(),
            source,
        })
    }
}

impl Stored for NodeRecord {}
impl Stored for SandboxRecord {}
impl Stored for CheckpointRecord {}
impl Stored for ParkedRecord {}

/// A sandbox whose node vanished: its durable record outlived its owner record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostSandbox {
    /// The sandbox's id.
    pub id: String,
    /// What its durable record says.
    #[serde(flatten)]
    pub record: SandboxRecord,
}

/// The lost rule: every durable record (`sandboxes`, by sandbox id) with no owner
/// record (`owners`, by sandbox id).
pub fn lost(
    sandboxes: &BTreeMap<String, SandboxRecord>,
    owners: &BTreeMap<String, String>,
) -> Vec<LostSandbox> {
    sandboxes
        .iter()
        .filter(|(id, _)| !owners.contains_key(*id))
        .map(|(id, record)| LostSandbox {
            id: id.clone(),
            record: record.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_record_round_trips_and_garbage_is_a_typed_error() {
        let record = NodeRecord {
            id: "n1".into(),
            addr: "127.0.0.1:1".into(),
            capacity: 8,
            used: 2,
            warm: BTreeMap::from([("default".into(), 1)]),
            templates: vec!["default".into()],
            checkpoints: vec!["c1".into()],
            store: true,
            draining: true,
            qemu: "QEMU emulator version 7.2".into(),
            machine: "x86_64".into(),
            updated_unix: 5,
        };
        let key = Keys::new("/sandbox/").node("n1");
        assert_eq!(key, "/sandbox/nodes/n1");
        assert_eq!(NodeRecord::decode(&key, &record.encode()).unwrap(), record);
        let error = NodeRecord::decode(&key, b"{nope").unwrap_err();
        assert!(error.to_string().contains("/sandbox/nodes/n1"), "{error}");
    }

    #[test]
    fn a_checkpoint_record_lives_under_its_own_key_and_round_trips() {
        let record = CheckpointRecord {
            node_id: "a".into(),
            manifest_key: "fleet/checkpoints/c1.json".into(),
            qemu_version: "7.2.22".into(),
            machine: "x86_64".into(),
            data_bytes: 70 << 20,
            stored_unix: 9,
        };
        let key = Keys::new("/sandbox").checkpoint("c1");
        assert_eq!(key, "/sandbox/checkpoints/c1");
        assert_eq!(
            CheckpointRecord::decode(&key, &record.encode()).unwrap(),
            record
        );
    }

    #[test]
    fn a_parked_record_keeps_a_digest_of_the_token_not_the_token() {
        let digest = token_sha256("secret-token");
        assert_eq!(digest.len(), 64);
        assert!(digest
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(digest, token_sha256("secret-tokem"));
        let record = ParkedRecord {
            node_id: "a".into(),
            token_sha256: digest.clone(),
            template: "default".into(),
            ..ParkedRecord::default()
        };
        let key = Keys::new("/sandbox").parked_sandbox("s1");
        assert_eq!(key, "/sandbox/parked/s1");
        let text = String::from_utf8(record.encode()).unwrap();
        assert!(
            !text.contains("secret-token") && text.contains(&digest),
            "{text}"
        );
        assert_eq!(ParkedRecord::decode(&key, text.as_bytes()).unwrap(), record);
    }

    #[test]
    fn a_sandbox_without_its_owner_record_is_lost() {
        let record = |node: &str| SandboxRecord {
            node_id: node.into(),
            template: "default".into(),
            created_unix: 1,
            token_sha256: String::new(),
        };
        let sandboxes = BTreeMap::from([
            ("a".to_owned(), record("n1")),
            ("b".to_owned(), record("n2")),
        ]);
        let owners = BTreeMap::from([("a".to_owned(), "n1".to_owned())]);
        let lost = lost(&sandboxes, &owners);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].id, "b");
        assert_eq!(lost[0].record.node_id, "n2");
        assert!(super::lost(
            &sandboxes,
            &sandboxes
                .keys()
                .map(|k| (k.clone(), String::new()))
                .collect()
        )
        .is_empty());
    }
}
