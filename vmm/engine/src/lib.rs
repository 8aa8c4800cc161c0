//! `sandbox-engine`: the host's sandbox engine, one library that every front end
//! drives: the MCP server (`sandbox-mcp`), the node daemon (`sandboxd`) and the CLI.
//!
//! # How data flows
//! A front end turns its input (MCP tool arguments, an HTTP request, a command line)
//! into a call on the [`Node`]: [`Node::create`] with a [`node::ClaimRequest`],
//! [`Node::release`], [`Node::renew`], [`Node::fork`], [`Node::checkpoint`],
//! [`Node::branch`], [`Node::hibernate`], [`Node::promote`], [`Node::status`], ...
//! The node takes VMs from the [`pool`] (a warm pool of booted VMs of the default
//! template and size, refilled in the background, or a cold boot, all within the
//! node's capacity), registers each as a [`sandbox::Sandbox`] in the [`registry`]
//! with a deadline and a [`token::SandboxToken`], and drives the launcher
//! (`sandbox_vmm::launcher`) for snapshots through the [`snapshot::SnapshotHost`].
//! Each operation answers with a domain value (a sandbox, [`node::Claimed`],
//! [`snapshot::ops::Forked`], ...) or its own error enum ([`error`]); what a failure
//! means to a user (an MCP hint, an HTTP status, an exit code) is the front end's.
//!
//! # Layout
//! - [`config`]: what a node runs on ([`config::Mode`]) and its limits.
//! - [`node`]: [`Node`]: claims, release, renew, drain, status, templates, egress.
//! - [`batch`]: many claims at once, all or none; pings.
//! - [`snapshot`]: the snapshot host and operations (fork, checkpoint, branch,
//!   hibernate, promote, the checkpoint store).
//! - [`pool`]: capacity (a semaphore), cold boots and the warm pool's refiller, behind
//!   a `VmFactory` seam; [`pool::launcher`] is the real factory (QEMU via the launcher).
//! - [`record`]: the engine's record of each VM on disk (`sandbox.json` in its run
//!   folder): holder, and the claim (id, token, deadline, lineage) a restarted node
//!   re-adopts it with.
//! - [`adopt`]: a node daemon's start: re-adopts the claimed VMs its earlier life
//!   left, stops its warm ones, cleans up the dead.
//! - [`registry`]: the live sandboxes by id, TTL timers, tombstones.
//! - [`sandbox`]: one sandbox: its agent connection and its VM (running or
//!   hibernated).
//! - [`token`]: the per-sandbox token.
//! - [`image_build`]: claims by image reference: the template built once from an
//!   allowed registry (`sandbox-rootfs build`), concurrent claims waiting for it.
//! - [`error`]: one error enum per operation.
//! - [`util`]: a lock that survives poisoning, `join_all`, milliseconds.

pub mod adopt;
pub mod batch;
pub mod config;
pub mod error;
pub mod image_build;
pub mod moving;
pub mod node;
pub mod pool;
pub mod record;
pub mod registry;
pub mod sandbox;
pub mod snapshot;
pub mod token;
pub mod util;

pub use node::Node;
