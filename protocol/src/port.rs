//! Ports: a host-to-guest TCP connection, the mirror of egress.
//!
//! A host client reaches a server inside the guest (a dev server, Jupyter, an API
//! under test) by opening a connection of its own to the agent (a Unix or vsock
//! connection, a link channel, an upgraded node connection: whatever it dials for
//! requests) and turning it into a byte pipe:
//!
//! 1. `Hello` as on every connection, then [`Request::PortForward`](crate::Request)
//!    as the first and only request.
//! 2. The agent connects to the guest's `127.0.0.1:port` and answers
//!    [`Reply::Done`](crate::Reply::Done), or an error: [`ErrorKind::NotListening`]
//!    for a port with nothing on it, `Busy` past [`MAX_PORT_CONNECTIONS`].
//! 3. After a `Done` the connection carries the TCP stream's bytes both ways, and no
//!    more frames. A half close goes through (the client's write shutdown becomes the
//!    guest socket's `shutdown(SHUT_WR)`, and back); either side closing ends it; a
//!    pipe quiet both ways for [`PORT_IDLE_SECS`] is closed.
//!
//! Flow control is the transport's: a link channel's credit window
//! ([`crate::link::CHANNEL_WINDOW_BYTES`]), or the socket buffers of a Unix or vsock
//! connection. So a reader that stops reading stalls only its own pipe.
//!
//! [`ErrorKind::NotListening`]: crate::ErrorKind::NotListening

use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, WireError};

/// Port connections one agent keeps open at once; the next is answered `Busy`.
/// Counted within [`crate::link::MAX_CHANNELS`] on the link.
pub const MAX_PORT_CONNECTIONS: usize = 64;

/// A port pipe with no byte in either direction for this long is closed, so a
/// forgotten connection does not hold a slot forever. Long enough for a quiet
/// WebSocket or a notebook kernel between cells.
pub const PORT_IDLE_SECS: u64 = 15 * 60;

/// How long the agent waits for the guest's `connect` to `127.0.0.1:port`; on
/// loopback it is immediate unless the guest's listen backlog is full.
pub const PORT_CONNECT_SECS: u64 = 5;

/// The `Hello` capability of an agent that serves [`PortForwardRequest`].
pub const PORT_FORWARD_CAPABILITY: &str = "port_forward";

/// Connect this connection to the guest's `127.0.0.1:port` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortForwardRequest {
    /// The guest TCP port, 1..=65535 (0 is a `BadRequest`).
    pub port: u16,
}

/// The agent's answer for a port with nothing on it, worded once for every side.
pub fn not_listening(port: u16) -> WireError {
    WireError::new(
        ErrorKind::NotListening,
        format!("nothing is listening on guest port {port}"),
    )
}
