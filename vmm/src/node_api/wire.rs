//! The JSON shapes of a node daemon's control plane, in seed 000's field names, for
//! both ends: `sandboxd` serializes replies and reads requests with them; clients
//! (`sandbox-mcp --addr`, `sandboxctl --node`) do the reverse. Requests refuse unknown
//! fields (a misspelt field is an error, not a default); replies accept them, so an
//! older client reads a newer daemon.

use serde::{Deserialize, Serialize};

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn one() -> u64 {
    1
}

/// `POST /v1/claim`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// A template name; empty for the node's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
    /// `none` (or empty) or `egress`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net: String,
    /// With egress: narrow the operator's allowlist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// A size preset; empty for the template's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    /// Lifetime; 0 for one hour.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_seconds: u64,
    /// The caller's own label for the claim, echoed in listings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_ref: String,
    /// Claim on this node, whatever the fleet's placement says: what a client sends
    /// when it follows a [`ClaimRedirect`] (seed 000's flag). A single node claims
    /// locally anyway.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_redirect: bool,
    /// Seed 000's flag for promoted templates: accepted, changes nothing here.
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_promoted: bool,
    /// Volumes: not offered by this node (refused when non-empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<serde_json::Value>,
    /// Seed 000's clients send it with volumes that are attached but not mounted.
    #[serde(default, skip_serializing_if = "is_false")]
    pub volumes_attach_only: bool,
}

/// A claimed sandbox, as a claim, fork or branch answers it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimReply {
    /// The sandbox's id.
    pub id: String,
    /// Its token: shown once, here.
    pub token: String,
    /// When it is destroyed (RFC 3339, UTC).
    pub deadline: String,
    /// The node that holds it.
    #[serde(default)]
    pub owner_addr: String,
    /// Its template.
    #[serde(default)]
    pub template: String,
    /// Its size.
    #[serde(default)]
    pub size: String,
    /// Whether a warm VM was waiting.
    #[serde(default)]
    pub warm: bool,
    /// How long the claim took.
    #[serde(default)]
    pub claim_ms: u64,
    /// The checkpoint it started from, if it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from_checkpoint: String,
}

/// The answer to a claim that placement sends elsewhere (seed 000's shape, HTTP
/// 200): the nodes to claim on instead, best first. A client re-sends the claim
/// to each in turn with `no_redirect` until one makes it, then to the node it
/// asked first; it follows once (a node asked with `no_redirect` never redirects).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRedirect {
    /// Node addresses (`owner_addr` form), best first.
    pub redirect: Vec<String>,
}

/// What a claim answers: a sandbox, or where to claim it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClaimAnswer {
    /// Claim elsewhere.
    Redirect(ClaimRedirect),
    /// Claimed here.
    Claimed(ClaimReply),
}

/// A sandbox in a listing: never its token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRow {
    /// Its id.
    pub id: String,
    /// What it was claimed as (`template:size`), seed 000's `key`.
    #[serde(default)]
    pub key: String,
    /// Its template.
    #[serde(default)]
    pub template: String,
    /// Its size.
    #[serde(default)]
    pub size: String,
    /// `running`, `hibernated` or `destroyed`.
    #[serde(default)]
    pub status: String,
    /// When it was claimed (RFC 3339).
    #[serde(default)]
    pub claimed_at: String,
    /// When it ends (RFC 3339; empty for none).
    #[serde(default)]
    pub deadline: String,
    /// `template`, `fork:PARENT`, `checkpoint:ID` or `attached`.
    #[serde(default)]
    pub lineage: String,
}

/// `GET /v1/sandboxes`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxList {
    /// What the caller may see.
    pub sandboxes: Vec<SandboxRow>,
}

/// `GET /v1/sandboxes/{id}/owner`: where a sandbox lives (seed 000's lookup).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerReply {
    /// Its id.
    pub id: String,
    /// The node that holds it.
    pub owner_addr: String,
}

/// `GET /v1/sandboxes/{id}/egress-log?tail=N`: the sandbox's egress connections,
/// oldest first, and the operator's allowlist they were checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLogReply {
    /// The sandbox.
    pub id: String,
    /// The node's allowlist (the most any sandbox may reach).
    #[serde(default)]
    pub allowlist: Vec<String>,
    /// The last records of its log.
    #[serde(default)]
    pub records: Vec<crate::egress::EgressRecord>,
}

