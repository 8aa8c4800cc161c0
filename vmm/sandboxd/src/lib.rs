//! `sandboxd`: the node daemon. One sandbox engine (`sandbox-engine`) per host,
//! shared by every client, over HTTP or HTTPS: a REST/JSON control plane in seed 000's shape (claims,
//! sandboxes, checkpoints, the node) and a data plane that upgrades an HTTP
//! connection to a sandbox's agent protocol.
//!
//! # How data flows
//! [`server`] accepts TCP connections and serves HTTP/1.1 on each; the [`api`]
//! router checks the caller's token ([`auth`]), turns the request into an engine
//! call, and the answer into JSON (or an [`api::ApiError`] with a status). An
//! upgraded connection is spliced to the sandbox's agent socket after its `Hello`
//! has been given the VM's token. The warm pool, capacity and deadlines are the
//! engine's, one for all clients.
//!
//! # Lifetime
//! VMs belong to the node, not to the daemon's process: they are booted detached,
//! each with its record in its run folder (`sandbox_engine::record`). SIGTERM or
//! SIGINT stops the warm pool's VMs and leaves claimed sandboxes running (or
//! hibernated); a daemon killed outright leaves both. The next start on the same
//! run folders re-adopts the claimed ones and stops the warm ones
//! (`sandbox_engine::adopt`). `sandboxd stop-all` ([`stop_all`]) stops everything.
//! One daemon per run root ([`node_lock`]).
//!
//! # Layout
//! - [`config`]: command line → [`Config`].
//! - [`fleet`]: membership in a fleet on etcd (`--etcd`).
//! - [`store`]: checkpoints in an S3-compatible object store (`--store`).
//! - [`placement`]: which node of the fleet a claim sent here lands on.
//! - [`auth`]: the operator token and the callers it tells apart.
//! - [`api`]: routes, handlers, the error mapping.
//! - [`metrics`]: counters for `/metrics`.
//! - [`preview`]: preview URLs, unguessable links that reach a guest port.
//! - [`server`]: the accept loop and its bounds.
//! - [`tls`]: HTTPS from a certificate and key.
//! - [`node_lock`]: one daemon per run root.
//! - [`stop_all`]: `sandboxd stop-all`.
//! - [`silkd`]: seed 000's agent relay protocol (`Upgrade: silkd`), translated to our agent's.

pub mod api;
pub mod auth;
pub mod config;
pub mod fleet;
pub mod flights;
pub mod metrics;
pub mod node_lock;
pub mod parking;
pub mod placement;
pub mod preview;
pub mod server;
pub mod silkd;
pub mod stop_all;
pub mod store;
pub mod tls;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;

pub use config::{Args, Config};

/// Serves the node until `shutdown` resolves, then stops the warm VMs and leaves
/// the claimed sandboxes for the next start; or runs `config`'s one-off command.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if config.command == Some(config::Command::StopAll) {
        let stopped = stop_all::stop_all(config.mode).await?;
        println!(
            "sandboxd stop-all: stopped {} VMs{}",
            stopped.vms,
            if stopped.skipped > 0 {
                format!(
                    "; {} run folders with unreadable records left (see the log)",
                    stopped.skipped
                )
            } else {
                String::new()
            }
        );
        return Ok(());
    }
    let launcher = match &config.mode {
        sandbox_engine::config::Mode::Launch(launch) => Some(launch.launcher.clone()),
        sandbox_engine::config::Mode::Attach(_) => None,
    };
    let run_root = launcher.as_ref().map(|l| l.run_root.clone());
    let _lock = run_root
        .as_deref()
        .map(node_lock::NodeLock::acquire)
        .transpose()?;
    let operator = auth::OperatorToken::load(&config.token_file, config.token_file_is_default)?;
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("Cannot listen on {}", config.listen))?;
    let local = listener.local_addr()?;
    let node = sandbox_engine::Node::start(config.mode).await;
    // Listening on port 0: the port bound, with the scheme the address had.
    let advertise = match config.advertise.strip_suffix(":0") {
        Some(_) if config.advertise.starts_with("https://") => format!("https://{local}"),
        Some(_) => local.to_string(),
        None => config.advertise,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let preview_base = if advertise.contains("://") {
        advertise.clone()
    } else {
        format!("{scheme}://{advertise}")
    };
    let previews = Arc::new(preview::Previews::new(preview_base));
    let membership = config
        .fleet
        .as_ref()
        .map(|fleet| {
            fleet::join(
                fleet,
                node.clone(),
                advertise.clone(),
                config.store.is_some(),
            )
        })
        .transpose()?;
    let store = match (&config.store, &launcher) {
        (Some(store), Some(launcher)) => {
            let client =
                sandbox_fleet::store::CheckpointStore::new(store).context("Cannot use --store")?;
            let node_id = membership
                .as_ref()
                .map_or_else(|| advertise.clone(), |m| m.node_id().to_owned());
            tracing::info!(store = %client.name(), "checkpoints go to the object store");
            Some(Arc::new(store::NodeStore::new(
                client,
                membership.clone(),
                node_id,
                launcher,
            )))
        }
        _ => None,
    };
    let state = api::AppState {
        store,
        node: node.clone(),
        operator,
        advertise,
        metrics: Arc::new(metrics::Metrics::default()),
        previews,
        membership: membership.clone(),
        takes: Arc::default(),
    };
    tracing::info!(addr = %local, scheme, token_file = %config.token_file.display(), "sandboxd listening");
    // The test harness and scripts read this line to learn the port.
    println!("sandboxd listening on {local}");
    server::serve(listener, tls, api::router(state), shutdown).await;
    tracing::info!(
        "shutting down: warm VMs stop; claimed sandboxes keep running for the next start \
         (`sandboxd stop-all` stops them)"
    );
    if let Some(membership) = &membership {
        membership.leave().await;
    }
    node.leave().await;
    Ok(())
}
