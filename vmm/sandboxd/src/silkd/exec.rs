//! Processes: `exec` (run to completion with streamed output, `detach` to spawn,
//! `session` to run in a persistent shell), `ps`, `kill`, `logs`, `attach`.
//!
//! Our agent takes an exec's stdin whole, so `exec` buffers the client's `stdin`
//! frames until `stdin_close` (at most [`EXEC_STDIN_CAP_BYTES`]) and then starts the
//! command; output streams back as it is produced. A client that hangs up mid-run
//! drops the exec stream, which cancels the request and kills the command.

use std::collections::BTreeMap;

use sandbox_protocol::{
    Command, ExecRequest, ExitStatus, OutputChunk, Pid, ProcessKind, ProcessSpec, ProcessState,
    Stream, User,
};
use sandbox_vmm::client::{ExecEvent, LogsEvent};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::frames::{ExecReq, ProcRow, Request, Response};
use super::{sessions, AgentSource, OpError, EXEC_STDIN_CAP_BYTES};

/// `kill`'s default signal, as the SDK documents it.
const SIGKILL: i32 = 9;

/// A process spec from silkd's exec fields.
pub fn spec(
    command: Option<Command>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    user: Option<String>,
) -> ProcessSpec {
    ProcessSpec {
        command,
        env: env.into_iter().collect(),
        cwd: cwd.filter(|cwd| !cwd.is_empty()),
        user: user
            .filter(|user| !user.is_empty())
            .map(|user| match user.parse() {
                Ok(uid) => User::Uid(uid),
                Err(_) => User::Name(user),
            }),
    }
}

/// The exit code silkd reports: the code, or 128 + the signal.
pub fn exit_code(exit: Option<ExitStatus>) -> i32 {
    exit.map_or(-1, |status| status.shell_code())
}

/// An output chunk as its silkd frame (a terminal's output is stdout).
pub fn output_frame(chunk: OutputChunk) -> Response {
    match chunk.stream {
        Stream::Stderr => Response::Stderr { data: chunk.data },
        Stream::Stdout | Stream::Pty => Response::Stdout { data: chunk.data },
    }
}

pub async fn exec<S, R, W>(conn: &mut Conn<'_, S, R, W>, request: ExecReq) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if request.argv.is_empty() {
        return Err(OpError::bad_request("exec needs a non-empty argv"));
    }
    if let Some(session) = request.session.filter(|session| !session.is_empty()) {
        return sessions::exec(conn, &session, &request.argv).await;
    }
    let spec = spec(
        Some(Command::Argv(request.argv)),
        request.cwd,
        request.env.unwrap_or_default(),
        request.user,
    );
    let client = conn.client().await?;
    if request.detach {
        let pid = client
            .spawn(spec)
            .await
            .map_err(|error| OpError::agent("spawn", &error))?;
        return conn.send(&Response::Started { pid: pid.0 }).await;
    }
    let stdin = read_stdin(conn).await?;
    let mut stream = client
        .exec_stream(ExecRequest {
            spec,
            stdin,
            timeout_ms: None,
            stream: true,
        })
        .map_err(|error| OpError::agent("exec", &error))?;
    loop {
        let event = tokio::select! {
            event = stream.next() => event.map_err(|error| OpError::agent("exec", &error))?,
            spoke = conn.client_spoke() => {
                spoke?;
                if conn.client_gone().await? {
                    // Dropping the stream cancels the exec: the command is killed.
                    return Ok(());
                }
                continue;
            }
        };
        match event {
            ExecEvent::Started(pid) => conn.send(&Response::Started { pid: pid.0 }).await?,
            ExecEvent::Output(chunk) => conn.send(&output_frame(chunk)).await?,
            ExecEvent::Finished(reply) => {
                return conn
                    .send(&Response::Exit {
                        code: exit_code(reply.exit),
                    })
                    .await;
            }
        }
    }
}

