//! `port_forward`: a byte stream to `127.0.0.1:PORT` inside the guest.
//!
//! Not served yet: this node's link has no host-to-guest TCP channel for it to
//! ride, so the op answers `unimplemented` (the SDK's typed error), never a hang.

use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::{AgentSource, ErrorKind, OpError};

pub async fn forward<S, R, W>(_conn: &mut Conn<'_, S, R, W>, port: u16) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    Err(OpError::reply(
        ErrorKind::Unimplemented,
        format!("port_forward to guest port {port} is not served by this node yet"),
    ))
}
