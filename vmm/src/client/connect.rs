//! Agent URLs and dialing them.
//!
//! - `unix:///run/agent.sock`: a Unix socket (the agent on this machine, or a VMM
//!   that forwards one).
//! - `vsock://CID:PORT`: an `AF_VSOCK` stream to a guest (vhost-vsock, QEMU).
//! - `hvsock:///run/vm.vsock:1024`: hybrid vsock (Firecracker, Cloud Hypervisor,
//!   vhost-device-vsock): the VMM's Unix socket plus the guest port, reached with the
//!   `CONNECT` handshake in [`super::hvsock`].
//! - `http://HOST:PORT/v1/sandboxes/ID/agent` (or `https://`, optionally with
//!   `?ca=PEM_FILE`): sandbox `ID` behind a node daemon, reached with an HTTP/1.1
//!   `Upgrade: sandbox-agent` request in [`super::node`] (feature `node`). The
//!   [`super::ConnectOptions::token`] is then the daemon's Bearer token, and the daemon,
//!   not the client, gives the agent its own token (see [`crate::splice`]).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncWrite};

use super::error::ClientError;
use super::hvsock;

/// Where an agent listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AgentUrl {
    /// `unix://PATH`
    Unix(PathBuf),
    /// `vsock://CID:PORT`
    Vsock {
        /// The guest's context id.
        cid: u32,
        /// The agent's port.
        port: u32,
    },
    /// `hvsock://PATH:PORT`
    Hvsock {
        /// The VMM's Unix socket.
        path: PathBuf,
        /// The agent's port inside the guest.
        port: u32,
    },
    /// `http://HOST:PORT/v1/sandboxes/ID/agent`, `https://...[?ca=PEM_FILE]`.
    /// Boxed: it is the largest variant, and every [`ClientError`] carries a URL.
    Node(Box<NodeUrl>),
}

/// A sandbox behind a node daemon: [`AgentUrl::Node`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeUrl {
    /// `http://HOST[:PORT]` or `https://HOST[:PORT]`, as written, without a
    /// trailing slash.
    pub base: String,
    /// The sandbox's id on that node.
    pub sandbox: String,
    /// For `https`: a PEM file of the certificates to trust instead of the system's
    /// roots (a node with a self-signed certificate). It lives in the URL (`?ca=`, as
    /// libpq's `sslrootcert`) so that every front end taking an agent URL can name it.
    pub tls_ca: Option<PathBuf>,
}

impl AgentUrl {
    /// The URL of `sandbox` on the node at `base` (`http(s)://HOST[:PORT]`).
    pub fn node(base: impl Into<String>, sandbox: impl Into<String>) -> Self {
        Self::Node(Box::new(NodeUrl {
            base: base.into(),
            sandbox: sandbox.into(),
            tls_ca: None,
        }))
    }
}

/// The `Upgrade` protocol token of the data plane: `GET` [`agent_path`] with
/// `Connection: Upgrade` and `Upgrade: sandbox-agent` turns the HTTP connection into
/// the agent protocol (answered `101 Switching Protocols` with the same headers).
pub const NODE_UPGRADE_TOKEN: &str = "sandbox-agent";

/// The first part of a data-plane path, before the sandbox id.
const AGENT_PATH_PREFIX: &str = "/v1/sandboxes/";

/// The last part of a data-plane path, after the sandbox id.
const AGENT_PATH_SUFFIX: &str = "/agent";

/// Longest sandbox id a node URL may carry.
pub const MAX_SANDBOX_ID_BYTES: usize = 128;

/// The data-plane path of `sandbox` on a node: `/v1/sandboxes/{sandbox}/agent`.
pub fn agent_path(sandbox: &str) -> String {
    format!("{AGENT_PATH_PREFIX}{sandbox}{AGENT_PATH_SUFFIX}")
}

/// The sandbox id a data-plane request path names, if it is one: the inverse of
/// [`agent_path`], for the daemon's router and the URL parser alike. Ids are
/// `[A-Za-z0-9._-]`, 1 to [`MAX_SANDBOX_ID_BYTES`] bytes, so they never need escaping.
pub fn sandbox_of_agent_path(path: &str) -> Option<&str> {
    let id = path
        .strip_prefix(AGENT_PATH_PREFIX)?
        .strip_suffix(AGENT_PATH_SUFFIX)?;
    is_sandbox_id(id).then_some(id)
}

fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SANDBOX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != ".."
}

/// Where a node daemon listens, taken apart from [`AgentUrl::Node`]'s `base`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEndpoint {
    /// `https`.
    pub tls: bool,
    /// The host name or address, without brackets around an IPv6 address.
    pub host: String,
    /// The port (80 or 443 when the URL names none).
    pub port: u16,
    /// `HOST[:PORT]` as written, for the `Host` header.
    pub authority: String,
}