/// The `stdin` frames up to `stdin_close`.
async fn read_stdin<S, R, W>(conn: &mut Conn<'_, S, R, W>) -> Result<Vec<u8>, OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut stdin = Vec::new();
    loop {
        match conn.next_request().await? {
            Some(Request::Stdin { data }) => {
                if stdin.len() + data.len() > EXEC_STDIN_CAP_BYTES {
                    return Err(OpError::bad_request(format!(
                        "stdin is over {EXEC_STDIN_CAP_BYTES} bytes; write a file and redirect it"
                    )));
                }
                stdin.extend_from_slice(&data);
            }
            Some(Request::StdinClose) => return Ok(stdin),
            Some(_) => return Err(OpError::bad_request("expected stdin or stdin_close")),
            None => {
                return Err(OpError::Framing(super::frames::ReadError::Truncated));
            }
        }
    }
}

pub async fn ps<S, R, W>(conn: &mut Conn<'_, S, R, W>) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let rows = client
        .ps()
        .await
        .map_err(|error| OpError::agent("ps", &error))?;
    let procs = rows
        .into_iter()
        .filter(|row| row.kind != ProcessKind::Session)
        .map(|row| {
            let (state, exit_code) = match row.state {
                ProcessState::Running => ("running", None),
                ProcessState::Exited(status) => ("exited", Some(status.shell_code())),
            };
            ProcRow {
                pid: row.pid.0,
                argv: row.argv,
                detached: row.kind == ProcessKind::Spawn,
                state,
                exit_code,
                started_at_epoch_secs: row.started_at_ms / 1000,
            }
        })
        .collect();
    conn.send(&Response::Procs { procs }).await
}

pub async fn kill<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    pid: i32,
    signal: Option<i32>,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let signal = signal.filter(|&signal| signal != 0).unwrap_or(SIGKILL);
    let client = conn.client().await?;
    let rows = client
        .ps()
        .await
        .map_err(|error| OpError::agent("ps", &error))?;
    match rows.iter().find(|row| row.pid.0 == pid) {
        None => {
            return Err(OpError::reply(
                super::ErrorKind::NotFound,
                format!("kill: no tracked process {pid}"),
            ))
        }
        // An exited process is a no-op success (the SDK's contract).
        Some(row) if matches!(row.state, ProcessState::Exited(_)) => {}
        Some(_) => client
            .kill(Pid(pid), signal)
            .await
            .map_err(|error| OpError::agent("kill", &error))?,
    }
    conn.send(&Response::Done).await
}

pub async fn logs<S, R, W>(conn: &mut Conn<'_, S, R, W>, pid: i32) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let reply = client
        .logs(Pid(pid), None)
        .await
        .map_err(|error| OpError::agent("logs", &error))?;
    for chunk in reply.batch.chunks {
        conn.send(&output_frame(chunk)).await?;
    }
    if reply.exit.is_some() {
        conn.send(&Response::Exit {
            code: exit_code(reply.exit),
        })
        .await?;
    }
    conn.send(&Response::Done).await
}

pub async fn attach<S, R, W>(conn: &mut Conn<'_, S, R, W>, pid: i32) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let mut stream = client
        .logs_follow(Pid(pid), None)
        .map_err(|error| OpError::agent("attach", &error))?;
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            spoke = conn.client_spoke() => {
                spoke?;
                if conn.client_gone().await? {
                    return Ok(());
                }
                continue;
            }
        };
        match event {
            Ok(LogsEvent::Batch(batch)) => {
                for chunk in batch.chunks {
                    conn.send(&output_frame(chunk)).await?;
                }
            }
            Ok(LogsEvent::Finished(reply)) => {
                for chunk in reply.batch.chunks {
                    conn.send(&output_frame(chunk)).await?;
                }
                return conn
                    .send(&Response::Exit {
                        code: exit_code(reply.exit),
                    })
                    .await;
            }
            // The record went away while we followed: the SDK's `None`.
            Err(error) if error.wire_kind() == Some(sandbox_protocol::ErrorKind::NotFound) => {
                return conn.send(&Response::Done).await;
            }
            Err(error) => return Err(OpError::agent("attach", &error)),
        }
    }
}
