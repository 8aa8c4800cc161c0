//! [`RawConnection`]: frames built and read by hand, with no client in between, over
//! any byte stream to the agent (a Unix socket, hybrid vsock, …). The protocol-abuse
//! scenarios send it malformed input; the harness uses it for cleanup from `Drop`
//! (through [`on_own_thread`]), where the test's runtime may be gone or blocked.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use sandbox_protocol::frame::{encode, Decoded};
use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::transport::FrameReader;
use sandbox_protocol::{
    AgentFrame, AgentMsg, ClientFrame, ClientMsg, Hello, Reply, Request, RequestId, WireError,
};
use sandbox_vmm::client::hvsock;
use sandbox_vmm::error_chain;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::UnixStream;

use crate::within;

/// How long [`RawConnection::read`] waits for a frame before calling the connection
/// closed. Generous: a guest under TCG on a loaded host answers slowly.
const READ_SECS: u64 = 20;

/// A byte stream to the agent.
pub trait AgentStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AgentStream for T {}

/// A connection to the agent on which frames are written and read by hand.
pub struct RawConnection {
    reader: FrameReader<ReadHalf<Box<dyn AgentStream>>>,
    writer: WriteHalf<Box<dyn AgentStream>>,
}

impl std::fmt::Debug for RawConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConnection").finish_non_exhaustive()
    }
}

impl RawConnection {
    /// Wraps a connected stream; sends nothing.
    pub fn new(stream: Box<dyn AgentStream>) -> Self {
        let (read, writer) = tokio::io::split(stream);
        Self {
            reader: FrameReader::new(read, MAX_FRAME_BYTES),
            writer,
        }
    }

    /// Connects to an agent listening on a Unix socket; sends nothing.
    pub async fn unix(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", socket.display()));
        Self::new(Box::new(stream))
    }

    /// A raw connection to whatever `url` names (Unix or hybrid vsock sockets).
    pub async fn to(url: &sandbox_vmm::client::AgentUrl) -> Self {
        use sandbox_vmm::client::AgentUrl;
        match url {
            AgentUrl::Unix(path) => Self::unix(path).await,
            AgentUrl::Hvsock { path, port } => Self::hvsock(path, *port).await,
            AgentUrl::Vsock { .. } => panic!("raw vsock connections are not supported: {url}"),
            AgentUrl::Node(_) => Self::node(url, None).await,
        }
    }

    /// Connects to the guest's `port` through a hybrid vsock socket (`CONNECT`/`OK`);
    /// sends nothing else.
    pub async fn hvsock(socket: &Path, port: u32) -> Self {
        let mut stream = UnixStream::connect(socket)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", socket.display()));
        within(10, hvsock::handshake(&mut stream, port))
            .await
            .unwrap_or_else(|e| panic!("CONNECT {port} failed: {}", error_chain(&e)));
        Self::new(Box::new(stream))
    }

    /// Upgrades a node daemon's data-plane request (`url` an [`AgentUrl::Node`],
    /// `bearer` its token); sends nothing else.
    ///
    /// [`AgentUrl::Node`]: sandbox_vmm::client::AgentUrl::Node
    pub async fn node(url: &sandbox_vmm::client::AgentUrl, bearer: Option<&str>) -> Self {
        let options = sandbox_vmm::client::ConnectOptions {
            token: bearer.map(str::to_owned),
            ..Default::default()
        };
        match sandbox_vmm::Client::open_stream(url, &options).await {
            Ok(stream) => Self::new(Box::new(stream)),
            Err(error) => panic!("cannot upgrade {url}: {}", error_chain(&error)),
        }
    }

    /// Completes a valid handshake with `token`.
    pub async fn hello(mut self, token: Option<String>) -> Self {
        self.send(RequestId::CONNECTION.0, ClientMsg::Hello(Hello::new(token)))
            .await;
        let reply = self.read().await.expect("closed instead of a hello reply");
        assert!(matches!(reply.msg, AgentMsg::Hello(_)), "{reply:?}");
        self
    }

    /// Sends one well-formed frame.
    pub async fn send(&mut self, id: u64, msg: ClientMsg) {
        let frame = ClientFrame {
            id: RequestId(id),
            msg,
        };
        let bytes = encode(&frame, MAX_FRAME_BYTES).expect("cannot encode a frame");
        self.write(&bytes).await;
    }

    /// Sends raw bytes.
    pub async fn write(&mut self, bytes: &[u8]) {
        self.try_write(bytes).await.expect("write failed");
    }

    /// Sends raw bytes to an agent that may already have closed the connection.
    pub async fn try_write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes).await?;
        self.writer.flush().await
    }

    /// The next frame, or `None` once the agent closed the connection (a reset after
    /// the agent's last frame counts as closed).
    pub async fn read(&mut self) -> Option<AgentFrame> {
        match within(READ_SECS, self.reader.read::<AgentFrame>()).await {
            Ok(Some(Decoded::Frame(frame))) => Some(frame),
            Ok(Some(Decoded::Rejected { error, .. })) => panic!("agent sent a bad frame: {error}"),
            Ok(None) | Err(_) => None,
        }
    }

    /// The next frame, which must be an error; returns it with its id.
    pub async fn expect_error(&mut self) -> (RequestId, WireError) {
        let frame = self.read().await.expect("closed instead of an error");
        match frame.msg {
            AgentMsg::Error(error) => (frame.id, error),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// Sends `request` under `id` and returns its reply, skipping frames of other
    /// requests; panics on an error or a close.
    pub async fn call(&mut self, id: u64, request: Request) -> Reply {
        self.send(id, ClientMsg::Request(request)).await;
        loop {
            let frame = self.read().await.expect("closed instead of a reply");
            if frame.id != RequestId(id) {
                continue;
            }
            match frame.msg {
                AgentMsg::Reply(reply) => return reply,
                AgentMsg::Error(error) => panic!("request {id} failed: {error}"),
                _ => {}
            }
        }
    }

    /// Sends `ps` under `id` and asserts the connection still serves it.
    pub async fn assert_serves(&mut self, id: u64) {
        self.send(id, ClientMsg::Request(Request::Ps)).await;
        let frame = self.read().await.expect("connection closed");
        assert_eq!(frame.id, RequestId(id));
        assert!(
            matches!(frame.msg, AgentMsg::Reply(Reply::Ps(_))),
            "{frame:?}"
        );
    }
}

/// Runs `work` to its end on a thread of its own with a runtime of its own, giving up
/// after `limit`; returns whether it finished without panicking. For cleanup in
/// `Drop`, which may run inside a runtime (where blocking on another is forbidden) or
/// after it.
pub fn on_own_thread<F>(limit: Duration, work: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("cannot build a cleanup runtime");
        runtime.block_on(async { tokio::time::timeout(limit, work).await.is_ok() })
    })
    .join()
    .unwrap_or(false)
}
