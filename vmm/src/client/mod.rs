//! The async agent client: one connection, many concurrent requests.
//!
//! # Layout
//! - [`connect`]: agent URLs (`unix://`, `vsock://`, `hvsock://`) and dialing them.
//! - [`hvsock`]: the hybrid-vsock `CONNECT` handshake.
//! - [`node`] (feature `node`): a sandbox behind a node daemon, reached with an
//!   HTTP/1.1 `Upgrade` over TCP or TLS.
//! - `hello`: the protocol handshake (`Hello` under id 0).
//! - `mux`: the writer task, the reader task that routes frames by request id, and
//!   the pending-request table.
//! - [`stream`]: handles for requests in flight; dropping one sends `Cancel`.
//! - `files`: the file operations (write, read, list, stat, put/get streams).
//! - `eval`: interpreter sessions (`eval`, `close_session`).
//! - `machine`: requests about the whole guest (`info`, `resumed`, `shutdown`).
//! - `confinement`: how the agent confines processes, `ps_detail`, OOM kills.
//! - [`port`]: [`Client::dial_port`], a byte stream to a guest TCP port on a
//!   connection of its own.
//! - `wait`: `wait_for_text`, until a guest file or a process's output holds a string.
//! - [`error`]: [`ClientError`], which carries the agent's `WireError` as a variant.
//!
//! [`Client`] is an `Arc` around the connection: clone it into as many tasks as you
//! like; they all share one byte stream. When the stream ends, every pending request
//! fails with [`ClientError::ConnectionLost`]; connect again for a new one.

mod confinement;
pub mod connect;
pub mod error;
mod eval;
mod files;
mod hello;
pub mod hvsock;
mod machine;
mod mux;
#[cfg(feature = "node")]
pub mod node;
pub mod port;
pub mod stream;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::transport::{FrameReader, FrameWriter};
use sandbox_protocol::{
    ExecReply, ExecRequest, HelloReply, KillRequest, LogsReply, LogsRequest, Pid, ProcessInfo,
    ProcessSpec, PtyInputRequest, PtyOpenRequest, PtyResizeRequest, Reply, Request, SpawnRequest,
    WindowSize,
};
use tokio::time::Instant;

pub use connect::{AgentStream, AgentUrl, NodeEndpoint, NodeUrl, UrlError, NODE_UPGRADE_TOKEN};
pub use error::ClientError;
pub use hvsock::HvsockError;
pub use port::PortStream;
pub use stream::{ExecEvent, ExecStream, LogsEvent, LogsStream, RequestStream, Step};

use mux::Connection;

/// Default bound on dialing plus the handshake.
pub const CONNECT_TIMEOUT_SECS: u64 = 10;

/// First pause between attempts of [`Client::connect_with_retry`]; it doubles.
const RETRY_FIRST_PAUSE_MS: u64 = 10;

/// Longest pause between attempts of [`Client::connect_with_retry`].
const RETRY_MAX_PAUSE_MS: u64 = 250;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The agent's shared secret, when it requires one. For an [`AgentUrl::Node`] it
    /// is the node daemon's token instead (operator or per-sandbox), sent as
    /// `Authorization: Bearer`; the `Hello` then carries none, as the daemon gives
    /// the agent its own (the node's tokens never reach a guest).
    pub token: Option<String>,
    /// Bound on dialing plus the handshake, per attempt.
    pub connect_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            token: None,
            connect_timeout: Duration::from_secs(CONNECT_TIMEOUT_SECS),
        }
    }
}

/// A handshaken connection to an agent. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    conn: Arc<Connection>,
    /// How to open another connection (for [`Client::dial_port`]); `None` for a
    /// client made over a stream.
    redial: Option<Arc<port::Redial>>,
}

