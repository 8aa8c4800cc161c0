//! Terminals: `pty_open` runs the login shell (or the template's) under a guest
//! pty and streams it both ways on this connection (`started`, then `stdout`
//! frames, `exit` when the shell ends; `stdin` frames are typed into it);
//! `pty_resize` (on any connection) changes its size.
//!
//! The terminal lives as long as the connection: a client that hangs up has its
//! shell killed, so an abandoned terminal does not run on in the guest.

use sandbox_protocol::{Pid, PtyOpenRequest, WindowSize};
use sandbox_vmm::client::LogsEvent;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::exec::{exit_code, output_frame, spec};
use super::frames::{PtyReq, Request, Response};
use super::{AgentSource, OpError};

/// The signal that ends an abandoned terminal.
const SIGHUP: i32 = 1;

pub async fn open<S, R, W>(conn: &mut Conn<'_, S, R, W>, request: PtyReq) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let pid = client
        .pty_open(PtyOpenRequest {
            spec: spec(
                None,
                request.cwd,
                request.env.unwrap_or_default(),
                request.user,
            ),
            size: WindowSize {
                rows: request.rows,
                cols: request.cols,
            },
        })
        .await
        .map_err(|error| OpError::agent("pty_open", &error))?;
    conn.send(&Response::Started { pid: pid.0 }).await?;
    let mut output = client
        .logs_follow(pid, None)
        .map_err(|error| OpError::agent("pty", &error))?;
    loop {
        tokio::select! {
            event = output.next() => match event.map_err(|error| OpError::agent("pty", &error))? {
                LogsEvent::Batch(batch) => {
                    for chunk in batch.chunks {
                        conn.send(&output_frame(chunk)).await?;
                    }
                }
                LogsEvent::Finished(reply) => {
                    for chunk in reply.batch.chunks {
                        conn.send(&output_frame(chunk)).await?;
                    }
                    return conn.send(&Response::Exit { code: exit_code(reply.exit) }).await;
                }
            },
            spoke = conn.client_spoke() => {
                spoke?;
                match conn.next_request().await {
                    Ok(Some(Request::Stdin { data })) => client
                        .pty_input(pid, data)
                        .await
                        .map_err(|error| OpError::agent("pty input", &error))?,
                    Ok(Some(_)) | Err(OpError::Reply { .. }) => {}
                    Ok(None) | Err(_) => {
                        let _ = client.kill(pid, SIGHUP).await;
                        return Ok(());
                    }
                }
            }
        }
    }
}

pub async fn resize<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    pid: i32,
    cols: u16,
    rows: u16,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    client
        .pty_resize(Pid(pid), WindowSize { rows, cols })
        .await
        .map_err(|error| OpError::agent("pty_resize", &error))?;
    conn.send(&Response::Done).await
}
