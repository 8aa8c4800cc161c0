//! One silkd connection: read a request, run it, answer, repeat.
//!
//! Frames that feed a request (`stdin`, `stdin_close`, `data`, `data_end`) are read
//! by the op they belong to. One that arrives between requests is ignored, never
//! answered: the SDK sends `stdin_close` after every `exec` even when the exec was
//! refused at once, and an answer to it would land on the client's next request.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};

use super::frames::{self, ReadError, Request, Response};
use super::{
    exec, files, ports, pty, search, sessions, tree, watch, AgentSource, ErrorKind, OpError,
    KEEP_ALIVE_PROTO,
};
use sandbox_vmm::client::Client;

/// Read buffer per connection; lines longer than this are assembled across fills.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A connection being served: the client's two halves and where the agent is.
#[derive(Debug)]
pub struct Conn<'a, S, R, W> {
    pub source: &'a S,
    pub input: BufReader<R>,
    pub out: W,
    line: Vec<u8>,
}

/// Serves silkd frames on `client` until it ends; errors of single requests are
/// answered, a broken connection is returned.
pub async fn serve<S, C>(source: &S, client: C) -> Result<(), OpError>
where
    S: AgentSource,
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (read, write) = tokio::io::split(client);
    let mut conn = Conn {
        source,
        input: BufReader::with_capacity(READ_BUFFER_BYTES, read),
        out: write,
        line: Vec::new(),
    };
    loop {
        let request = match conn.next_request().await {
            Ok(Some(request)) => request,
            Ok(None) => return Ok(()),
            Err(OpError::Reply { kind, message }) => {
                conn.send(&Response::error(kind, message)).await?;
                continue;
            }
            Err(error) => return conn.fail(error).await,
        };
        if request.is_continuation() {
            tracing::debug!(?request, "a continuation frame outside a request, ignored");
            continue;
        }
        match dispatch(&mut conn, request).await {
            Ok(()) => {}
            Err(OpError::Reply { kind, message }) => {
                conn.send(&Response::error(kind, message)).await?;
            }
            Err(error) => return conn.fail(error).await,
        }
    }
}

async fn dispatch<S, R, W>(conn: &mut Conn<'_, S, R, W>, request: Request) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match request {
        Request::Info => info(conn).await,
        Request::Exec(exec) => exec::exec(conn, exec).await,
        Request::Ps => exec::ps(conn).await,
        Request::Kill { pid, signal } => exec::kill(conn, pid, signal).await,
        Request::Logs { pid } => exec::logs(conn, pid).await,
        Request::Attach { pid } => exec::attach(conn, pid).await,
        Request::FsWrite { path, mode } => files::write(conn, &path, mode).await,
        Request::FsRead { path } => files::read(conn, &path).await,
        Request::FsList { path } => files::list(conn, &path).await,
        Request::FsStat { path } => files::stat(conn, &path).await,
        Request::FsMkdir { path, parents } => {
            files::mkdir(conn, &path, parents.unwrap_or(false)).await
        }
        Request::FsRm { path, recursive } => {
            files::remove(conn, &path, recursive.unwrap_or(false)).await
        }
        Request::FsRename { from, to } => files::rename(conn, &from, &to).await,
        Request::FsPush { dest } => tree::push(conn, &dest).await,
        Request::FsPull { path } => tree::pull(conn, &path).await,
        Request::FsFind {
            path,
            pattern,
            glob,
        } => search::find(conn, &path, &pattern, glob.as_deref()).await,
        Request::FsReplace {
            files,
            pattern,
            replacement,
        } => search::replace(conn, &files, &pattern, &replacement).await,
        Request::FsWatch { path, recursive } => {
            watch::watch(conn, &path, recursive.unwrap_or(false)).await
        }
        Request::SessionCreate { id, cwd, env } => {
            sessions::create(conn, id, cwd, env.unwrap_or_default()).await
        }
        Request::SessionList => sessions::list(conn).await,
        Request::SessionRm { id } => sessions::remove(conn, &id).await,
        Request::PtyOpen(request) => pty::open(conn, request).await,
        Request::PtyResize { pid, cols, rows } => pty::resize(conn, pid, cols, rows).await,
        Request::PortForward { port } => ports::forward(conn, port).await,
        Request::Stdin { .. } | Request::StdinClose | Request::Data { .. } | Request::DataEnd => {
            Ok(())
        }
    }
}

async fn info<S, R, W>(conn: &mut Conn<'_, S, R, W>) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let agent = client
        .info()
        .await
        .map_err(|error| OpError::agent("info", &error))?;
    let sessions = sessions::names(&client).await?.len();
    let procs = client
        .ps()
        .await
        .map_err(|error| OpError::agent("ps", &error))?
        .len();
    conn.send(&Response::Info {
        version: format!(
            "sandboxd {} (agent {})",
            env!("CARGO_PKG_VERSION"),
            agent.agent_version
        ),
        proto: KEEP_ALIVE_PROTO,
        uptime_secs: agent.uptime_ms / 1000,
        procs,
        sessions,
    })
    .await
}

