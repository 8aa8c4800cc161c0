//! Persistent shells: `session_create`, `session_list`, `session_rm`, and `exec`
//! with `session`, over the agent's `sh` eval sessions (one long-lived `/bin/sh`
//! per session whose working directory, variables and functions persist).
//!
//! As in seed 000, an `exec` in a session shell-quotes its argv and joins it into
//! one line, so `cd` and `export` persist while an ordinary argv still runs. The
//! agent's list of processes is the one record of which sessions exist.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use sandbox_protocol::eval::{is_valid_session_name, Language};
use sandbox_protocol::{EvalRequest, ProcessKind, ProcessState};
use sandbox_vmm::client::Client;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::frames::Response;
use super::{AgentSource, ErrorKind, OpError};

/// Generated session ids within this daemon.
static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// POSIX single quotes around `word`.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The names of the live sessions, sorted.
pub async fn names(client: &Client) -> Result<Vec<String>, OpError> {
    let rows = client
        .ps()
        .await
        .map_err(|error| OpError::agent("session_list", &error))?;
    let mut names: Vec<String> = rows
        .into_iter()
        .filter(|row| row.kind == ProcessKind::Session && row.state == ProcessState::Running)
        .filter_map(|row| row.argv.last().cloned())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

async fn eval(
    client: &Client,
    session: &str,
    code: String,
    restart: bool,
) -> Result<sandbox_protocol::EvalReply, OpError> {
    client
        .eval(EvalRequest {
            session: session.to_owned(),
            language: Language::Shell,
            code,
            timeout_ms: None,
            restart,
        })
        .await
        .map_err(|error| OpError::agent("session", &error))
}

pub async fn create<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    id: Option<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let id = match id.filter(|id| !id.is_empty()) {
        Some(id) => id,
        None => format!(
            "sess-{}-{}",
            std::process::id(),
            SESSIONS.fetch_add(1, Ordering::Relaxed)
        ),
    };
    if !is_valid_session_name(&id) {
        return Err(OpError::bad_request(format!(
            "session id {id:?}: 1 to 64 letters, digits, '-', '_' or '.'"
        )));
    }
    let client = conn.client().await?;
    if names(&client).await?.contains(&id) {
        return Err(OpError::bad_request(format!("session {id} already exists")));
    }
    let mut init = String::from(":\n");
    if let Some(cwd) = cwd.filter(|cwd| !cwd.is_empty()) {
        init.push_str(&format!("cd {} || exit 1\n", quote(&cwd)));
    }
    for (name, value) in &env {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(OpError::bad_request(format!(
                "invalid variable name {name:?}"
            )));
        }
        init.push_str(&format!("export {name}={}\n", quote(value)));
    }
    let reply = eval(&client, &id, init, true).await?;
    if reply.died.is_some() || reply.status.unwrap_or(0) != 0 {
        let _ = client.close_session(&id).await;
        return Err(OpError::bad_request(format!(
            "session setup failed: {}",
            String::from_utf8_lossy(&reply.stderr).trim()
        )));
    }
    conn.send(&Response::SessionCreated { id }).await
}

pub async fn list<S, R, W>(conn: &mut Conn<'_, S, R, W>) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    let sessions = names(&client).await?;
    conn.send(&Response::Sessions { sessions }).await
}

pub async fn remove<S, R, W>(conn: &mut Conn<'_, S, R, W>, id: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    client
        .close_session(id)
        .await
        .map_err(|error| OpError::agent("session_rm", &error))?;
    conn.send(&Response::Done).await
}

/// Runs `argv` in session `id`: its output, then its exit.
pub async fn exec<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    id: &str,
    argv: &[String],
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let client = conn.client().await?;
    if !names(&client).await?.iter().any(|name| name == id) {
        return Err(OpError::reply(
            ErrorKind::NotFound,
            format!("no session {id}"),
        ));
    }
    let line: Vec<String> = argv.iter().map(|word| quote(word)).collect();
    let reply = eval(&client, id, line.join(" "), false).await?;
    if !reply.stdout.is_empty() {
        conn.send(&Response::Stdout { data: reply.stdout }).await?;
    }
    if !reply.stderr.is_empty() {
        conn.send(&Response::Stderr { data: reply.stderr }).await?;
    }
    let code = match (reply.status, reply.died) {
        (_, Some(died)) => died.shell_code(),
        (Some(status), None) => status,
        (None, None) => -1,
    };
    conn.send(&Response::Exit { code }).await
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }
}
