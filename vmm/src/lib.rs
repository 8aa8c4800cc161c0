//! The host side of the sandbox: an async client for the in-guest agent, and the
//! launcher that boots the microVMs it runs in. Front ends build on it: the
//! `sandboxctl` command line (its own crate, `vmm/sandboxctl/`) and the MCP server.
//! Neither argument parsing, nor printing, nor exit codes live here.
//!
//! # How data flows
//! A front end (or any tokio program) opens a [`client::Client`] on an agent URL;
//! the client dials the socket, says `Hello`, then multiplexes every request over that
//! one byte stream: a writer task sends frames, a reader task routes the agent's
//! frames to the request they answer by id. Streaming requests (a live exec, a log
//! follow, a terminal) hand back a stream of events that ends with the final reply.
//! The launcher boots a template into a VM whose agent URL it hands back; it reports
//! what goes wrong while cleaning up as `tracing` events, for the front end's
//! subscriber to show.
//!
//! # Layout
//! - [`client`]: URLs and dialing (`connect`, `hvsock`), the handshake, the
//!   demultiplexer (`mux`), request handles (`stream`) and [`client::ClientError`].
//! - [`launcher`]: boots and stops the microVMs the agent runs in.
//! - [`egress`]: `net: egress` on the host: the allowlist, dialling for the guest,
//!   and the per-VM egress log.
//! - `node_api`: a node daemon's control plane, its JSON shapes and client.
//! - [`splice`]: a node daemon's data plane, server side: an upgraded HTTP
//!   connection joined to a local agent (its client side is [`client::node`]).
//! - [`relay`]: the per-VM host end of a snapshot-capable VM's one agent stream,
//!   serving many clients as channels of the link (binary `sandbox-relay`).

pub mod client;
pub mod egress;
pub mod launcher;
#[cfg(feature = "node")]
pub mod node_api;
pub mod relay;
pub mod splice;

pub use client::{Client, ClientError, ConnectOptions};

/// An error and its sources on one line, `error: cause: cause`, for logs and
/// messages that cannot be multi-line. A transparent wrapper's repeat of its source's
/// message is printed once.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
