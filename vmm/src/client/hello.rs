//! The handshake that opens every connection: `Hello` under id 0, one answer back.

use sandbox_protocol::frame::Decoded;
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, ErrorKind, Hello, HelloReply, RequestId,
    PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite};

use super::error::ClientError;

/// Sends `Hello` and reads the agent's answer: its hello reply, or a typed error.
pub(crate) async fn exchange<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    token: Option<String>,
) -> Result<HelloReply, ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hello = ClientFrame {
        id: RequestId::CONNECTION,
        msg: ClientMsg::Hello(Hello::new(token)),
    };
    writer.write(&hello).await.map_err(ClientError::HelloIo)?;
    let frame = match reader.read::<AgentFrame>().await {
        Ok(Some(Decoded::Frame(frame))) => frame,
        Ok(Some(Decoded::Rejected { error, .. })) => {
            return Err(ClientError::HelloUnexpected(format!(
                "undecodable frame: {error}"
            )))
        }
        Ok(None) => return Err(ClientError::HelloClosed),
        Err(error) => return Err(ClientError::HelloIo(error)),
    };
    if frame.id != RequestId::CONNECTION {
        return Err(ClientError::HelloUnexpected(format!(
            "frame under id {}",
            frame.id
        )));
    }
    match frame.msg {
        AgentMsg::Hello(reply) if reply.version == PROTOCOL_VERSION => Ok(reply),
        AgentMsg::Hello(reply) => Err(ClientError::VersionMismatch(
            sandbox_protocol::WireError::new(
                ErrorKind::VersionMismatch,
                format!(
                    "agent {} speaks protocol {}, this client speaks {PROTOCOL_VERSION}",
                    reply.agent_version, reply.version
                ),
            ),
        )),
        AgentMsg::Error(error) => Err(match error.kind {
            ErrorKind::VersionMismatch => ClientError::VersionMismatch(error),
            ErrorKind::Unauthorized => ClientError::Unauthorized(error),
            _ => ClientError::HelloRefused(error),
        }),
        other => Err(ClientError::HelloUnexpected(format!("{other:?}"))),
    }
}
