//! `sandbox-agent`: the in-guest agent of a sandbox microVM.
//!
//! It runs as PID 1 inside the VM (and as an ordinary process for development),
//! serves the [`sandbox_protocol`] over vsock or a Unix socket, and keeps one table of
//! every process it started: exec (run to completion), spawn (detached, output in a
//! 256 KiB ring), pty (a terminal that survives disconnects), and the interpreters of
//! `eval` sessions (Python or sh, whose state persists between evaluations).
//!
//! # Layout
//! - [`config`]: command-line arguments into a validated [`config::Config`].
//! - [`server`]: listeners, the accept loop, and per-connection multiplexing
//!   ([`server::connection`]) that routes requests to handlers ([`server::dispatch`]).
//! - [`process`]: the process table, the single reaper, the spawn gate that
//!   serialises child starts (and the OOM unshield around each), confinement in
//!   cgroups ([`process::cgroup`]), the template's defaults for every start
//!   ([`process::defaults`]), and the exec, spawn, pty, logs and kill handlers.
//! - [`image`]: reads the template's config (`/etc/sandbox/image.json`) at start.
//! - [`ring`]: the per-process output ring with absolute offsets.
//! - [`ring_pool`]: the one pool of memory all rings grow from.
//! - [`files`]: atomic whole-file writes, reads, directories, streamed put/get.
//! - [`wait`]: `wait_for_text`, until a file (inotify) or a process's output (its
//!   ring) contains a string.
//! - [`session`]: interpreter sessions (`eval`): Python or sh interpreters whose
//!   state persists between evaluations, with the drivers that run inside them, and
//!   the template's boot sessions, started before the agent listens.
//! - [`machine`]: requests about the whole machine: `resumed` (clock, entropy,
//!   identity after a restore or fork), `reidentify` (a fork child's own hostname
//!   and token) and `shutdown`.
//! - [`port`]: port pipes, a host connection turned into a byte stream to a TCP port
//!   on the guest's loopback (the mirror of egress).
//! - [`egress`]: `net: egress`: an HTTP proxy on the guest's loopback whose every
//!   connection is dialled by the host (which holds the allowlist) over the link.
//! - [`agent`]: state shared by all connections, and `info`.
//! - [`init`]: PID-1 duties (mounts, modules, console, shutdown); [`ready`]: telling
//!   the host the agent listens.
//! - [`sys`]: every raw system call, behind safe functions; the only module where
//!   the compiler admits `unsafe` (the crate root denies `unsafe_code`).
//!
//! # Confinement
//! As the machine's init the agent mounts cgroup2, moves itself into an `agent` leaf
//! (`memory.min` 32 MiB, `cpu.weight` 1000) and starts every exec, spawn and pty in a
//! cgroup of its own under `workload` (`memory.max` = RAM − 64 MiB − RAM/32,
//! `pids.max` 4096 or less where the kernel allows fewer tasks). A timeout or cancel
//! kills the whole cgroup, `setsid`'d children included; a finished exec's leftovers
//! live on, listed and killable, until its deadline; OOM kills are counted per
//! cgroup and reported by `ps_detail`. Elsewhere (a Unix socket in development, PID 1
//! of a namespace in tests, a kernel without cgroup2) it keeps to process groups.
//! `confinement` and the `cgroups` capability say which. See [`process::cgroup`].
//!
//! # Robustness
//! As PID 1, the agent must never exit: a panic in a request handler is caught by its
//! task and answered with an `Internal` error; every bad input becomes a typed error;
//! the release profile unwinds (never `panic = "abort"`).

#![deny(unsafe_code)]

pub mod agent;
pub mod budget;
pub mod config;
pub mod egress;
pub mod events;
pub mod files;
pub mod image;
pub mod init;
pub mod machine;
pub mod port;
pub mod process;
pub mod ready;
pub mod ring;
pub mod ring_pool;
pub mod server;
pub mod session;
pub mod sys;
pub mod wait;

use std::future::Future;
use std::sync::Arc;

use crate::agent::Agent;
use crate::config::Config;
use crate::process::reaper;

/// Why the agent could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `SIGCHLD` could not be watched, so children could not be reaped.
    #[error("Cannot watch SIGCHLD")]
    Sigchld(#[source] std::io::Error),
    /// A listener could not be bound.
    #[error(transparent)]
    Server(#[from] server::ServerError),
}

/// Serves until `shutdown` resolves or a client asks for a shutdown. Starts the reaper and the sweeper that forgets
/// exited processes, binds every listener, then calls `on_listening` (used to tell
/// the host the agent is ready).
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
    on_listening: impl FnOnce(&Agent),
) -> Result<Arc<Agent>, RunError> {
    // Before any child starts: each one joins a cgroup of this tree.
    let confinement = process::cgroup::Confinement::set_up(config.is_init);
    let image = config
        .image_config
        .as_deref()
        .map(image::load)
        .unwrap_or_default();
    let table = process::table::ProcessTable::with_confinement(config.forget_after, confinement)
        .with_defaults(process::defaults::ProcessDefaults::from_image(&image));
    let agent =
        Arc::new(Agent::with_table(table, config.token.clone(), config.is_init).with_image(image));
    let sigchld = reaper::sigchld().map_err(RunError::Sigchld)?;
    let reaper = tokio::spawn(reaper::run(agent.table.clone(), sigchld));
    let sweeper = tokio::spawn(sweep_forever(agent.clone()));
    // Before the listeners, so the agent answers (and a template's ready snapshot is
    // taken) only once they are warm.
    session::warm::start_boot_sessions(&agent).await;

    let listeners = server::bind(&config.listen)?;
    on_listening(&agent);
    let requested = agent.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = requested.shutdown_requested() => tracing::info!("shutdown requested by a client"),
        }
    };
    server::serve(listeners, agent.clone(), config.peers.clone(), shutdown).await;
    sweeper.abort();
    reaper.abort();
    Ok(agent)
}

/// After reclaiming ring memory on a shortage, the sweeper waits this long before it
/// heeds the next one: a pool that stays short (every ring running and chatty) must
/// not keep it scanning the table.
const SHORTAGE_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Forgets processes that exited long enough ago, and when the ring pool runs short,
/// gives running processes the memory of exited processes' output.
async fn sweep_forever(agent: Arc<Agent>) {
    let mut tick = tokio::time::interval(agent.table.sweep_interval());
    let pool = agent.table.ring_pool().clone();
    loop {
        let short = tokio::select! {
            _ = tick.tick() => false,
            () = pool.shortage() => true,
        };
        let forgotten = agent.table.forget_expired(std::time::Instant::now());
        let freed = agent.table.reclaim_exited_rings();
        if forgotten > 0 || freed > 0 {
            tracing::debug!(forgotten, freed, "swept exited processes");
        }
        if short {
            tokio::time::sleep(SHORTAGE_PAUSE).await;
        }
    }
}
