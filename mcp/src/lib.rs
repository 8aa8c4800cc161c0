//! `sandbox-mcp`: a Model Context Protocol server (stdio) that exposes microVM
//! sandboxes as tools, so MCP clients (Claude Code, Cursor, agent frameworks) can
//! claim a VM, run commands and move files in it, and throw it away.
//!
//! # How data flows
//! The client speaks JSON-RPC on stdin/stdout, one message per line; logs go to
//! stderr only. `--profile` picks the tool set: this project's (the default), or
//! sandstorm-mcp's ([`sandstorm`]); both run on everything below. The [`stdio`] front reads stdin first: it answers what `rmcp` would
//! drop without a word (a line over [`stdio::MAX_LINE_BYTES`], invalid JSON, JSON
//! that is no JSON-RPC message) with JSON-RPC errors, hands every valid line to
//! `rmcp` through an in-memory pipe, and is the one writer of stdout. `rmcp` routes
//! each `tools/call` to a method of [`tools::SandboxServer`], which checks its
//! arguments, looks the sandbox up in the [`registry`], and calls the sandbox's agent
//! through the `sandbox-vmm` client over the VM's hybrid vsock (or the attached
//! agent's socket). The answer becomes structured JSON plus a text rendering
//! ([`render`]); ordinary failures become `isError` results that say what to do next
//! ([`error`]).
//!
//! Sandboxes come from the [`pool`]: a warm pool of booted VMs of the default
//! template and size (claims in milliseconds), refilled in the background, or a cold
//! boot for anything else, all within `--max-sandboxes`. In attach mode one existing
//! agent is the only sandbox. Each claim lives until `release`, its TTL, or the end of
//! the session; [`run`] destroys every VM when the client disconnects (stdin EOF, seen
//! by the front, cancels `rmcp` without waiting for calls in flight) or the shutdown
//! signal fires, and every VM handle kills its VM on drop as a backstop.
//!
//! # Layout
//! - [`stdio`]: the line filter between stdin/stdout and `rmcp`: the line cap, error
//!   replies ([`stdio::line`]), the streaming id scan of oversize lines
//!   ([`stdio::scan`]), the single stdout writer.
//! - [`config`]: command-line arguments and environment fallbacks → [`config::Config`];
//!   [`config::node`]: the node address and the two seeds' spellings and variables.
//! - [`ports`]: `expose_port`, a URL for a server inside a sandbox (a node's preview
//!   link, or a local listener).
//! - [`backend`]: the seam the tools call: the embedded engine, or a node daemon
//!   (`sandboxd`) over its control and data planes, with this session's claims.
//! - [`node`]: where sandboxes come from; `create_sandbox`, `release`, `node_info`.
//! - [`pool`]: capacity (a semaphore), cold boots and the warm pool's refiller, behind
//!   a `VmFactory` seam; [`pool::launcher`] is the real factory (QEMU via the launcher).
//! - [`registry`]: the session's sandboxes by id, TTL timers, tombstones.
//! - [`sandbox`]: one sandbox: its agent connection and its VM (running or
//!   hibernated).
//! - [`util`]: a lock that survives poisoning, `join_all`, milliseconds.
//! - [`tools`]: the MCP server and its tools; the per-call cap; which routers a
//!   profile offers.
//! - [`snapshot`]: the snapshot tools (fork, checkpoint, branch, hibernate, promote)
//!   and what hibernates and wakes sandboxes.
//! - [`host`]: copies between the host and sandboxes, under `--host-dir`s only.
//! - [`logging`]: the server's warnings as MCP log messages to the client.
//! - [`fleet`]: many sandboxes in one claim (`create_sandboxes`, over
//!   `pool::Pool::claim_many`), listing, describing and pinging them, the templates.
//! - [`sandstorm`]: `--profile sandstorm`, seed 001's tools and per-sandbox tokens on
//!   the same engine (the fleet's batches, the snapshot operations).
//! - [`token`]: the per-sandbox token.
//! - [`exec`]: the streamed exec behind the `exec` tool (partial output on cut-off).
//! - [`eval`]: `eval_code`'s checks and result.
//! - [`processes`]: `ps`, `logs` and `kill`.
//! - [`files`]: `read_file` in parts, as text, base64 or an image; `write_file`,
//!   whole or in parts through [`upload`] (one streamed `put` across the calls).
//! - [`output`]: results sized for a model: head/tail cuts, what the text repeats.
//! - [`progress`]: progress notifications while a call runs.
//! - [`schema`]: standard JSON Schema formats in every tool's schemas.
//! - [`params`], [`render`], [`error`]: tool inputs, outputs and failures.

