//! Port pipes: a byte stream to a TCP port inside the guest (see
//! `sandbox_protocol::port` for the wire).
//!
//! [`Client::dial_port`] opens a connection of its own, the way the client was made
//! (a Unix socket, a relay's link channel, vsock, a node's upgrade), says `Hello`,
//! asks for the port, and hands back a [`PortStream`] once the agent has connected.
//! The client's other requests never share that connection: after the agent's
//! `Done` the connection carries only the TCP stream's bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use sandbox_protocol::frame::Decoded;
use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, ErrorKind, PortForwardRequest, Reply, Request,
    RequestId,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connect::{self, AgentStream, AgentUrl};
use super::error::ClientError;
use super::{hello, Client, ConnectOptions};

/// The request id of the one request a port connection carries.
const PORT_REQUEST_ID: RequestId = RequestId(1);

/// How a client reaches its agent again, for connections of their own.
#[derive(Clone)]
pub(crate) struct Redial {
    pub(crate) url: AgentUrl,
    pub(crate) opts: ConnectOptions,
}

impl std::fmt::Debug for Redial {
    // The token stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redial").field("url", &self.url).finish()
    }
}

/// A TCP connection to a guest port, as a byte stream. Reads return what the guest
/// server sent; `shutdown` is a half close (the server reads an end of stream and
/// may still answer); dropping it closes the connection.
pub struct PortStream {
    /// Bytes the agent sent right after its `Done`, read with it.
    early: Vec<u8>,
    /// How much of `early` has been returned.
    at: usize,
    inner: Box<dyn AgentStream>,
    port: u16,
}

impl std::fmt::Debug for PortStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortStream")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl PortStream {
    /// The guest port this stream reaches.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.early.len() {
            let n = out.remaining().min(this.early.len() - this.at);
            out.put_slice(&this.early[this.at..this.at + n]);
            this.at += n;
            if this.at == this.early.len() {
                this.early = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Client {
    /// Opens a TCP connection to the guest's `127.0.0.1:port`, bounded by the
    /// connect timeout this client was made with. Nothing listening there is
    /// [`ClientError::Agent`] with kind [`ErrorKind::NotListening`]; past the agent's
    /// cap on port connections, kind `Busy`. Needs a client made by
    /// [`Client::connect`] (one made over a stream cannot open another).
    pub async fn dial_port(&self, port: u16) -> Result<PortStream, ClientError> {
        let redial = self.redial.as_deref().ok_or(ClientError::CannotRedial)?;
        let timeout = redial.opts.connect_timeout;
        match tokio::time::timeout(timeout, open(redial, port)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::ConnectTimeout {
                url: redial.url.clone(),
                timeout,
            }),
        }
    }
}

/// Dial, hello, ask for the port, read the answer.
async fn open(redial: &Redial, port: u16) -> Result<PortStream, ClientError> {
    let stream = connect::dial(&redial.url, redial.opts.token.as_deref()).await?;
    let hello_token = match redial.url {
        AgentUrl::Node(_) => None,
        _ => redial.opts.token.clone(),
    };
    let (read, write) = tokio::io::split(stream);
    let mut reader = FrameReader::new(read, MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, MAX_FRAME_BYTES);
    hello::exchange(&mut reader, &mut writer, hello_token).await?;
    let ask = ClientFrame {
        id: PORT_REQUEST_ID,
        msg: ClientMsg::Request(Request::PortForward(PortForwardRequest { port })),
    };
    writer.write(&ask).await.map_err(lost)?;
    let answer = loop {
        match reader.read::<AgentFrame>().await.map_err(lost)? {
            None => return Err(lost("the agent closed the connection before answering")),
            Some(Decoded::Rejected { error, .. }) => return Err(ClientError::Decode(error)),
            // A connection-level notice (id 0) ends the connection; anything else
            // under another id is not for us.
            Some(Decoded::Frame(AgentFrame { id, msg })) if id == PORT_REQUEST_ID => break msg,
            Some(Decoded::Frame(AgentFrame {
                msg: AgentMsg::Error(error),
                ..
            })) => return Err(ClientError::Agent(error)),
            Some(Decoded::Frame(_)) => {}
        }
    };
    match answer {
        AgentMsg::Reply(Reply::Done) => {}
        AgentMsg::Error(error) => return Err(ClientError::Agent(error)),
        other => {
            return Err(ClientError::UnexpectedReply {
                request: "port_forward",
                got: format!("{other:?}"),
            })
        }
    }
    let (read, early) = reader.into_parts();
    let write = writer.into_inner();
    Ok(PortStream {
        early,
        at: 0,
        inner: read.unsplit(write),
        port,
    })
}

fn lost(reason: impl std::fmt::Display) -> ClientError {
    ClientError::ConnectionLost {
        reason: reason.to_string().into(),
    }
}

/// True when `error` says nothing listens on the guest port.
pub fn is_not_listening(error: &ClientError) -> bool {
    error.wire_kind() == Some(ErrorKind::NotListening)
}
