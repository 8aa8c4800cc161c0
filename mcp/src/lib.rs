//! `sandbox-mcp`: a Model Context Protocol server (stdio) that exposes microVM
//! sandboxes as tools, so MCP clients (Claude Code, Cursor, agent frameworks) can
//! claim a VM, run commands and move files in it, and throw it away.
//!
//! # How data flows
//! The client speaks JSON-RPC on stdin/stdout; logs go to stderr only. `rmcp` routes
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
//! the session; [`run`] destroys every VM when the client disconnects (stdin EOF) or
//! the shutdown signal fires, and every VM handle kills its VM on drop as a backstop.
//!
//! # Layout
//! - [`config`]: command-line arguments and environment fallbacks → [`config::Config`].
//! - [`node`]: where sandboxes come from; `create_sandbox`, `release`, `node_info`.
//! - [`pool`]: capacity (a semaphore), cold boots and the warm pool's refiller, behind
//!   a `VmFactory` seam; [`pool::launcher`] is the real factory (QEMU via the launcher).
//! - [`registry`]: the session's sandboxes by id, TTL timers, tombstones.
//! - [`sandbox`]: one sandbox: its agent connection and its VM lease.
//! - [`util`]: a lock that survives poisoning, `join_all`, milliseconds.
//! - [`tools`]: the MCP server and its tools; the per-call cap.
//! - [`exec`]: the streamed exec behind the `exec` tool (partial output on cut-off).
//! - [`params`], [`render`], [`error`]: tool inputs, outputs and failures.

pub mod config;
pub mod error;
pub mod exec;
pub mod node;
pub mod params;
pub mod pool;
pub mod registry;
pub mod render;
pub mod sandbox;
pub mod tools;
pub mod util;

use std::future::Future;

use rmcp::ServiceExt;

pub use config::{Args, Config};

/// Why the server stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP handshake on stdio failed.
    #[error("MCP initialization failed")]
    Initialize(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The service task failed.
    #[error("The MCP service stopped unexpectedly")]
    Service(#[source] tokio::task::JoinError),
}

/// Serves MCP on stdin/stdout until the client disconnects or `shutdown` resolves,
/// then destroys every sandbox and warm VM.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let node = node::Node::start(config).await;
    let server = tools::SandboxServer::new(node.clone());
    tokio::pin!(shutdown);
    let result = tokio::select! {
        service = server.serve(rmcp::transport::stdio_pipes()) => match service {
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
                    () = &mut shutdown => {
                        tracing::info!("shutdown signal");
                        cancel.cancel();
                        Ok(())
                    }
                }
            }
            Err(error) => Err(ServeError::Initialize(Box::new(error))),
        },
        () = &mut shutdown => {
            tracing::info!("shutdown signal before the client initialized");
            Ok(())
        }
    };
    node.shutdown().await;
    result
}
