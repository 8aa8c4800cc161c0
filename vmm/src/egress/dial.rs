//! Resolving, checking and connecting one destination the guest asked for.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use sandbox_protocol::link::egress::DialRefusal;
use tokio::net::TcpStream;

use super::{Host, Policy};

/// How long resolving a name may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Name lookups a relay runs at once. Each is a blocking `getaddrinfo` that goes on
/// after its dial gave up (a timeout cannot stop it), so without a cap a guest that
/// dials names whose servers never answer would pile up host threads.
const MAX_LOOKUPS: usize = 8;

static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LOOKUPS);

/// The addresses of `name`, within [`RESOLVE_TIMEOUT`] and one of [`MAX_LOOKUPS`]
/// slots, which a lookup keeps until it really ends.
async fn resolve(name: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
    let timed_out = || Refusal::new(DialRefusal::Resolve, format!("resolving {name} timed out"));
    let deadline = tokio::time::Instant::now() + RESOLVE_TIMEOUT;
    let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, LOOKUPS.acquire()).await else {
        return Err(timed_out());
    };
    let owned = name.to_owned();
    let lookup = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        std::net::ToSocketAddrs::to_socket_addrs(&(owned.as_str(), port))
            .map(Iterator::collect::<Vec<_>>)
    });
    match tokio::time::timeout_at(deadline, lookup).await {
        Ok(Ok(Ok(addrs))) => Ok(addrs),
        Ok(Ok(Err(error))) => Err(Refusal::new(
            DialRefusal::Resolve,
            format!("cannot resolve {name}: {error}"),
        )),
        Ok(Err(join)) => Err(Refusal::new(
            DialRefusal::Resolve,
            format!("cannot resolve {name}: {join}"),
        )),
        Err(_) => Err(timed_out()),
    }
}

/// How long connecting to one address may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A refusal and its reason, as logged and as the program is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The kind.
    pub kind: DialRefusal,
    /// For a person.
    pub message: String,
    /// The address it was about, if any.
    pub address: Option<SocketAddr>,
}

impl Refusal {
    fn new(kind: DialRefusal, message: String) -> Self {
        Self {
            kind,
            message,
            address: None,
        }
    }
}

/// Checks `host:port` against `policy`, resolves a name, checks every address, and
/// connects to the first allowed one that answers. The address returned is the one
/// dialled: there is no second lookup between the check and the connect, so a DNS
/// answer that changes (rebinding) cannot slip an unchecked address in.
pub async fn dial(
    policy: &Policy,
    host: &str,
    port: u16,
) -> Result<(TcpStream, SocketAddr), Refusal> {
    let Some(parsed) = Host::parse(host) else {
        return Err(Refusal::new(
            DialRefusal::Invalid,
            format!(
                "{:?} is neither a host name nor an address",
                host.chars().take(80).collect::<String>()
            ),
        ));
    };
    if port == 0 {
        return Err(Refusal::new(DialRefusal::Invalid, "port 0".into()));
    }
    if !policy.allows_destination(&parsed, port) {
        return Err(Refusal::new(
            DialRefusal::Denied,
            format!("{parsed}:{port} is not in the allowlist"),
        ));
    }
    let candidates: Vec<SocketAddr> = match &parsed {
        Host::Address(addr) => vec![SocketAddr::new(*addr, port)],
        Host::Name(name) => resolve(name, port).await?,
    };
    let (allowed, denied): (Vec<SocketAddr>, Vec<SocketAddr>) = candidates
        .into_iter()
        .partition(|a| matches!(parsed, Host::Address(_)) || policy.allows_resolved(a.ip(), port));
    if allowed.is_empty() {
        let shown: Vec<String> = denied.iter().map(|a| a.ip().to_string()).collect();
        let mut refusal = Refusal::new(
            if denied.is_empty() {
                DialRefusal::Resolve
            } else {
                DialRefusal::Denied
            },
            if denied.is_empty() {
                format!("{parsed} resolved to no address")
            } else {
                format!("{parsed} resolves to {}, which the allowlist does not allow (internal addresses need an address entry)", shown.join(", "))
            },
        );
        refusal.address = denied.first().copied();
        return Err(refusal);
    }
    let mut last = None;
    for address in allowed {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, address));
            }
            Ok(Err(error)) => last = Some((address, error.to_string())),
            Err(_) => last = Some((address, "timed out".to_owned())),
        }
    }
    let (address, why) = last.unwrap_or((
        SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port),
        String::new(),
    ));
    Err(Refusal {
        kind: DialRefusal::Connect,
        message: format!("cannot connect to {address}: {why}"),
        address: Some(address),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Allowlist;

    fn policy(entries: &[&str]) -> Policy {
        Policy::new(Allowlist::parse(entries).unwrap())
    }

    #[tokio::test]
    async fn an_allowed_address_is_dialled_and_a_listed_name_resolving_inside_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_, address) = dial(&policy(&[&format!("127.0.0.1:{port}")]), "127.0.0.1", port)
            .await
            .unwrap();
        assert_eq!(address, listener.local_addr().unwrap());
        // `localhost` is listed by name, but resolves to loopback, which is not.
        let refusal = dial(&policy(&["localhost"]), "localhost", port)
            .await
            .unwrap_err();
        assert_eq!(refusal.kind, DialRefusal::Denied);
        assert!(refusal.message.contains("127.0.0.1"), "{}", refusal.message);
        // With the address listed too, the name works.
        let both = policy(&["localhost", &format!("127.0.0.0/8:{port}")]);
        assert!(dial(&both, "localhost", port).await.is_ok());
        let refusal = dial(&policy(&["a.io"]), "b.io", 443).await.unwrap_err();
        assert_eq!(refusal.kind, DialRefusal::Denied);
        assert_eq!(refusal.message, "b.io:443 is not in the allowlist");
        let refusal = dial(&policy(&["*"]), "bad name!", 443).await.unwrap_err();
        assert_eq!(refusal.kind, DialRefusal::Invalid);
        // A hostile guest's 30 KiB name: refused, and the reason stays short (it must
        // fit in a link frame back to the agent).
        let long = "a".repeat(30_000);
        let refusal = dial(&policy(&["*"]), &long, 443).await.unwrap_err();
        assert_eq!(refusal.kind, DialRefusal::Invalid);
        assert!(refusal.message.len() < 200, "{}", refusal.message.len());
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_failure() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let refusal = dial(&policy(&["127.0.0.1"]), "127.0.0.1", port)
            .await
            .unwrap_err();
        assert_eq!(refusal.kind, DialRefusal::Connect);
    }
}
