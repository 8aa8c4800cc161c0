//! `shell` and `attach`: an interactive terminal in the guest.
//!
//! Output comes from following the pty's ring (so `attach` first replays what the
//! terminal printed while nobody watched); our stdin goes in as `pty_input`; our
//! `SIGWINCH` becomes `pty_resize`. On a terminal, stdin is in raw mode and Ctrl-]
//! detaches. When stdin is not a terminal (scripts, tests) there is no raw mode, and
//! the end of our input is passed on as one Ctrl-D so the shell sees end of file.

use anyhow::Context;
use sandbox_protocol::{Pid, ProcessSpec, PtyOpenRequest, WindowSize};
use sandbox_vmm::client::{Client, ClientError, LogsEvent};
use tokio::signal::unix::{signal, SignalKind};

use crate::output::write_chunk;
use crate::run::exit_byte;
use crate::terminal::{stdin_chunks, stdin_is_tty, window_size, RawMode};

/// Size used when we have no terminal to measure.
const DEFAULT_SIZE: WindowSize = WindowSize { rows: 24, cols: 80 };

/// Ctrl-]: leave the session running and exit.
const DETACH_BYTE: u8 = 0x1d;

/// Ctrl-D: end of file for a terminal in canonical mode.
const EOF_BYTE: u8 = 0x04;

/// Opens a terminal running `spec` (or the login shell) and joins it.
pub(crate) async fn shell(client: &Client, mut spec: ProcessSpec) -> anyhow::Result<u8> {
    if let Some(term) = std::env::var_os("TERM") {
        // Ahead of the user's --env so theirs wins.
        spec.env
            .insert(0, ("TERM".to_owned(), term.to_string_lossy().into_owned()));
    }
    let size = window_size().unwrap_or(DEFAULT_SIZE);
    let pid = client
        .pty_open(PtyOpenRequest { spec, size })
        .await
        .context("Cannot open a terminal")?;
    tracing::debug!(%pid, "terminal opened");
    session(client, pid).await
}

/// Joins the running terminal `pid`.
pub(crate) async fn attach(client: &Client, pid: i32) -> anyhow::Result<u8> {
    let pid = Pid(pid);
    if let Some(size) = window_size() {
        client
            .pty_resize(pid, size)
            .await
            .with_context(|| format!("Cannot attach to {pid}"))?;
    }
    session(client, pid).await
}

async fn session(client: &Client, pid: Pid) -> anyhow::Result<u8> {
    let tty = stdin_is_tty();
    let raw = if tty {
        Some(RawMode::enter().context("Cannot put the terminal into raw mode")?)
    } else {
        None
    };
    let mut output = client
        .logs_follow(pid, None)
        .with_context(|| format!("Cannot follow terminal {pid}"))?;
    let mut input = stdin_chunks();
    let mut input_open = true;
    let mut winch = signal(SignalKind::window_change()).context("Cannot watch SIGWINCH")?;
    loop {
        tokio::select! {
            event = output.next() => match event.with_context(|| format!("Terminal {pid} failed"))? {
                LogsEvent::Batch(batch) => {
                    for chunk in &batch.chunks {
                        write_chunk(chunk)?;
                    }
                }
                LogsEvent::Finished(reply) => {
                    for chunk in &reply.batch.chunks {
                        write_chunk(chunk)?;
                    }
                    drop(raw);
                    return Ok(reply.exit.map_or(u8::MAX, |status| exit_byte(status.shell_code())));
                }
            },
            chunk = input.recv(), if input_open => {
                let data = match chunk {
                    Some(Ok(data)) => data,
                    Some(Err(error)) => return Err(error).context("Cannot read stdin"),
                    None if tty => {
                        input_open = false;
                        continue;
                    }
                    None => {
                        input_open = false;
                        vec![EOF_BYTE]
                    }
                };
                let detach_at = if tty { data.iter().position(|&b| b == DETACH_BYTE) } else { None };
                let send = &data[..detach_at.unwrap_or(data.len())];
                if !send.is_empty() {
                    input_open &= forward(client.pty_input(pid, send.to_vec()).await)?;
                }
                if detach_at.is_some() {
                    drop(raw);
                    eprintln!("\r\nsandboxctl: detached from {pid}; `sandboxctl attach {pid}` returns to it");
                    return Ok(0);
                }
            }
            _ = winch.recv() => {
                if let Some(size) = window_size() {
                    forward(client.pty_resize(pid, size).await)?;
                }
            }
        }
    }
}

/// Whether to keep sending input: an agent error (the terminal just ended, say) stops
/// input while the output stream tells how it ended; losing the agent is fatal.
fn forward(result: Result<(), ClientError>) -> anyhow::Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(ClientError::Agent(error)) => {
            tracing::debug!(%error, "terminal refused input");
            Ok(false)
        }
        Err(error) => Err(error).context("Cannot reach the terminal"),
    }
}