/// The query of `GET /v1/sandboxes/{id}/egress-log`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressLogQuery {
    /// How many of the last records (default 100, at most 10000).
    #[serde(default)]
    pub tail: Option<usize>,
}

/// `POST /v1/sandboxes/{id}/release`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// Its id.
    pub id: String,
    /// Always true on success.
    pub released: bool,
}

/// The body of the verbs that take nothing but seed 000's in-body token
/// (`hibernate`, `release`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The sandbox's token, as seed 000's clients send it (the bearer does as well).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
}

/// `POST /v1/sandboxes/{id}/renew`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The new lifetime from now; 0 for one hour.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_seconds: u64,
    /// See [`TokenBody::token`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
}

/// The answer to a renew.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// Its id.
    pub id: String,
    /// The new deadline (RFC 3339).
    pub deadline: String,
}

/// `POST /v1/sandboxes/{id}/preview`: a URL on the node that proxies HTTP (and
/// WebSocket upgrades) to a guest port, as seed 000's `preview_url` sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewBody {
    /// See [`TokenBody::token`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// The guest TCP port (on the guest's loopback).
    pub port: u16,
    /// How long the URL works; 0 (or absent): until the claim ends. Never past it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_seconds: u64,
}

/// The answer to a preview.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewReply {
    /// `http(s)://NODE/preview/{secret}/`: anyone holding it reaches the port.
    pub url: String,
    /// The guest port.
    pub port: u16,
    /// When the URL stops working (RFC 3339); empty when the claim has no deadline.
    #[serde(default)]
    pub expires_at: String,
}

/// `POST /v1/sandboxes/{id}/fork`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// See [`TokenBody::token`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// How many children (at least one).
    #[serde(default = "one")]
    pub count: u64,
    /// The children's lifetime; 0 for one hour.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_seconds: u64,
}

impl Default for ForkBody {
    fn default() -> Self {
        Self {
            token: String::new(),
            count: 1,
            ttl_seconds: 0,
        }
    }
}

/// The answer to a fork.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkReply {
    /// The parent's id.
    pub id: String,
    /// The children, each with its own token.
    pub children: Vec<ClaimReply>,
    /// How long the parent was paused.
    #[serde(default)]
    pub pause_ms: u64,
    /// How long the whole fork took.
    #[serde(default)]
    pub fork_ms: u64,
}

/// `POST /v1/sandboxes/{id}/checkpoint`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// See [`TokenBody::token`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// A label for it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Write the whole RAM image, not only the pages that changed since the
    /// sandbox's last kept checkpoint (a node with a store always does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
}

/// A checkpoint, in seed 000's shape (`id`, `name`, `sandbox_id`, `created_at`) and
/// more.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRow {
    /// Its id.
    pub id: String,
    /// Its label.
    #[serde(default)]
    pub name: String,
    /// The sandbox it was taken of.
    #[serde(default)]
    pub sandbox_id: String,
    /// That sandbox's template.
    #[serde(default)]
    pub template: String,
    /// When (RFC 3339).
    #[serde(default)]
    pub created_at: String,
    /// Its files' size.
    #[serde(default)]
    pub bytes_on_disk: u64,
    /// What keeps it from being deleted.
    #[serde(default)]
    pub in_use_by: Vec<String>,
    /// Its manifest is in the node's object store (`--store`): any node of the
    /// fleet can claim from it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stored: bool,
    /// Only in the object store, not on this node: a claim downloads it first.
    #[serde(default, skip_serializing_if = "is_false")]
    pub remote: bool,
}

/// The answer to a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointReply {
    /// What was taken.
    pub checkpoint: CheckpointRow,
    /// How long the sandbox was paused.
    #[serde(default)]
    pub pause_ms: u64,
    /// How long the whole capture took.
    #[serde(default)]
    pub took_ms: u64,
    /// How long its upload to the object store took (`--store`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub upload_ms: u64,
    /// Data bytes of its files (holes excluded, uncompressed), with `--store`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub data_bytes: u64,
    /// Bytes sent to the store (compressed blobs it lacked).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uploaded_bytes: u64,
}

/// `GET /v1/checkpoints`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointList {
    /// Newest first (those only in the object store last).
    pub checkpoints: Vec<CheckpointRow>,
    /// Why the object store could not be listed (the local checkpoints still are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
}

/// `POST /v1/checkpoints/{id}/claim`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointClaimBody {
    /// The new sandbox's lifetime; 0 for one hour.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_seconds: u64,
    /// Claim on this node, whatever placement says (see [`ClaimBody::no_redirect`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_redirect: bool,
}

