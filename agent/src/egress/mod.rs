//! Egress: the guest's only way out, an HTTP proxy on its loopback whose every
//! connection the host checks and dials (see `sandbox_protocol::link::egress` for the
//! wire and why this design).
//!
//! - [`Egress`] is the agent's end of it: the link session that carries egress now
//!   (set by `link` when the host sends `Network { egress: true }`, cleared when the
//!   session ends), the dials waiting for the host's answer, and whether the proxy
//!   variables go into new processes ([`proxy_env`]).
//! - [`proxy`] serves `127.0.0.1:EGRESS_PROXY_PORT`: reads one request head
//!   ([`http`]), asks the host to dial, and splices the program's socket to the
//!   channel.
//!
//! The guest holds no policy: a root workload can rewrite anything in it. It can ask
//! for any destination, and the host decides.

pub mod http;
pub mod proxy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sandbox_protocol::link::egress::{
    DialOutcome, DialRefusal, EGRESS_CHANNEL_BIT, EGRESS_PROXY_PORT, MAX_EGRESS_CONNECTIONS,
    PROXY_NOTE_MAX_BYTES,
};
use sandbox_protocol::link::mux::{Channel, Channels};
use sandbox_protocol::link::{ChannelId, LinkFrame};
use tokio::sync::oneshot;

/// Whether processes started from now on get the proxy variables. Process-wide like
/// the proxy itself (one per guest); read by every launch plan, set by the link.
static PROXY_ENV: AtomicBool = AtomicBool::new(false);

