//! The embedded backend's `expose_port`: local listeners piped to guest ports.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use sandbox_engine::node::Node;
use sandbox_engine::sandbox::Sandbox;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Listeners one sandbox may have; asking for more is refused.
pub const MAX_EXPOSED_PER_SANDBOX: usize = 16;

/// How often a listener checks that its sandbox still exists (and stops if not).
const SANDBOX_CHECK_SECS: u64 = 2;

/// One listener.
#[derive(Debug)]
struct Listener {
    addr: SocketAddr,
    until: Option<SystemTime>,
    task: AbortHandle,
}

/// The listeners of this process, by sandbox id and guest port.
#[derive(Debug, Default)]
pub struct Exposed {
    listeners: Mutex<HashMap<(String, u16), Listener>>,
}

/// What [`Exposed::expose`] made or found.
#[derive(Debug, Clone)]
pub struct Opened {
    /// `http://127.0.0.1:PORT/`
    pub url: String,
    /// When it stops, if it is bounded.
    pub expires_at: Option<SystemTime>,
}

/// Why a listener could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ExposeError {
    /// Port 0.
    #[error("port must be 1-65535")]
    Port,
    /// [`MAX_EXPOSED_PER_SANDBOX`] already.
    #[error("sandbox {0} already has {MAX_EXPOSED_PER_SANDBOX} exposed ports")]
    TooMany(String),
    /// Binding a local port failed.
    #[error("Cannot listen on 127.0.0.1")]
    Bind(#[source] std::io::Error),
}

impl Drop for Exposed {
    fn drop(&mut self) {
        for listener in self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            listener.task.abort();
        }
    }
}

impl Exposed {
    /// A listener for `port` of `sandbox` (the one already open, if any), living
    /// `ttl` at most, and never past the sandbox.
    pub async fn expose(
        &self,
        node: &Arc<Node>,
        sandbox: &Arc<Sandbox>,
        port: u16,
        ttl: Option<Duration>,
    ) -> Result<Opened, ExposeError> {
        if port == 0 {
            return Err(ExposeError::Port);
        }
        let id = sandbox.id.to_string();
        let claim_end = sandbox.deadline().map(|deadline| deadline.wall);
        {
            let mut listeners = self.lock();
            listeners.retain(|_, listener| !listener.task.is_finished());
            if let Some(listener) = listeners.get(&(id.clone(), port)) {
                return Ok(opened(listener.addr, listener.until.or(claim_end)));
            }
            if listeners.keys().filter(|(owner, _)| *owner == id).count() >= MAX_EXPOSED_PER_SANDBOX
            {
                return Err(ExposeError::TooMany(id));
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ExposeError::Bind)?;
        let addr = listener.local_addr().map_err(ExposeError::Bind)?;
        let until = ttl.map(|ttl| SystemTime::now() + ttl);
        let task = tokio::spawn(serve(
            listener,
            node.clone(),
            Arc::downgrade(sandbox),
            port,
            ttl.map(|ttl| tokio::time::Instant::now() + ttl),
        ));
        self.lock().insert(
            (id, port),
            Listener {
                addr,
                until,
                task: task.abort_handle(),
            },
        );
        let expires_at = match (until, claim_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(opened(addr, expires_at))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), Listener>> {
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn opened(addr: SocketAddr, expires_at: Option<SystemTime>) -> Opened {
    Opened {
        url: format!("http://{addr}/"),
        expires_at,
    }
}

/// Accepts until the sandbox is gone or `until`; each connection is piped to the
/// guest port. Open connections end with their sandbox (its agent goes away). Holds
/// the sandbox weakly: a listener never keeps a released sandbox alive.
async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    weak: Weak<Sandbox>,
    port: u16,
    until: Option<tokio::time::Instant>,
) {
    let check = Duration::from_secs(SANDBOX_CHECK_SECS);
    loop {
        if until.is_some_and(|until| tokio::time::Instant::now() >= until) {
            return;
        }
        let Some(sandbox) = weak.upgrade() else {
            return;
        };
        let live = node
            .sandbox(sandbox.id.as_str())
            .is_ok_and(|now| Arc::ptr_eq(&now, &sandbox));
        if !live {
            return;
        }
        let accepted = tokio::time::timeout(check, listener.accept()).await;
        match accepted {
            Ok(Ok((stream, _))) => {
                tokio::spawn(pipe(stream, sandbox, port));
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => {}
        }
    }
}

async fn pipe(mut local: TcpStream, sandbox: Arc<Sandbox>, port: u16) {
    let _ = local.set_nodelay(true);
    let guest = match sandbox.client().await {
        Ok(client) => client.dial_port(port).await,
        Err(error) => {
            tracing::info!(sandbox = %sandbox.id, %error, "exposed port: sandbox unreachable");
            return;
        }
    };
    match guest {
        Ok(mut guest) => {
            if let Err(error) = tokio::io::copy_bidirectional(&mut local, &mut guest).await {
                tracing::debug!(%error, "exposed port connection ended");
            }
        }
        Err(error) => tracing::info!(
            sandbox = %sandbox.id,
            port,
            error = %sandbox_vmm::error_chain(&error),
            "exposed port: guest refused"
        ),
    }
}
