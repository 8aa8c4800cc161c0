//! What can go wrong talking to an agent.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::frame::FrameError;
use sandbox_protocol::{ErrorKind, WireError};

use super::connect::{AgentUrl, UrlError};
use super::hvsock::HvsockError;
#[cfg(feature = "node")]
use super::node::NodeError;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent URL could not be parsed.
    #[error("Invalid agent URL")]
    Url(#[from] UrlError),
    /// Dialing the agent's socket failed.
    #[error("Cannot connect to {url}")]
    Connect {
        /// Where we dialed.
        url: AgentUrl,
        /// What the socket said.
        #[source]
        error: io::Error,
    },
    /// The hybrid-vsock `CONNECT` handshake failed.
    #[error("Hybrid vsock handshake on {} failed", path.display())]
    Hvsock {
        /// The VMM's Unix socket.
        path: PathBuf,
        /// What went wrong.
        #[source]
        error: HvsockError,
    },
    /// The node daemon answered the upgrade request with an HTTP error (a refused
    /// token, an unknown sandbox, a draining node).
    #[error("Node refused {url}: {status} {code}: {message}")]
    NodeRefused {
        /// The node URL.
        url: AgentUrl,
        /// The HTTP status.
        status: u16,
        /// The daemon's error code (`error.code` of its JSON body); empty when the
        /// body was not the daemon's JSON.
        code: String,
        /// The daemon's message (`error.message`), or the start of a body that was
        /// not its JSON.
        message: String,
    },
    /// Reaching the node daemon failed before it answered (TLS, a broken or
    /// oversize HTTP answer, an upgrade to another protocol).
    #[cfg(feature = "node")]
    #[error("Upgrade at {url} failed")]
    Node {
        /// The node URL.
        url: AgentUrl,
        /// What went wrong (boxed: rustls's errors would double the size of every
        /// `Result` of this crate).
        #[source]
        error: Box<NodeError>,
    },
    /// A node URL was given to a build without the `node` feature.
    #[cfg(not(feature = "node"))]
    #[error("{url} names a node daemon; this build has no `node` feature")]
    NodeUnsupported {
        /// The node URL.
        url: AgentUrl,
    },
    /// The URL names no agent this side can splice to (a node's data plane splices
    /// to local agents only).
    #[error("{url} is not a local agent")]
    NotLocal {
        /// The URL.
        url: AgentUrl,
    },
    /// Connecting and the handshake together took longer than allowed.
    #[error("Timed out connecting to {url} after {timeout:?}")]
    ConnectTimeout {
        /// Where we dialed.
        url: AgentUrl,
        /// The limit in force.
        timeout: Duration,
    },
    /// [`super::Client::connect_with_retry`] gave up at its deadline.
    #[error("Agent at {url} not ready after {attempts} attempts")]
    NotReady {
        /// Where we dialed.
        url: AgentUrl,
        /// How many connects were tried.
        attempts: u32,
        /// The last attempt's failure.
        #[source]
        last: Box<ClientError>,
    },
    /// Reading or writing the handshake failed.
    #[error("Handshake I/O failed")]
    HelloIo(#[source] io::Error),
    /// The agent closed the connection instead of answering `Hello`.
    #[error("Agent closed the connection during the handshake")]
    HelloClosed,
    /// The agent answered `Hello` with something that is not a hello reply.
    #[error("Unexpected answer to hello: {0}")]
    HelloUnexpected(String),
    /// The agent speaks another protocol version (or reported it speaks one).
    #[error("Agent speaks another protocol version")]
    VersionMismatch(#[source] WireError),
    /// The token was missing or wrong.
    #[error("Agent refused the token")]
    Unauthorized(#[source] WireError),
    /// The agent refused the handshake for another reason.
    #[error("Agent refused the handshake")]
    HelloRefused(#[source] WireError),
    /// A port connection needs a new connection to the agent, and this client was
    /// made over a stream it cannot open again ([`super::Client::over_stream`]).
    #[error("This client cannot open another connection to its agent (it was made over a stream)")]
    CannotRedial,
    /// The agent answered the request with an error.
    #[error(transparent)]
    Agent(#[from] WireError),
    /// The request could not be encoded (for example it is over the frame limit).
    #[error("Cannot encode request")]
    Encode(#[source] FrameError),
    /// The agent sent a frame for this request that could not be decoded.
    #[error("Cannot decode the agent's answer")]
    Decode(#[source] FrameError),
    /// The connection is gone; every pending request fails with this.
    #[error("Connection to the agent lost: {reason}")]
    ConnectionLost {
        /// What ended it.
        reason: Arc<str>,
    },
    /// `next` was called again after the final reply or error.
    #[error("The {request} request already finished")]
    Finished {
        /// The request.
        request: &'static str,
    },
    /// Reading or writing a local file for a `put` or `get` failed.
    #[error("Cannot {what}")]
    Local {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// The agent answered with a reply of the wrong type for the request.
    #[error("Unexpected reply to {request}: {got}")]
    UnexpectedReply {
        /// The request that was sent.
        request: &'static str,
        /// What came back, debug-formatted.
        got: String,
    },
}

impl ClientError {
    /// The agent's error kind, when the agent reported the failure.
    pub fn wire_kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Agent(error)
            | Self::VersionMismatch(error)
            | Self::Unauthorized(error)
            | Self::HelloRefused(error) => Some(error.kind),
            _ => None,
        }
    }

    /// True for failures that may go away by trying again: the socket is not there
    /// yet, the VMM has no guest listener yet, the agent hung up while booting.
    /// Bad URLs, version mismatches and refused tokens never retry.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. }
            | Self::Hvsock { .. }
            | Self::ConnectTimeout { .. }
            | Self::HelloIo(_)
            | Self::HelloClosed
            | Self::ConnectionLost { .. } => true,
            // The node is busy or the sandbox not ready yet; a proxy in front of it
            // is restarting.
            Self::NodeRefused { status, .. } => matches!(status, 502..=504 | 429),
            Self::HelloRefused(error) => error.kind == ErrorKind::Busy,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_errors_keep_their_kind() {
        let err = ClientError::from(WireError::new(ErrorKind::NotFound, "no such pid 9"));
        assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound));
        assert_eq!(err.to_string(), "not_found: no such pid 9");
        assert!(!err.is_retryable());
    }

    #[test]
    fn refused_tokens_do_not_retry_but_lost_connections_do() {
        let refused = ClientError::Unauthorized(WireError::new(ErrorKind::Unauthorized, "bad"));
        assert!(!refused.is_retryable());
        let lost = ClientError::ConnectionLost {
            reason: "reset".into(),
        };
        assert!(lost.is_retryable());
    }
}
