//! A node daemon's control plane (`sandboxd`'s REST API), for both ends: the JSON
//! shapes in [`wire`], and [`NodeApi`], the client the thin front ends use
//! (`sandbox-mcp --addr`, `sandboxctl --node`). The data plane is an agent URL
//! ([`NodeApi::agent_url`]), dialled by [`crate::client`].

mod client;
pub mod wire;

pub use client::{node_base, NodeApi, NodeApiError, DEFAULT_TIMEOUT, MAX_REPLY_BYTES};