/// The variables a process gets while egress is on: every tool that honours the
/// usual proxy variables (curl, wget, pip, git, apt, Python's urllib) finds the proxy
/// with no setup of its own. The template's and the request's variables come after
/// and win.
pub fn proxy_env() -> Vec<(String, String)> {
    if !PROXY_ENV.load(Ordering::Acquire) {
        return Vec::new();
    }
    let url = format!("http://127.0.0.1:{EGRESS_PROXY_PORT}");
    let local = "localhost,127.0.0.1,::1".to_owned();
    [
        ("http_proxy", url.clone()),
        ("https_proxy", url.clone()),
        ("HTTP_PROXY", url.clone()),
        ("HTTPS_PROXY", url),
        ("no_proxy", local.clone()),
        ("NO_PROXY", local),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// How long a dial may wait for the host's answer: the host bounds its own resolve
/// and each connect at 10 s, so this is a backstop against a lost answer, which
/// would otherwise hold the program and a proxy slot forever.
pub const DIAL_ANSWER_SECS: u64 = 120;

/// The link session egress goes through now.
#[derive(Debug, Clone)]
struct Route {
    channels: Arc<Channels>,
    session: u64,
}

/// The agent's egress state.
#[derive(Debug, Default)]
pub struct Egress {
    route: Mutex<Option<Route>>,
    pending: Mutex<HashMap<ChannelId, oneshot::Sender<DialOutcome>>>,
    next_id: AtomicU32,
    /// The proxy's accept loop while egress is on. Stopped when the session ends, so
    /// a VM restored from a snapshot of an egress VM (a template's ready snapshot,
    /// say) has nothing on the proxy port unless its own host gives it egress.
    listener: Mutex<Option<tokio::task::AbortHandle>>,
}

/// Why a dial could not even be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// No host gives this VM egress now.
    #[error("This sandbox has no egress now (no host route)")]
    NoRoute,
    /// Too many egress connections.
    #[error("Too many egress connections (at most {MAX_EGRESS_CONNECTIONS})")]
    TooMany,
    /// The host session ended before it answered.
    #[error("The host went away before answering")]
    HostGone,
    /// The host did not answer within [`DIAL_ANSWER_SECS`].
    #[error("The host did not answer within {DIAL_ANSWER_SECS} s")]
    NoAnswer,
}

impl Egress {
    /// No route, no proxy.
    pub fn new() -> Self {
        Self::default()
    }

    /// The link session `channels` (now at `session`) carries egress from now on;
    /// starts the proxy the first time.
    pub fn enable(self: &Arc<Self>, channels: Arc<Channels>) {
        let session = channels.outbox().session();
        *self.lock_route() = Some(Route { channels, session });
        PROXY_ENV.store(true, Ordering::Release);
        let mut listener = self.lock_listener();
        if listener
            .as_ref()
            .is_none_or(tokio::task::AbortHandle::is_finished)
        {
            let egress = self.clone();
            let task = tokio::spawn(async move {
                if let Err(error) = proxy::serve(egress).await {
                    tracing::error!(%error, "the egress proxy cannot listen");
                }
            });
            *listener = Some(task.abort_handle());
        }
        tracing::info!(port = EGRESS_PROXY_PORT, "egress on");
    }

    /// The session ended: no route until the next host says so. Dials waiting for an
    /// answer fail; open connections end with their channels.
    pub fn disable(&self) {
        if self.lock_route().take().is_some() {
            tracing::info!("egress off");
        }
        PROXY_ENV.store(false, Ordering::Release);
        if let Some(listener) = self.lock_listener().take() {
            listener.abort();
        }
        self.lock_pending().clear();
    }

    /// Asks the host for `host:port`; on success the channel to splice.
    pub async fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Result<Channel, (DialRefusal, String)>, DialError> {
        let route = self.lock_route().clone().ok_or(DialError::NoRoute)?;
        if route.channels.count_with_bit(EGRESS_CHANNEL_BIT) >= MAX_EGRESS_CONNECTIONS {
            return Err(DialError::TooMany);
        }
        let (channel, answer) = loop {
            let id = EGRESS_CHANNEL_BIT
                | (self.next_id.fetch_add(1, Ordering::Relaxed) & !EGRESS_CHANNEL_BIT);
            match route.channels.open(id) {
                Ok(channel) => {
                    let (tx, rx) = oneshot::channel();
                    self.lock_pending().insert(id, tx);
                    break (channel, rx);
                }
                // A long-lived connection still holds this number: take the next.
                Err(sandbox_protocol::link::mux::OpenError::InUse(_)) => continue,
                Err(sandbox_protocol::link::mux::OpenError::TooMany) => {
                    return Err(DialError::TooMany)
                }
            }
        };
        let id = channel.id();
        let outbox = route.channels.outbox();
        let dial = LinkFrame::Dial {
            channel: id,
            host: host.to_owned(),
            port,
        };
        if !outbox.send(route.session, &dial).await {
            self.lock_pending().remove(&id);
            channel.discard();
            return Err(DialError::HostGone);
        }
        let answer = tokio::time::timeout(std::time::Duration::from_secs(DIAL_ANSWER_SECS), answer);
        match answer.await {
            Ok(Ok(DialOutcome::Connected { .. })) => Ok(Ok(channel)),
            Ok(Ok(DialOutcome::Refused { kind, message })) => {
                channel.discard();
                Ok(Err((kind, message)))
            }
            Ok(Err(_)) => {
                channel.discard();
                Err(DialError::HostGone)
            }
            Err(_) => {
                self.lock_pending().remove(&id);
                channel.discard();
                Err(DialError::NoAnswer)
            }
        }
    }

    /// The host's answer to a `Dial`. A connection nobody waits for any more (the
    /// dial timed out) is closed, so the host lets go of it.
    pub async fn dialed(&self, channel: ChannelId, outcome: DialOutcome) {
        let waiter = self.lock_pending().remove(&channel);
        let unwanted = match waiter {
            Some(tx) => tx.send(outcome).err(),
            None => Some(outcome),
        };
        if let Some(DialOutcome::Connected { .. }) = unwanted {
            let route = self.lock_route().clone();
            if let Some(route) = route {
                let close = LinkFrame::Close { channel };
                route.channels.outbox().send(route.session, &close).await;
            }
        }
    }

    /// Tells the host's egress log about a request the proxy refused itself.
    pub async fn note_refusal(&self, note: &str) {
        let Some(route) = self.lock_route().clone() else {
            return;
        };
        let mut note = note.to_owned();
        if note.len() > PROXY_NOTE_MAX_BYTES {
            let mut end = PROXY_NOTE_MAX_BYTES;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
        }
        route
            .channels
            .outbox()
            .send(route.session, &LinkFrame::ProxyRefused { note })
            .await;
    }

    fn lock_listener(&self) -> std::sync::MutexGuard<'_, Option<tokio::task::AbortHandle>> {
        self.listener.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_route(&self) -> std::sync::MutexGuard<'_, Option<Route>> {
        self.route.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_pending(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ChannelId, oneshot::Sender<DialOutcome>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