pub mod backend;
pub mod config;
pub mod error;
pub mod eval;
pub mod exec;
pub mod files;
pub mod fleet;
pub mod host;
pub mod logging;
pub mod output;
pub mod params;
pub mod ports;
pub mod processes;
pub mod progress;
pub mod render;
pub mod sandstorm;
pub mod schema;
pub mod snapshot;
pub mod stdio;
pub mod tools;
pub mod upload;

use std::future::Future;

use rmcp::ServiceExt;

pub use config::{Args, Config};

/// Why the server stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP handshake on stdio failed.
    #[error("MCP initialization failed")]
    Initialize(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The node daemon's address cannot be used.
    #[error("Cannot use the node daemon's address")]
    Node(#[source] Box<sandbox_vmm::node_api::NodeApiError>),
    /// The service task failed.
    #[error("The MCP service stopped unexpectedly")]
    Service(#[source] tokio::task::JoinError),
}

/// Serves MCP on stdin/stdout until the client disconnects or `shutdown` resolves,
/// then destroys every sandbox and warm VM. The server's log events reach the
/// client through `log`, whose layer the caller put in its `tracing` subscriber.
///
/// A closed stdin means the client is gone (it exited, or was killed: its end of
/// the pipe closes either way), so nobody will read the answers of calls still in
/// flight. rmcp, left to notice by itself, gives those calls up to 5 s to finish
/// (and an `exec` runs up to 5 minutes); here the service is cancelled and the VMs
/// destroyed at once, which also ends those calls.
pub async fn run(
    config: Config,
    log: logging::ClientLog,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let profile = config.profile;
    let host = config.host.clone();
    let ended = backend::Ended::new(config.home.as_deref());
    let node = match config.backing {
        config::Backing::Embedded(mode) => {
            backend::Backend::embedded(sandbox_engine::Node::start(*mode).await, ended)
        }
        config::Backing::Node(node) => {
            let session = backend::node::Session::new(&node, ended.clone())
                .map_err(|error| ServeError::Node(Box::new(error)))?;
            tracing::info!(node = %session.base(), "driving a node daemon");
            backend::Backend::node(session, ended)
        }
    };
    let server = tools::SandboxServer::new(node.clone(), profile, host).with_client_log(log);
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let (mut front, transport) = stdio::Front::start(stdin, stdout);
    tokio::pin!(shutdown);
    let result = tokio::select! {
        service = server.serve(transport) => match service {
            Ok(service) => {
                let cancel = service.cancellation_token();
                tokio::select! {
                    quit = service.waiting() => match quit {
                        Ok(reason) => {
                            tracing::info!(?reason, "client disconnected");
                            Ok(())
                        }
                        Err(error) => Err(ServeError::Service(error)),
                    },
                    () = front.closed() => {
                        tracing::info!("client disconnected (stdin closed)");
                        // Not awaited: the service's drain waits on the calls that
                        // destroying the VMs is about to end.
                        cancel.cancel();
                        Ok(())
                    }
                    () = &mut shutdown => {
                        tracing::info!("shutdown signal");
                        cancel.cancel();
                        Ok(())
                    }
                }
            }
            // The handshake fails when stdin closes first; that is a disconnect.
            Err(_) if front.is_closed() => {
                tracing::info!("client disconnected before it initialized");
                Ok(())
            }
            Err(error) => Err(ServeError::Initialize(Box::new(error))),
        },
        () = front.closed() => {
            tracing::info!("client disconnected before it initialized");
            Ok(())
        }
        () = &mut shutdown => {
            tracing::info!("shutdown signal before the client initialized");
            Ok(())
        }
    };
    node.shutdown().await;
    result
}
