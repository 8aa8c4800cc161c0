//! Preview URLs: unguessable links on the node that reach a guest port.
//!
//! `POST /v1/sandboxes/{id}/preview` mints one ([`Previews::mint`]); the link is
//! `{base}/preview/{secret}/`, and whoever holds it reaches the port with a plain
//! HTTP client: the secret is the credential, no Bearer needed. A link works while
//! its sandbox's claim does (a released, expired or destroyed sandbox takes its
//! links with it, and a later sandbox of the same id does not inherit them) and
//! until its own TTL. [`Previews::resolve`] answers the same `None` for a secret
//! that never existed and one that expired, so nothing can be probed.
//!
//! The table is the daemon's, in memory: a link is a capability handed to a person,
//! not a record of the sandbox, and a restarted daemon mints again. Bounded by
//! [`MAX_PREVIEWS_PER_SANDBOX`]; expired links are dropped whenever one is minted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use sandbox_engine::sandbox::Sandbox;
use sandbox_vmm::launcher::run_dir::random_bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Random bytes in a preview secret (twice as many hex digits in the URL).
pub const PREVIEW_SECRET_BYTES: usize = 32;

/// Live links one sandbox may have; minting past it is refused.
pub const MAX_PREVIEWS_PER_SANDBOX: usize = 64;

/// Proxied connections (requests in flight, upgraded WebSockets) one sandbox's
/// links may hold at once; more are answered `503`. Below the agent's cap on port
/// connections, so links leave room for port-forwards.
pub const MAX_PREVIEW_CONNECTIONS_PER_SANDBOX: usize = 32;

/// Why a link could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// Port 0.
    #[error("port must be 1-65535")]
    Port,
    /// [`MAX_PREVIEWS_PER_SANDBOX`] live links already.
    #[error("this sandbox has {MAX_PREVIEWS_PER_SANDBOX} live preview URLs; let one expire first")]
    TooMany,
    /// The kernel's random source failed.
    #[error("Cannot make a secret")]
    Random(#[source] std::io::Error),
}

/// One minted link.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The sandbox it reaches.
    pub sandbox: String,
    /// When that sandbox was claimed: a later sandbox of the same id is another.
    claimed_at: SystemTime,
    /// The guest port.
    pub port: u16,
    /// Its own end, if it has a TTL (the claim's end applies anyway).
    until: Option<SystemTime>,
}

/// A newly minted link.
#[derive(Debug, Clone)]
pub struct Minted {
    /// `{base}/preview/{secret}/`
    pub url: String,
    /// When it stops working at the latest, if anything bounds it.
    pub expires_at: Option<SystemTime>,
}

/// The daemon's links.
#[derive(Debug)]
pub struct Previews {
    /// `http(s)://ADVERTISED_ADDRESS`, without a trailing slash.
    base: String,
    links: Mutex<HashMap<String, Preview>>,
    /// Per sandbox id: the slots of its proxied connections.
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Previews {
    /// No links yet; URLs start with `base`.
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            links: Mutex::default(),
            slots: Mutex::default(),
        }
    }

    /// A link to `port` of `sandbox`, living `ttl` (none: as long as the claim).
    pub fn mint(
        &self,
        sandbox: &Sandbox,
        port: u16,
        ttl: Option<Duration>,
    ) -> Result<Minted, MintError> {
        if port == 0 {
            return Err(MintError::Port);
        }
        let now = SystemTime::now();
        let until = ttl.map(|ttl| now + ttl);
        let claim_end = sandbox.deadline().map(|deadline| deadline.wall);
        let expires_at = match (until, claim_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut bytes = [0u8; PREVIEW_SECRET_BYTES];
        random_bytes(&mut bytes).map_err(MintError::Random)?;
        let secret: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        let id = sandbox.id.to_string();
        let mut links = self.lock_links();
        links.retain(|_, link| link.until.is_none_or(|until| until > now));
        if links.values().filter(|link| link.sandbox == id).count() >= MAX_PREVIEWS_PER_SANDBOX {
            return Err(MintError::TooMany);
        }
        links.insert(
            secret.clone(),
            Preview {
                sandbox: id,
                claimed_at: sandbox.claimed_at,
                port,
                until,
            },
        );
        Ok(Minted {
            url: format!("{}/preview/{secret}/", self.base),
            expires_at,
        })
    }

    /// The link `secret` names, if it is live and its sandbox is the one it was
    /// minted for; `lookup` finds a sandbox by id (the node's registry). A link
    /// whose sandbox is gone is forgotten.
    pub fn resolve(
        &self,
        secret: &str,
        lookup: impl Fn(&str) -> Option<Arc<Sandbox>>,
    ) -> Option<(Preview, Arc<Sandbox>)> {
        let link = self.lock_links().get(secret).cloned()?;
        let now = SystemTime::now();
        let sandbox = lookup(&link.sandbox).filter(|sandbox| {
            sandbox.claimed_at == link.claimed_at
                && sandbox
                    .deadline()
                    .is_none_or(|deadline| deadline.wall > now)
        });
        let live = link.until.is_none_or(|until| until > now);
        match sandbox {
            Some(sandbox) if live => Some((link, sandbox)),
            _ => {
                self.lock_links().remove(secret);
                None
            }
        }
    }

    /// A connection slot of `sandbox`'s links, or `None` when all are taken.
    pub fn slot(&self, sandbox: &str) -> Option<OwnedSemaphorePermit> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget the slots of sandboxes with nothing in flight and no link.
        if slots.len() > MAX_PREVIEWS_PER_SANDBOX {
            let links = self.lock_links();
            slots.retain(|id, sem| {
                sem.available_permits() < MAX_PREVIEW_CONNECTIONS_PER_SANDBOX
                    || links.values().any(|link| &link.sandbox == id)
            });
        }
        slots
            .entry(sandbox.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_PREVIEW_CONNECTIONS_PER_SANDBOX)))
            .clone()
            .try_acquire_owned()
            .ok()
    }

    fn lock_links(&self) -> std::sync::MutexGuard<'_, HashMap<String, Preview>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
