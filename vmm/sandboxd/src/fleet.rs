//! Joins the fleet (`--etcd`): the node's id, what it publishes, and the
//! membership task (`sandbox_fleet::membership`). The engine knows nothing of etcd:
//! the membership reads the node's status at each refresh, and handlers that
//! change it (drain, claim, release) ask for an early refresh.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use anyhow::Context as _;
use sandbox_engine::Node;
use sandbox_fleet::membership::record::MAX_LISTED_CHECKPOINTS;
use sandbox_fleet::membership::{
    token_sha256, LocalSandbox, LocalState, Membership, MembershipConfig, NodeRecord,
};

use crate::config::FleetConfig;

/// Starts the membership of `node`, reachable at `advertise`; `store`: whether it
/// keeps checkpoints in an object store (`--store`).
pub fn join(
    config: &FleetConfig,
    node: Arc<Node>,
    advertise: String,
    store: bool,
) -> anyhow::Result<Membership> {
    let node_id = match &config.node_id {
        Some(id) => id.clone(),
        None => kept_node_id(&config.node_id_file)?,
    };
    let machine = std::env::consts::ARCH.to_owned();
    let qemu = qemu_version(&machine);
    let source = Arc::new(move || local_state(&node, &advertise, &qemu, &machine, store));
    tracing::info!(node = %node_id, etcd = %config.endpoints.join(","), "joining the fleet");
    Ok(Membership::start(
        MembershipConfig {
            endpoints: config.endpoints.clone(),
            prefix: config.prefix.clone(),
            node_id,
            ttl: config.ttl,
        },
        source,
    ))
}

/// The node id kept in `file`, made (random, 16 hex digits) when missing.
fn kept_node_id(file: &Path) -> anyhow::Result<String> {
    if let Ok(text) = std::fs::read_to_string(file) {
        let id = text.trim();
        if !id.is_empty() {
            return Ok(id.to_owned());
        }
    }
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .context("Cannot read /dev/urandom for a node id")?;
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("Cannot create {}", dir.display()))?;
    }
    let mut out = std::fs::File::create(file)
        .with_context(|| format!("Cannot write the node id to {}", file.display()))?;
    writeln!(out, "{id}").with_context(|| format!("Cannot write {}", file.display()))?;
    Ok(id)
}

/// The first line of `qemu-system-ARCH --version`, or empty.
fn qemu_version(machine: &str) -> String {
    std::process::Command::new(format!("qemu-system-{machine}"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// The checkpoints `node` holds, newest first, at most [`MAX_LISTED_CHECKPOINTS`]:
/// each one's id, and its name when it has one (claims name either).
fn held_checkpoints(node: &Node) -> Vec<String> {
    let mut entries = match node.list_checkpoints() {
        Ok(entries) => entries,
        Err(error) => {
            tracing::debug!(error = %error, "cannot list checkpoints for the node record");
            return Vec::new();
        }
    };
    entries.sort_by_key(|entry| std::cmp::Reverse(entry.manifest.created_at_unix_ms));
    entries
        .into_iter()
        .take(MAX_LISTED_CHECKPOINTS)
        .flat_map(|entry| [Some(entry.manifest.id), entry.manifest.name])
        .flatten()
        .collect()
}

/// What placement weighs of a node: its slots, the sandboxes it holds (claims and
/// attached agents alike), and whether it drains. Published in its record, and read
/// live by the node itself when it places a claim (see `placement`).
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// `--max-sandboxes` (one in attach mode).
    pub capacity: usize,
    /// Sandboxes held now.
    pub used: usize,
    /// Refusing claims.
    pub draining: bool,
}

/// `node`'s [`Load`] now, as its status reports it.
pub fn load_of(node: &Node) -> Load {
    Load {
        capacity: node.pool().map_or(1, |pool| pool.max()),
        used: node.registry().list().len(),
        draining: node.is_draining(),
    }
}

fn local_state(node: &Node, advertise: &str, qemu: &str, machine: &str, store: bool) -> LocalState {
    let status = node.status();
    let load = load_of(node);
    let mut warm = BTreeMap::new();
    if let Some(pool) = &status.pool {
        warm.insert(pool.template.clone(), pool.warm);
    }
    // Attached agents are no claims; every other sandbox has its durable record.
    let sandboxes = node
        .registry()
        .list()
        .iter()
        .filter(|sandbox| !sandbox.is_attached())
        .map(|sandbox| {
            let created = sandbox
                .claimed_at
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let local = LocalSandbox {
                template: sandbox.template.clone(),
                created_unix: created,
                token_sha256: token_sha256(sandbox.token.reveal()),
            };
            (sandbox.id.as_str().to_owned(), local)
        })
        .collect();
    LocalState {
        record: NodeRecord {
            addr: advertise.to_owned(),
            capacity: load.capacity,
            used: load.used,
            warm,
            // Only those that load: a claim placed here must be able to boot.
            templates: status
                .templates
                .into_iter()
                .filter(|t| t.error.is_none())
                .map(|t| t.name)
                .collect(),
            checkpoints: held_checkpoints(node),
            store,
            draining: load.draining,
            qemu: qemu.to_owned(),
            machine: machine.to_owned(),
            ..NodeRecord::default()
        },
        sandboxes,
    }
}
