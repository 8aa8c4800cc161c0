//! Seed 000's agent relay protocol ("silkd") on this node: `GET
//! /v1/sandboxes/{id}/agent` with `Upgrade: silkd` turns the connection into
//! newline-delimited JSON frames, which this module serves by calling the sandbox's
//! agent through this project's client. Seed 000's SDKs then drive our microVMs
//! with no change but the address.
//!
//! # How data flows
//! [`conn::serve`] reads one request line at a time ([`frames`]), runs the op
//! against a [`sandbox_vmm::client::Client`] (fetched per op, so a sandbox
//! hibernated between two requests wakes for the second), writes the reply
//! frames, and reads the next request: every connection is keep-alive (`info`
//! says proto 2). A request that fails answers one `error` frame with a `kind`
//! the SDK knows (`bad_request`, `not_found`, `unimplemented`, `internal`) and
//! the connection serves on; only a broken stream (a frame over the cap, a cut
//! line, the peer gone) ends it.
//!
//! # Layout
//! - `frames`: the wire types, the parser, the capped line reader.
//! - `conn`: the per-connection loop and dispatch.
//! - `exec`: `exec` (with stdin, detach, session), `ps`, `kill`, `logs`, `attach`.
//! - `files`: `fs_write`, `fs_read`, `fs_list`, `fs_stat`, `fs_mkdir`, `fs_rm`, `fs_rename`.
//! - `tree`: `fs_push` / `fs_pull` tar streams (tar runs in the guest).
//! - `search`: `fs_find` / `fs_replace` (Rust regexes, evaluated on the node).
//! - `watch`: `fs_watch`.
//! - `sessions`: persistent shells over the agent's `sh` eval sessions.
//! - `pty`: `pty_open`, `pty_resize`.
//! - `ports`: `port_forward`.

pub mod conn;
mod exec;
mod files;
pub mod frames;
mod ports;
mod pty;
mod search;
mod sessions;
mod tree;
mod watch;

use std::future::Future;

use sandbox_vmm::client::{Client, ClientError};
use serde::Serialize;

pub use conn::serve;

/// The `Upgrade` token seed 000's clients send.
pub const SILKD_UPGRADE: &str = "silkd";

/// The largest line either side sends (seed 000's cap, which the SDK enforces too).
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// `info`'s `proto`: 2 means requests are served back to back on one connection.
pub const KEEP_ALIVE_PROTO: u32 = 2;

/// Bytes per outgoing `data` frame (1 MiB, still well under the cap in base64).
pub const DATA_CHUNK_BYTES: usize = 1 << 20;

/// The most `stdin` an `exec` buffers before it starts: our agent takes an exec's
/// stdin whole, so the translator holds it until `stdin_close`.
pub const EXEC_STDIN_CAP_BYTES: usize = 16 * 1024 * 1024;

/// The typed `kind` of an `error` frame, as the SDK spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    BadRequest,
    NotFound,
    Unimplemented,
    Internal,
}

/// Why an op failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// Answered with an `error` frame; the connection serves on.
    #[error("{message}")]
    Reply { kind: ErrorKind, message: String },
    /// The client's side of the connection broke: nothing more can be said.
    #[error("The client connection broke")]
    Client(#[source] std::io::Error),
    /// The client broke the framing (a frame over the cap, a cut line): answered
    /// with an `error` frame, then the connection ends.
    #[error("{0}")]
    Framing(#[from] frames::ReadError),
}

impl OpError {
    pub fn reply(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Reply {
            kind,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::reply(ErrorKind::BadRequest, message)
    }

    /// The agent's (or the link's) failure of `what`, with the agent's kind mapped
    /// to the nearest silkd kind.
    pub fn agent(what: &str, error: &ClientError) -> Self {
        use sandbox_protocol::ErrorKind as Wire;
        let kind = match error.wire_kind() {
            Some(Wire::NotFound | Wire::NotListening) => ErrorKind::NotFound,
            Some(Wire::Unsupported) => ErrorKind::Unimplemented,
            Some(
                Wire::BadRequest
                | Wire::TooLarge
                | Wire::WrongType
                | Wire::AlreadyExists
                | Wire::PermissionDenied,
            ) => ErrorKind::BadRequest,
            _ => ErrorKind::Internal,
        };
        Self::reply(kind, format!("{what}: {}", sandbox_vmm::error_chain(error)))
    }
}

/// Where a connection gets its agent client: the seam between the translator and
/// the engine, so the framing can be tested without a VM.
pub trait AgentSource: Send + Sync {
    /// A connected client, waking the sandbox if it is hibernated.
    fn client(&self) -> impl Future<Output = Result<Client, OpError>> + Send;
}

impl AgentSource for sandbox_engine::sandbox::Sandbox {
    async fn client(&self) -> Result<Client, OpError> {
        sandbox_engine::sandbox::Sandbox::client(self)
            .await
            .map_err(|error| {
                OpError::reply(
                    ErrorKind::Internal,
                    format!(
                        "The sandbox's agent cannot be reached: {}",
                        sandbox_vmm::error_chain(&error)
                    ),
                )
            })
    }
}