impl Client {
    /// Dials `url`, says hello, and starts the connection's tasks; bounded by
    /// `opts.connect_timeout`.
    pub async fn connect(url: &AgentUrl, opts: &ConnectOptions) -> Result<Self, ClientError> {
        let attempt = async {
            let stream = connect::dial(url, opts.token.as_deref()).await?;
            let hello_token = match url {
                AgentUrl::Node(_) => None,
                _ => opts.token.clone(),
            };
            let client = Self::over_stream(stream, hello_token).await?;
            Ok(Self {
                redial: Some(Arc::new(port::Redial {
                    url: url.clone(),
                    opts: opts.clone(),
                })),
                ..client
            })
        };
        match tokio::time::timeout(opts.connect_timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::ConnectTimeout {
                url: url.clone(),
                timeout: opts.connect_timeout,
            }),
        }
    }

    /// Opens a raw byte stream to whatever `url` names (for a node, the upgraded
    /// connection, `opts.token` as its Bearer), bounded by `opts.connect_timeout`;
    /// nothing of the agent protocol is sent. For tools that speak frames by hand.
    pub async fn open_stream(
        url: &AgentUrl,
        opts: &ConnectOptions,
    ) -> Result<Box<dyn AgentStream>, ClientError> {
        match tokio::time::timeout(
            opts.connect_timeout,
            connect::dial(url, opts.token.as_deref()),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ClientError::ConnectTimeout {
                url: url.clone(),
                timeout: opts.connect_timeout,
            }),
        }
    }

    /// Like [`Self::connect`], but keeps trying until `deadline` while the failure is
    /// one that goes away once the agent is up (a booting VM refuses or resets early
    /// connects). Bad URLs, version mismatches and refused tokens fail at once.
    pub async fn connect_with_retry(
        url: &AgentUrl,
        opts: &ConnectOptions,
        deadline: Instant,
    ) -> Result<Self, ClientError> {
        let mut attempts = 0u32;
        let mut pause = Duration::from_millis(RETRY_FIRST_PAUSE_MS);
        loop {
            attempts += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt_opts = ConnectOptions {
                token: opts.token.clone(),
                connect_timeout: opts.connect_timeout.min(left),
            };
            let error = match Self::connect(url, &attempt_opts).await {
                Ok(client) => return Ok(client),
                Err(error) if !error.is_retryable() => return Err(error),
                Err(error) => error,
            };
            if Instant::now() + pause >= deadline {
                return Err(ClientError::NotReady {
                    url: url.clone(),
                    attempts,
                    last: Box::new(error),
                });
            }
            tracing::debug!(%url, attempts, %error, "agent not ready yet");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(RETRY_MAX_PAUSE_MS));
        }
    }

    /// Runs the protocol over an already open byte stream (a virtio-serial port, a
    /// socket the caller dialed itself). Not bounded in time: wrap it in a timeout.
    pub async fn over_stream<S: AgentStream>(
        stream: S,
        token: Option<String>,
    ) -> Result<Self, ClientError> {
        let (read, write) = tokio::io::split(stream);
        let mut reader = FrameReader::new(read, MAX_FRAME_BYTES);
        let mut writer = FrameWriter::new(write, MAX_FRAME_BYTES);
        let hello = hello::exchange(&mut reader, &mut writer, token).await?;
        Ok(Self {
            conn: Connection::start(hello, reader, writer),
            redial: None,
        })
    }

    /// The agent's answer to our hello: its version, boot id and capabilities.
    pub fn hello(&self) -> &HelloReply {
        self.conn.hello()
    }

    /// Why the connection is gone, or `None` while it is up.
    pub fn closed_reason(&self) -> Option<Arc<str>> {
        self.conn.closed_reason()
    }

    /// Sends any request and returns its raw event stream (the escape hatch).
    pub fn stream(&self, request: Request) -> Result<RequestStream, ClientError> {
        let what = request_name(&request);
        self.conn.start_request(request, what)
    }

    /// Sends any request and returns its final reply; events are discarded.
    pub async fn request(&self, request: Request) -> Result<Reply, ClientError> {
        self.stream(request)?.reply().await
    }

    /// Runs a command to completion and returns its collected output.
    pub async fn exec(&self, mut request: ExecRequest) -> Result<ExecReply, ClientError> {
        request.stream = false;
        match self.request(Request::Exec(request)).await? {
            Reply::Exec(reply) => Ok(reply),
            other => Err(unexpected("exec", other)),
        }
    }

    /// Runs a command and streams its output: `Started`, `Output`…, `Finished`.
    pub fn exec_stream(&self, mut request: ExecRequest) -> Result<ExecStream, ClientError> {
        request.stream = true;
        Ok(ExecStream::new(self.stream(Request::Exec(request))?))
    }

    /// Starts a detached process; its output goes to its ring.
    pub async fn spawn(&self, spec: ProcessSpec) -> Result<Pid, ClientError> {
        match self.request(Request::Spawn(SpawnRequest { spec })).await? {
            Reply::Spawned(pid) => Ok(pid),
            other => Err(unexpected("spawn", other)),
        }
    }

    /// Replays a process's output from `cursor` (`None`: the oldest byte held).
    pub async fn logs(&self, pid: Pid, cursor: Option<u64>) -> Result<LogsReply, ClientError> {
        let request = Request::Logs(LogsRequest {
            pid,
            cursor,
            follow: false,
        });
        match self.request(request).await? {
            Reply::Logs(reply) => Ok(reply),
            other => Err(unexpected("logs", other)),
        }
    }

    /// Replays and then follows a process's output until it ends and is drained.
    pub fn logs_follow(&self, pid: Pid, cursor: Option<u64>) -> Result<LogsStream, ClientError> {
        let request = Request::Logs(LogsRequest {
            pid,
            cursor,
            follow: true,
        });
        Ok(LogsStream::new(self.stream(request)?))
    }

    /// Every tracked process.
    pub async fn ps(&self) -> Result<Vec<ProcessInfo>, ClientError> {
        match self.request(Request::Ps).await? {
            Reply::Ps(list) => Ok(list),
            other => Err(unexpected("ps", other)),
        }
    }

    /// Sends `signal` (`1..=MAX_SIGNAL`; the agent refuses 0) to a tracked process's group.
    pub async fn kill(&self, pid: Pid, signal: i32) -> Result<(), ClientError> {
        let request = Request::Kill(KillRequest { pid, signal });
        self.expect_done("kill", request).await
    }

    /// Opens a terminal; read it with [`Self::logs_follow`].
    pub async fn pty_open(&self, request: PtyOpenRequest) -> Result<Pid, ClientError> {
        match self.request(Request::PtyOpen(request)).await? {
            Reply::PtyOpened(pid) => Ok(pid),
            other => Err(unexpected("pty_open", other)),
        }
    }

    /// Types `data` into a terminal.
    pub async fn pty_input(&self, pid: Pid, data: impl Into<Vec<u8>>) -> Result<(), ClientError> {
        let request = Request::PtyInput(PtyInputRequest {
            pid,
            data: data.into(),
        });
        self.expect_done("pty_input", request).await
    }

    /// Resizes a terminal; its process gets `SIGWINCH`.
    pub async fn pty_resize(&self, pid: Pid, size: WindowSize) -> Result<(), ClientError> {
        let request = Request::PtyResize(PtyResizeRequest { pid, size });
        self.expect_done("pty_resize", request).await
    }

    pub(crate) async fn expect_done(
        &self,
        what: &'static str,
        request: Request,
    ) -> Result<(), ClientError> {
        match self.request(request).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(what, other)),
        }
    }
}