/// `DELETE /v1/checkpoints/{id}`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointDeleted {
    /// Its id.
    pub id: String,
    /// What its files took.
    #[serde(default)]
    pub freed_bytes: u64,
}

/// The answer to a hibernate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HibernateReply {
    /// Its id.
    pub id: String,
    /// False when it was already hibernated.
    #[serde(default)]
    pub hibernated_now: bool,
    /// Its image's size.
    #[serde(default)]
    pub bytes_on_disk: u64,
    /// Its deadline, which runs on while it sleeps (RFC 3339).
    #[serde(default)]
    pub deadline: String,
    /// Handed to the fleet (this node is draining): another node wakes it.
    #[serde(default)]
    pub parked: bool,
}

/// `POST /v1/sandboxes/{id}/promote`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromoteBody {
    /// See [`TokenBody::token`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// The template's name.
    #[serde(default)]
    pub template: String,
}

/// A template's key, as seed 000's clients read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateKey {
    /// Its name.
    pub template: String,
}

/// The answer to a promote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromoteReply {
    /// What is now claimable.
    pub key: TemplateKey,
    /// Whether an earlier promotion of that name was replaced.
    #[serde(default)]
    pub replaced: bool,
    /// How long the sandbox was paused.
    #[serde(default)]
    pub pause_ms: u64,
    /// How long the whole promotion took.
    #[serde(default)]
    pub took_ms: u64,
    /// `sha256:` over the template's files, as seed 000's clients read it (empty
    /// from a node that does not compute one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content_digest: String,
    /// Published to the fleet's object store (a node with `--store`): any node
    /// claims it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stored: bool,
}

/// `POST /v1/store/gc`: which garbage of the object store to collect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreGcBody {
    /// Spare unnamed blobs younger than this (seconds; 0: a day; at least an hour).
    #[serde(default)]
    pub grace_seconds: u64,
    /// Count only.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/templates/{name}/publish`: a local template put in the object store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplatePublished {
    /// The template.
    pub template: String,
    /// Data bytes of its files (holes excluded, uncompressed).
    #[serde(default)]
    pub data_bytes: u64,
    /// Bytes sent, compressed (blobs the store had are not sent again).
    #[serde(default)]
    pub uploaded_bytes: u64,
    /// How long the upload took.
    #[serde(default)]
    pub upload_ms: u64,
}

/// `DELETE /v1/templates?template=NAME`: the query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateQuery {
    /// The promoted template's name.
    #[serde(default)]
    pub template: String,
    /// Seed 000's key parts: accepted and ignored, since a template here is one
    /// name whatever the claim's net and size.
    #[serde(default)]
    pub net: String,
    /// See `net`.
    #[serde(default)]
    pub size: String,
    /// Seed 000's mesh flag (`1`): accepted, changes nothing on one node.
    #[serde(default)]
    pub no_redirect: String,
}

/// The answer to a template delete.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateDeleted {
    /// Its name.
    pub template: String,
    /// What its files took.
    #[serde(default)]
    pub freed_bytes: u64,
    /// Seed 000's clients follow this to the owner node; empty on one node.
    #[serde(default)]
    pub redirect: Vec<String>,
}

/// The warm pool in [`InfoReply`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRow {
    /// What it keeps warm.
    pub template: String,
    /// In which size.
    #[serde(default)]
    pub size: String,
    /// How many it aims for.
    #[serde(default)]
    pub target: usize,
    /// How many are waiting.
    #[serde(default)]
    pub warm: usize,
    /// How many are booting.
    #[serde(default)]
    pub booting: usize,
    /// Why the last boot failed, if it did.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// A template in [`InfoReply`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRow {
    /// Its name.
    pub name: String,
    /// Whether claims without a template get it.
    #[serde(default)]
    pub default: bool,
    /// Its size, when it has one of its own.
    #[serde(default)]
    pub size: Option<String>,
    /// Whether a promote made it.
    #[serde(default)]
    pub promoted: bool,
    /// Why it cannot be used, if it cannot.
    #[serde(default)]
    pub error: Option<String>,
}

/// Capacity in [`InfoReply`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityRow {
    /// The most VMs (sandboxes and warm) at once.
    pub max_sandboxes: usize,
    /// VMs now.
    #[serde(default)]
    pub vms: usize,
    /// Claimed sandboxes now.
    #[serde(default)]
    pub live_claims: usize,
    /// How many more claims fit.
    #[serde(default)]
    pub claimable: usize,
}