impl NodeEndpoint {
    /// Takes `http://HOST[:PORT]` or `https://HOST[:PORT]` apart.
    pub fn parse(base: &str) -> Result<Self, UrlError> {
        let bad = |why: &'static str| UrlError::BadNodeAddress {
            base: base.to_owned(),
            why,
        };
        let (tls, authority) = if let Some(rest) = base.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = base.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad("not http:// or https://"));
        };
        if authority.contains('@') {
            return Err(bad(
                "user info is not supported; the token goes in the options",
            ));
        }
        let bracketed = authority.starts_with('[');
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((host, after)) = v6.split_once(']') else {
                return Err(bad("unclosed [ in the address"));
            };
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(bad("junk after ]")),
                },
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let host_ok = if bracketed {
            host.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        };
        if !host_ok {
            return Err(bad("no valid host"));
        }
        let port = match port {
            None => {
                if tls {
                    443
                } else {
                    80
                }
            }
            Some(port) => port.parse::<u16>().map_err(|_| bad("bad port"))?,
        };
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
            authority: authority.to_owned(),
        })
    }
}

/// Why a string is not an agent URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// No `scheme://` at the start.
    #[error(
        "{0:?} has no scheme; expected unix://PATH, vsock://CID:PORT, hvsock://PATH:PORT \
         or http(s)://HOST:PORT/v1/sandboxes/ID/agent"
    )]
    MissingScheme(String),
    /// A scheme other than `unix`, `vsock`, `hvsock`, `http` or `https`.
    #[error("Unknown scheme {0:?}; expected unix, vsock, hvsock, http or https")]
    UnknownScheme(String),
    /// Nothing after `unix://` or `hvsock://`.
    #[error("{0:?} names no socket path")]
    EmptyPath(String),
    /// No `:PORT` at the end of a vsock or hvsock URL.
    #[error("{0:?} has no :PORT")]
    MissingPort(String),
    /// The port is not a number in `0..2^32`.
    #[error("Bad port {0:?}")]
    BadPort(String),
    /// The CID is not a number in `0..2^32`.
    #[error("Bad CID {0:?}")]
    BadCid(String),
    /// A node URL's `scheme://HOST[:PORT]` part is not usable.
    #[error("Bad node address {base:?}: {why}")]
    BadNodeAddress {
        /// The `scheme://authority` part.
        base: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A node URL's path is not `/v1/sandboxes/ID/agent` with a valid id.
    #[error("{0:?} does not name /v1/sandboxes/ID/agent (ids are [A-Za-z0-9._-], 1 to 128 bytes)")]
    BadNodePath(String),
    /// A node URL's query is something other than `?ca=PEM_FILE` on `https`.
    #[error("{0:?}: the only query a node URL takes is ?ca=PEM_FILE, on https")]
    BadNodeQuery(String),
}

impl FromStr for AgentUrl {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, UrlError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(UrlError::MissingScheme(url.to_owned()));
        };
        match scheme {
            "unix" => {
                if rest.is_empty() {
                    return Err(UrlError::EmptyPath(url.to_owned()));
                }
                Ok(Self::Unix(PathBuf::from(rest)))
            }
            "vsock" => {
                let (cid, port) = split_port(url, rest)?;
                let cid = cid
                    .parse::<u32>()
                    .map_err(|_| UrlError::BadCid(cid.to_owned()))?;
                Ok(Self::Vsock { cid, port })
            }
            "hvsock" => {
                let (path, port) = split_port(url, rest)?;
                if path.is_empty() {
                    return Err(UrlError::EmptyPath(url.to_owned()));
                }
                Ok(Self::Hvsock {
                    path: PathBuf::from(path),
                    port,
                })
            }
            "http" | "https" => parse_node(url, scheme, rest),
            other => Err(UrlError::UnknownScheme(other.to_owned())),
        }
    }
}

/// `rest` is what follows `scheme://` in a node URL.
fn parse_node(url: &str, scheme: &str, rest: &str) -> Result<AgentUrl, UrlError> {
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    let base = format!("{scheme}://{authority}");
    let endpoint = NodeEndpoint::parse(&base)?;
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path, None),
    };
    let Some(sandbox) = sandbox_of_agent_path(path) else {
        return Err(UrlError::BadNodePath(url.to_owned()));
    };
    let tls_ca = match query {
        None => None,
        Some(query) => match query.strip_prefix("ca=") {
            Some(ca) if endpoint.tls && !ca.is_empty() => Some(PathBuf::from(ca)),
            _ => return Err(UrlError::BadNodeQuery(url.to_owned())),
        },
    };
    Ok(AgentUrl::Node(Box::new(NodeUrl {
        base,
        sandbox: sandbox.to_owned(),
        tls_ca,
    })))
}

