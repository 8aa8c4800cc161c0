//! Listening: Unix sockets for development and tests, vsock inside a microVM.
//!
//! [`serve`] binds every listener, accepts until `shutdown` resolves, and hands each
//! connection to [`connection::serve`] in its own task. [`admission`] caps
//! connections without ever leaving a newcomer unaccepted (the oldest idle connection
//! makes room); a failing connection is logged and never affects the others.

pub mod admission;
pub mod connection;
pub mod dispatch;
pub mod link;
pub mod serial;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use sandbox_protocol::limits::HOST_CID;
use tokio::net::UnixListener;
use tokio_vsock::{VsockAddr, VsockListener};

use self::admission::Admission;
use self::connection::Admissions;
use crate::agent::Agent;

/// Connections served at once (see [`admission`]).
pub use sandbox_protocol::limits::MAX_CONNECTIONS;

/// Connections that have not said `Hello` yet. A newcomer past it replaces the oldest
/// of them (each has 10 s for its `Hello` anyway); they never displace a served one.
pub const MAX_PENDING_HELLOS: usize = 16;

/// The vsock CID meaning "any local CID" (`VMADDR_CID_ANY`).
pub const VSOCK_CID_ANY: u32 = u32::MAX;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path (created with mode 0600; a stale socket is replaced).
    Unix(PathBuf),
    /// A vsock CID (usually [`VSOCK_CID_ANY`]) and port.
    Vsock {
        /// The local CID to bind.
        cid: u32,
        /// The port.
        port: u32,
    },
    /// The link (channels over one stream, see [`link`]) on the virtio-serial port of
    /// this name: how snapshot-capable VMs are reached.
    Serial(String),
    /// The link on a Unix socket a host relay connects to, one at a time (development
    /// and tests of the snapshot transport without a VM).
    LinkUnix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    /// Parses `unix://PATH`, `vsock://CID:PORT` (CID `-1` means any),
    /// `serial://PORT_NAME` or `link+unix://PATH`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(name) = s.strip_prefix("serial://") {
            if name.is_empty() {
                return Err("serial:// needs a port name".into());
            }
            return Ok(Self::Serial(name.to_owned()));
        }
        if let Some(path) = s.strip_prefix("link+unix://") {
            if path.is_empty() {
                return Err("link+unix:// needs a path".into());
            }
            return Ok(Self::LinkUnix(path.into()));
        }
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() {
                return Err("unix:// needs a path".into());
            }
            return Ok(Self::Unix(path.into()));
        }
        if let Some(rest) = s.strip_prefix("vsock://") {
            let (cid, port) = rest.split_once(':').ok_or("vsock:// needs CID:PORT")?;
            let cid = if cid == "-1" {
                VSOCK_CID_ANY
            } else {
                cid.parse().map_err(|_| format!("bad vsock CID {cid:?}"))?
            };
            let port = port
                .parse()
                .map_err(|_| format!("bad vsock port {port:?}"))?;
            return Ok(Self::Vsock { cid, port });
        }
        Err(format!(
            "{s:?} is not unix://PATH, vsock://CID:PORT, serial://NAME or link+unix://PATH"
        ))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Vsock {
                cid: VSOCK_CID_ANY,
                port,
            } => write!(f, "vsock://-1:{port}"),
            Self::Vsock { cid, port } => write!(f, "vsock://{cid}:{port}"),
            Self::Serial(name) => write!(f, "serial://{name}"),
            Self::LinkUnix(path) => write!(f, "link+unix://{}", path.display()),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding a listener failed.
    #[error("Cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: ListenAddr,
        /// The OS error.
        #[source]
        error: std::io::Error,
    },
    /// No listener was configured.
    #[error("No listener configured")]
    NoListener,
}

/// A bound listener.
#[derive(Debug)]
enum Listener {
    Unix(UnixListener),
    Vsock(VsockListener),
    /// Opened when served: the port may take a moment to appear.
    Serial(String),
    LinkUnix(UnixListener),
}

/// Which vsock peers may connect.
#[derive(Debug, Clone)]
pub struct PeerPolicy {
    /// Accepted peer CIDs; the host's by default.
    pub allowed_cids: Vec<u32>,
}

impl Default for PeerPolicy {
    fn default() -> Self {
        Self {
            allowed_cids: vec![HOST_CID],
        }
    }
}

