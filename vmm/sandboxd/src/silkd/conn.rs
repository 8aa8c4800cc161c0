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