/// Splits `HOST:PORT` at its last colon (paths may contain colons, ports do not).
fn split_port<'a>(url: &str, rest: &'a str) -> Result<(&'a str, u32), UrlError> {
    let Some((head, port)) = rest.rsplit_once(':') else {
        return Err(UrlError::MissingPort(url.to_owned()));
    };
    if port.is_empty() {
        return Err(UrlError::MissingPort(url.to_owned()));
    }
    let port = port
        .parse::<u32>()
        .map_err(|_| UrlError::BadPort(port.to_owned()))?;
    Ok((head, port))
}

impl fmt::Display for AgentUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Vsock { cid, port } => write!(f, "vsock://{cid}:{port}"),
            Self::Hvsock { path, port } => write!(f, "hvsock://{}:{port}", path.display()),
            Self::Node(node) => {
                write!(f, "{}{}", node.base, agent_path(&node.sandbox))?;
                match &node.tls_ca {
                    Some(ca) => write!(f, "?ca={}", ca.display()),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Any byte stream the client can run over.
pub trait AgentStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AgentStream for T {}

/// Opens a byte stream to the agent (no timeout: the caller bounds it). `bearer` is
/// the node daemon's token, for [`AgentUrl::Node`]; the other transports ignore it.
pub(crate) async fn dial(
    url: &AgentUrl,
    bearer: Option<&str>,
) -> Result<Box<dyn AgentStream>, ClientError> {
    let connect_error = |error| ClientError::Connect {
        url: url.clone(),
        error,
    };
    match url {
        AgentUrl::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect_error)?;
            Ok(Box::new(stream))
        }
        AgentUrl::Vsock { cid, port } => {
            let addr = tokio_vsock::VsockAddr::new(*cid, *port);
            let stream = tokio_vsock::VsockStream::connect(addr)
                .await
                .map_err(connect_error)?;
            Ok(Box::new(stream))
        }
        AgentUrl::Hvsock { path, port } => {
            let mut stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect_error)?;
            hvsock::handshake(&mut stream, *port)
                .await
                .map_err(|error| ClientError::Hvsock {
                    path: path.clone(),
                    error,
                })?;
            Ok(Box::new(stream))
        }
        #[cfg(feature = "node")]
        AgentUrl::Node(node) => super::node::upgrade(url, node, bearer).await,
        #[cfg(not(feature = "node"))]
        AgentUrl::Node(_) => {
            let _ = bearer;
            Err(ClientError::NodeUnsupported { url: url.clone() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<AgentUrl, UrlError> {
        url.parse()
    }

    #[test]
    fn parses_each_scheme() {
        assert_eq!(
            parse("unix:///run/agent.sock"),
            Ok(AgentUrl::Unix("/run/agent.sock".into()))
        );
        assert_eq!(
            parse("vsock://3:1024"),
            Ok(AgentUrl::Vsock { cid: 3, port: 1024 })
        );
        assert_eq!(
            parse("hvsock:///run/vm.vsock:1024"),
            Ok(AgentUrl::Hvsock {
                path: "/run/vm.vsock".into(),
                port: 1024
            })
        );
    }

    #[test]
    fn hvsock_paths_may_contain_colons() {
        assert_eq!(
            parse("hvsock:///run/a:b/vm.vsock:52"),
            Ok(AgentUrl::Hvsock {
                path: "/run/a:b/vm.vsock".into(),
                port: 52
            })
        );
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "unix:///tmp/a.sock",
            "vsock://4294967295:1",
            "hvsock:///x/y:9",
        ] {
            assert_eq!(parse(url).unwrap().to_string(), url);
        }
    }

    #[test]
    fn parses_node_urls() {
        assert_eq!(
            parse("http://10.0.0.5:7777/v1/sandboxes/sb-1.a_B/agent"),
            Ok(AgentUrl::node("http://10.0.0.5:7777", "sb-1.a_B"))
        );
        assert_eq!(
            parse("https://node.example:8443/v1/sandboxes/x/agent?ca=/etc/node/ca.pem"),
            Ok(AgentUrl::Node(Box::new(NodeUrl {
                base: "https://node.example:8443".into(),
                sandbox: "x".into(),
                tls_ca: Some("/etc/node/ca.pem".into()),
            })))
        );
    }

    #[test]
    fn node_endpoints_default_their_port_and_unbracket_ipv6() {
        let plain = NodeEndpoint::parse("http://node").unwrap();
        assert_eq!(
            (plain.tls, plain.host.as_str(), plain.port),
            (false, "node", 80)
        );
        let tls = NodeEndpoint::parse("https://[::1]:9").unwrap();
        assert_eq!((tls.tls, tls.host.as_str(), tls.port), (true, "::1", 9));
        assert_eq!(tls.authority, "[::1]:9");
        assert_eq!(NodeEndpoint::parse("https://[::1]").unwrap().port, 443);
    }

    #[test]
    fn node_urls_display_round_trip() {
        for url in [
            "http://127.0.0.1:7777/v1/sandboxes/a/agent",
            "https://[::1]:7777/v1/sandboxes/a-b/agent?ca=/x/ca.pem",
            "http://node/v1/sandboxes/z/agent",
        ] {
            assert_eq!(parse(url).unwrap().to_string(), url);
        }
    }

    #[test]
    fn agent_paths_round_trip_and_refuse_odd_ids() {
        assert_eq!(sandbox_of_agent_path(&agent_path("sb-7")), Some("sb-7"));
        for path in [
            "/v1/sandboxes//agent",
            "/v1/sandboxes/../agent",
            "/v1/sandboxes/a/b/agent",
            "/v1/sandboxes/a%20b/agent",
            "/v1/sandboxes/a/agent/",
            "/v1/sandboxes/a",
            "/v2/sandboxes/a/agent",
        ] {
            assert_eq!(sandbox_of_agent_path(path), None, "{path}");
        }
        let long = agent_path(&"a".repeat(MAX_SANDBOX_ID_BYTES + 1));
        assert_eq!(sandbox_of_agent_path(&long), None);
    }

    #[test]
    fn rejects_bad_node_urls() {
        let bad_address = |url: &str| {
            assert!(
                matches!(parse(url), Err(UrlError::BadNodeAddress { .. })),
                "{url}: {:?}",
                parse(url)
            );
        };
        bad_address("http://:7777/v1/sandboxes/a/agent");
        bad_address("http://h:99999/v1/sandboxes/a/agent");
        bad_address("http://h:x/v1/sandboxes/a/agent");
        bad_address("http://user:pw@h:1/v1/sandboxes/a/agent");
        bad_address("http://a:b:1/v1/sandboxes/a/agent");
        bad_address("http://[::1/v1/sandboxes/a/agent");
        bad_address("http://[nope]:1/v1/sandboxes/a/agent");
        assert_eq!(
            parse("http://h:1"),
            Err(UrlError::BadNodePath("http://h:1".into()))
        );
        assert_eq!(
            parse("http://h:1/v1/sandboxes/a/exec"),
            Err(UrlError::BadNodePath(
                "http://h:1/v1/sandboxes/a/exec".into()
            ))
        );
        // A CA file means nothing without TLS, and no other query is known.
        for url in [
            "http://h:1/v1/sandboxes/a/agent?ca=/x.pem",
            "https://h:1/v1/sandboxes/a/agent?ca=",
            "https://h:1/v1/sandboxes/a/agent?token=t",
        ] {
            assert_eq!(parse(url), Err(UrlError::BadNodeQuery(url.into())), "{url}");
        }
    }

    #[test]
    fn rejects_bad_urls() {
        assert_eq!(
            parse("/tmp/a.sock"),
            Err(UrlError::MissingScheme("/tmp/a.sock".into()))
        );
        assert_eq!(
            parse("tcp://1.2.3.4:5"),
            Err(UrlError::UnknownScheme("tcp".into()))
        );
        assert_eq!(parse("unix://"), Err(UrlError::EmptyPath("unix://".into())));
        assert_eq!(
            parse("vsock://3"),
            Err(UrlError::MissingPort("vsock://3".into()))
        );
        assert_eq!(
            parse("vsock://3:"),
            Err(UrlError::MissingPort("vsock://3:".into()))
        );
        assert_eq!(parse("vsock://-1:1024"), Err(UrlError::BadCid("-1".into())));
        assert_eq!(parse("vsock://x:1024"), Err(UrlError::BadCid("x".into())));
        assert_eq!(
            parse("vsock://3:99999999999"),
            Err(UrlError::BadPort("99999999999".into()))
        );
        assert_eq!(
            parse("hvsock://:1024"),
            Err(UrlError::EmptyPath("hvsock://:1024".into()))
        );
        assert_eq!(
            parse("hvsock:///run/vm.vsock"),
            Err(UrlError::MissingPort("hvsock:///run/vm.vsock".into()))
        );
    }
}