/// Binds every listener now, so callers know the agent is reachable once this returns.
pub fn bind(addrs: &[ListenAddr]) -> Result<Vec<(ListenAddr, BoundListener)>, ServerError> {
    if addrs.is_empty() {
        return Err(ServerError::NoListener);
    }
    addrs
        .iter()
        .map(|addr| {
            bind_one(addr)
                .map(|l| (addr.clone(), BoundListener(l)))
                .map_err(|error| ServerError::Bind {
                    addr: addr.clone(),
                    error,
                })
        })
        .collect()
}

/// A listener ready to accept.
#[derive(Debug)]
pub struct BoundListener(Listener);

fn bind_one(addr: &ListenAddr) -> std::io::Result<Listener> {
    match addr {
        ListenAddr::Unix(path) => Ok(Listener::Unix(bind_unix(path)?)),
        ListenAddr::Vsock { cid, port } => Ok(Listener::Vsock(VsockListener::bind(
            VsockAddr::new(*cid, *port),
        )?)),
        ListenAddr::Serial(name) => Ok(Listener::Serial(name.clone())),
        ListenAddr::LinkUnix(path) => Ok(Listener::LinkUnix(bind_unix(path)?)),
    }
}

/// A Unix listener at `path` (mode 0600), replacing a stale socket.
fn bind_unix(path: &std::path::Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts on every listener until `shutdown` resolves.
pub async fn serve(
    listeners: Vec<(ListenAddr, BoundListener)>,
    agent: Arc<Agent>,
    peers: PeerPolicy,
    shutdown: impl Future<Output = ()>,
) {
    let admissions = Admissions {
        pending: Admission::new(MAX_PENDING_HELLOS),
        served: Admission::new(MAX_CONNECTIONS),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (addr, BoundListener(listener)) in listeners {
        tracing::info!(%addr, "listening");
        tasks.spawn(accept_loop(
            listener,
            agent.clone(),
            admissions.clone(),
            peers.clone(),
        ));
    }
    shutdown.await;
    tasks.abort_all();
}

async fn accept_loop(
    listener: Listener,
    agent: Arc<Agent>,
    admissions: Admissions,
    peers: PeerPolicy,
) {
    let listener = match listener {
        Listener::Serial(name) => {
            match serial::SerialPort::open(&name).await {
                Ok(port) => link::serve_port(port, agent, admissions).await,
                Err(error) => tracing::error!(%error, "cannot open the agent's serial port"),
            }
            return;
        }
        Listener::LinkUnix(listener) => {
            return link::serve_link_listener(listener, agent, admissions).await
        }
        listener => listener,
    };
    loop {
        match &listener {
            Listener::Serial(_) | Listener::LinkUnix(_) => return,
            Listener::Unix(listener) => match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(connection::serve(stream, agent.clone(), admissions.clone()));
                }
                Err(error) => accept_failed(&error).await,
            },
            Listener::Vsock(listener) => match listener.accept().await {
                Ok((stream, peer)) if peers.allowed_cids.contains(&peer.cid()) => {
                    tokio::spawn(connection::serve(stream, agent.clone(), admissions.clone()));
                }
                Ok((_, peer)) => {
                    tracing::warn!(cid = peer.cid(), "refused a vsock peer that is not allowed")
                }
                Err(error) => accept_failed(&error).await,
            },
        }
    }
}

/// Accept errors (EMFILE, ECONNABORTED, …) are transient: pause, go on. Logged at
/// most once a second, so a descriptor shortage cannot flood the serial console.
async fn accept_failed(error: &std::io::Error) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_LOGGED_SECS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    if LAST_LOGGED_SECS.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(%error, "accept failed");
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_and_print() {
        for text in [
            "unix:///tmp/a.sock",
            "vsock://-1:1024",
            "vsock://3:52",
            "serial://sandbox.agent",
            "link+unix:///tmp/l.sock",
        ] {
            let addr: ListenAddr = text.parse().unwrap();
            assert_eq!(addr.to_string(), text);
        }
        for bad in [
            "unix://",
            "vsock://1024",
            "vsock://x:1",
            "tcp://1.2.3.4:5",
            "vsock://3:99999999999",
            "serial://",
            "link+unix://",
        ] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }
}