/// `GET /v1/info`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoReply {
    /// The daemon's version.
    pub version: String,
    /// What claims report as `owner_addr`.
    #[serde(default)]
    pub addr: String,
    /// What a claim without a template gets.
    #[serde(default)]
    pub default_template: String,
    /// Whether claims are refused.
    #[serde(default)]
    pub draining: bool,
    /// The warm pool, if there is one.
    #[serde(default)]
    pub pool: Option<PoolRow>,
    /// What can be claimed.
    #[serde(default)]
    pub templates: Vec<TemplateRow>,
    /// Limits and use.
    #[serde(default)]
    pub capacity: CapacityRow,
    /// Claimed sandboxes now (seed 000 reads it at the top).
    #[serde(default)]
    pub live_claims: usize,
    /// Other nodes (none on a single node).
    #[serde(default)]
    pub peers: Vec<String>,
}

/// `POST` / `DELETE /v1/drain`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReply {
    /// Whether claims are now refused.
    pub draining: bool,
    /// Claimed sandboxes still running out.
    #[serde(default)]
    pub live_claims: usize,
    /// Hibernated sandboxes this drain handed to the fleet (a node with an
    /// object store in a fleet): another node wakes each on its next call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parked: Vec<String>,
    /// Those it could not hand over, and why: they stay here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_parked: Vec<NotParked>,
}

/// `POST /v1/drain`: `{"hibernate": true}` also hibernates every running
/// sandbox so that it can be handed to the fleet (the node empties itself).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainBody {
    /// Hibernate running sandboxes too.
    #[serde(default)]
    pub hibernate: bool,
}

/// A sandbox a drain could not hand to the fleet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotParked {
    /// Its id.
    pub id: String,
    /// Why.
    pub error: String,
}

/// `GET /v1/peers`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeersReply {
    /// Other nodes' addresses.
    pub peers: Vec<String>,
}

/// Every failure: `{"error": MESSAGE, "code": CODE}`. `error` is a string, as seed
/// 000's clients read it; `code` a stable name to branch on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What happened.
    pub error: String,
    /// A stable name for the failure (`not_found`, `gone`, `unauthorized`, ...).
    #[serde(default)]
    pub code: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_fork_body_is_one_child() {
        let body: ForkBody = serde_json::from_str("{}").unwrap();
        assert_eq!(body, ForkBody::default());
        assert_eq!(body.count, 1);
    }

    #[test]
    fn requests_refuse_unknown_fields_and_replies_ignore_them() {
        assert!(serde_json::from_str::<ClaimBody>(r#"{"templat": "x"}"#).is_err());
        let reply: DrainReply =
            serde_json::from_str(r#"{"draining": true, "new_field": 1}"#).unwrap();
        assert!(reply.draining);
    }

    #[test]
    fn a_default_claim_body_serializes_to_an_empty_object() {
        assert_eq!(serde_json::to_string(&ClaimBody::default()).unwrap(), "{}");
    }

    #[test]
    fn seed_000s_claim_body_parses() {
        let body: ClaimBody = serde_json::from_str(
            r#"{"template": "t", "net": "egress", "size": "small", "ttl_seconds": 60,
                "claim_ref": "r", "no_redirect": true}"#,
        )
        .unwrap();
        assert_eq!(body.template, "t");
        assert_eq!(body.ttl_seconds, 60);
    }

    #[test]
    fn a_claim_answer_is_a_sandbox_or_a_redirect() {
        let claimed: ClaimAnswer = serde_json::from_str(
            r#"{"id": "sb-1", "token": "t", "deadline": "", "owner_addr": "10.0.0.5:7777"}"#,
        )
        .unwrap();
        assert!(matches!(claimed, ClaimAnswer::Claimed(reply) if reply.id == "sb-1"));
        let redirect: ClaimAnswer =
            serde_json::from_str(r#"{"redirect": ["10.0.0.6:7777", "10.0.0.7:7777"]}"#).unwrap();
        assert_eq!(
            redirect,
            ClaimAnswer::Redirect(ClaimRedirect {
                redirect: vec!["10.0.0.6:7777".into(), "10.0.0.7:7777".into()]
            })
        );
        assert!(serde_json::from_str::<ClaimAnswer>(r#"{"id": 3}"#).is_err());
    }
}
