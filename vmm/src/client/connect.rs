//! Agent URLs and dialing them.
//!
//! - `unix:///run/agent.sock`: a Unix socket (the agent on this machine, or a VMM
//!   that forwards one).
//! - `vsock://CID:PORT`: an `AF_VSOCK` stream to a guest (vhost-vsock, QEMU).
//! - `hvsock:///run/vm.vsock:1024`: hybrid vsock (Firecracker, Cloud Hypervisor,
//!   vhost-device-vsock): the VMM's Unix socket plus the guest port, reached with the
//!   `CONNECT` handshake in [`super::hvsock`].

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
}

/// Why a string is not an agent URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// No `scheme://` at the start.
    #[error("{0:?} has no scheme; expected unix://PATH, vsock://CID:PORT or hvsock://PATH:PORT")]
    MissingScheme(String),
    /// A scheme other than `unix`, `vsock` or `hvsock`.
    #[error("Unknown scheme {0:?}; expected unix, vsock or hvsock")]
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
            other => Err(UrlError::UnknownScheme(other.to_owned())),
        }
    }
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
        }
    }
}

/// Any byte stream the client can run over.
pub trait AgentStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AgentStream for T {}

/// Opens a byte stream to the agent (no timeout: the caller bounds it).
pub(crate) async fn dial(url: &AgentUrl) -> Result<Box<dyn AgentStream>, ClientError> {
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