impl<'a, S, R, W> Conn<'a, S, R, W>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    /// The agent's client for this op. (A future over the source alone, not over
    /// `self`: the connection's halves are `Send` but not `Sync`.)
    pub fn client(&self) -> impl std::future::Future<Output = Result<Client, OpError>> + Send + 'a {
        let source: &'a S = self.source;
        source.client()
    }

    /// Writes one frame; a client that cannot take it has gone.
    pub async fn send(&mut self, response: &Response) -> Result<(), OpError> {
        frames::write(&mut self.out, response)
            .await
            .map_err(OpError::Client)
    }

    /// The next frame, `None` at a clean end of stream. A line that does not parse
    /// is an [`OpError::Reply`]; a broken stream an [`OpError::Framing`].
    pub async fn next_request(&mut self) -> Result<Option<Request>, OpError> {
        if !frames::read_line(&mut self.input, &mut self.line).await? {
            return Ok(None);
        }
        frames::parse(&self.line)
            .map(Some)
            .map_err(|error| OpError::reply(error.kind(), error.to_string()))
    }

    /// The next frame of an upload in progress: `data` bytes, or `None` at
    /// `data_end`. The stream ending first is a truncated upload.
    pub async fn next_data(&mut self) -> Result<Option<Vec<u8>>, OpError> {
        match self.next_request().await? {
            Some(Request::Data { data }) => Ok(Some(data)),
            Some(Request::DataEnd) => Ok(None),
            Some(_) => Err(OpError::bad_request("expected data or data_end")),
            None => Err(OpError::Framing(ReadError::Truncated)),
        }
    }

    /// Resolves once the client has sent something or hung up; for ops that
    /// stream to the client and must stop when it goes. Cancel-safe.
    pub async fn client_spoke(&mut self) -> Result<(), OpError> {
        self.input
            .fill_buf()
            .await
            .map(|_| ())
            .map_err(OpError::Client)
    }

    /// Whether the client hung up (after [`Self::client_spoke`] resolved): the
    /// frame it sent instead is read and dropped.
    pub async fn client_gone(&mut self) -> Result<bool, OpError> {
        match self.next_request().await {
            Ok(None) => Ok(true),
            Ok(Some(_)) | Err(OpError::Reply { .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Ends the connection after a framing error, telling the client why when it
    /// still listens.
    async fn fail(&mut self, error: OpError) -> Result<(), OpError> {
        if let OpError::Framing(read) = &error {
            let message = read.to_string();
            let _ = self
                .send(&Response::error(ErrorKind::BadRequest, message))
                .await;
        }
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::silkd::MAX_FRAME_BYTES;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A sandbox whose agent cannot be reached: every op that needs it fails.
    struct Unreachable;

    impl AgentSource for Unreachable {
        async fn client(&self) -> Result<Client, OpError> {
            Err(OpError::reply(ErrorKind::Internal, "no agent here"))
        }
    }

    /// Serves `input` and returns everything answered.
    async fn answers(input: Vec<u8>) -> (Result<(), OpError>, String) {
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { serve(&Unreachable, ours).await });
        let writer = tokio::spawn(async move {
            let _ = peer.write_all(&input).await;
            let _ = peer.shutdown().await;
            let mut out = Vec::new();
            let _ = peer.read_to_end(&mut out).await;
            out
        });
        let result = server.await.unwrap();
        let out = writer.await.unwrap();
        (result, String::from_utf8(out).unwrap())
    }

    #[tokio::test]
    async fn bad_frames_are_answered_one_error_each_and_the_connection_serves_on() {
        let input = b"{nope\n{\"v\":1,\"op\":\"lsp_start\"}\n{\"v\":1,\"op\":\"stdin_close\"}\n{\"v\":1,\"op\":\"ps\"}\n".to_vec();
        let (result, out) = answers(input).await;
        assert!(result.is_ok(), "{result:?}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].contains("\"kind\":\"bad_request\""), "{out}");
        assert!(lines[1].contains("\"kind\":\"unimplemented\""), "{out}");
        assert!(
            lines[2].contains("\"kind\":\"internal\"") && lines[2].contains("no agent here"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn an_oversized_frame_is_answered_then_ends_the_connection() {
        let mut input = b"{\"v\":1,\"op\":\"fs_write\",\"path\":\"".to_vec();
        input.resize(MAX_FRAME_BYTES + 1024, b'x');
        let (result, out) = answers(input).await;
        assert!(
            matches!(result, Err(OpError::Framing(frames::ReadError::TooLarge))),
            "{result:?}"
        );
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.contains("\"kind\":\"bad_request\""), "{out}");
    }

    #[tokio::test]
    async fn a_cut_line_ends_the_connection_with_an_error() {
        let (result, out) = answers(b"{\"v\":1,\"op\":\"p".to_vec()).await;
        assert!(
            matches!(result, Err(OpError::Framing(frames::ReadError::Truncated))),
            "{result:?}"
        );
        assert!(out.contains("bad_request"), "{out}");
    }
}