fn unexpected(request: &'static str, got: Reply) -> ClientError {
    ClientError::UnexpectedReply {
        request,
        got: format!("{got:?}"),
    }
}

/// A short name for a request, used in error messages.
fn request_name(request: &Request) -> &'static str {
    request.name()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::frame::Decoded;
    use sandbox_protocol::{AgentFrame, AgentMsg, ClientFrame, RequestId, PROTOCOL_VERSION};

    fn socket_path(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sandbox-retry-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("agent.sock")
    }

    /// Binds `path` after `delay` and answers one hello, like an agent that boots late.
    async fn late_agent(path: std::path::PathBuf, delay: Duration) {
        tokio::time::sleep(delay).await;
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let (read, write) = tokio::io::split(stream);
        let mut reader = FrameReader::new(read, MAX_FRAME_BYTES);
        let mut writer = FrameWriter::new(write, MAX_FRAME_BYTES);
        let Some(Decoded::Frame(_hello)) = reader.read::<ClientFrame>().await.unwrap() else {
            panic!("no hello");
        };
        let reply = HelloReply {
            version: PROTOCOL_VERSION,
            agent_version: "late".into(),
            boot_id: "b".into(),
            capabilities: vec!["pty".into()],
        };
        writer
            .write(&AgentFrame {
                id: RequestId::CONNECTION,
                msg: AgentMsg::Hello(reply),
            })
            .await
            .unwrap();
        // Keep the connection open until the client is done.
        let _ = reader.read::<ClientFrame>().await;
    }

    #[tokio::test]
    async fn retry_waits_for_an_agent_that_comes_up_late() {
        let path = socket_path("late");
        let url = AgentUrl::Unix(path.clone());
        let agent = tokio::spawn(late_agent(path.clone(), Duration::from_millis(300)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = Client::connect_with_retry(&url, &ConnectOptions::default(), deadline)
            .await
            .unwrap();
        assert_eq!(client.hello().agent_version, "late");
        assert_eq!(client.hello().capabilities, ["pty"]);
        drop(client);
        agent.await.unwrap();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[tokio::test]
    async fn retry_gives_up_at_the_deadline_with_the_last_error() {
        let path = socket_path("never");
        let url = AgentUrl::Unix(path.clone());
        let started = std::time::Instant::now();
        let deadline = Instant::now() + Duration::from_millis(300);
        let err = Client::connect_with_retry(&url, &ConnectOptions::default(), deadline)
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        match err {
            ClientError::NotReady { attempts, last, .. } => {
                assert!(attempts > 1);
                assert!(matches!(*last, ClientError::Connect { .. }), "{last:?}");
            }
            other => panic!("expected NotReady, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
