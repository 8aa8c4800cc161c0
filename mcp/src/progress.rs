//! Progress notifications for calls that take long, when the client asked for them
//! (a `progressToken` in the request's `_meta`).
//!
//! Every tool call gets a [`Progress`] (in the request context's extensions, see
//! `SandboxServer::call_tool`). A ticker ([`Progress::run`]) sends
//! `notifications/progress` while the call runs: after the first
//! [`PROGRESS_TICK_MS`], then on every tick whose status changed, and at least every
//! [`PROGRESS_HEARTBEAT_MS`]. So a call that answers quickly sends nothing, a boot or
//! a fork shows it is alive, and an `exec` shows the last line its command printed
//! (the tool updates the status with [`Progress::set_status`]). `progress` is the
//! elapsed time in seconds, which only grows, as the spec asks; there is no `total`.
//!
//! Clients that reset their request timeout on progress (the TypeScript SDK's
//! `resetTimeoutOnProgress`) then keep waiting for a long call instead of failing it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio::time::Instant;

use sandbox_engine::util::lock;

/// How often the ticker looks at the status.
pub const PROGRESS_TICK_MS: u64 = 1000;

/// Longest time between two notifications of a running call.
pub const PROGRESS_HEARTBEAT_MS: u64 = 5000;

/// One tool call's progress reporting; a no-op when the client sent no token.
/// Cheap to clone: clones share the status.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    started: Instant,
    status: Mutex<Status>,
}

#[derive(Debug)]
struct Status {
    /// What the next notification says.
    message: String,
    /// Whether `message` changed since it was last sent.
    fresh: bool,
}

impl Progress {
    /// The progress of the call `context` belongs to, reporting `message` until the
    /// tool says more.
    pub fn for_call(context: &RequestContext<RoleServer>, message: String) -> Self {
        let Some(token) = context.meta.get_progress_token() else {
            return Self::default();
        };
        Self {
            inner: Some(Arc::new(Inner {
                peer: context.peer.clone(),
                token,
                started: Instant::now(),
                status: Mutex::new(Status {
                    message,
                    fresh: true,
                }),
            })),
        }
    }

    /// Whether the client asked for progress.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Sets what the next notification says.
    pub fn set_status(&self, message: impl Into<String>) {
        if let Some(inner) = &self.inner {
            let mut status = lock(&inner.status);
            let message = message.into();
            if status.message != message {
                status.message = message;
                status.fresh = true;
            }
        }
    }

    /// Sends notifications until dropped (run it next to the call; it never ends on
    /// its own). Pending forever when the client asked for none.
    pub async fn run(self) {
        let Some(inner) = self.inner else {
            return std::future::pending().await;
        };
        let tick = Duration::from_millis(PROGRESS_TICK_MS);
        let heartbeat = Duration::from_millis(PROGRESS_HEARTBEAT_MS);
        let mut next = inner.started + tick;
        let mut last_sent: Option<Instant> = None;
        loop {
            tokio::time::sleep_until(next).await;
            next += tick;
            let message = {
                let mut status = lock(&inner.status);
                let due = last_sent.is_none_or(|at| at.elapsed() >= heartbeat);
                if !status.fresh && !due {
                    continue;
                }
                status.fresh = false;
                status.message.clone()
            };
            let elapsed = inner.started.elapsed();
            let seconds = elapsed.as_secs_f64();
            let text = format!("{message} ({} s)", elapsed.as_secs());
            let param =
                ProgressNotificationParam::new(inner.token.clone(), seconds).with_message(text);
            if let Err(error) = inner.peer.notify_progress(param).await {
                tracing::debug!(%error, "progress notification not sent");
            }
            last_sent = Some(Instant::now());
        }
    }
}
