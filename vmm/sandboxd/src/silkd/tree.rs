//! Tar streams: `fs_push` extracts one into a directory, `fs_pull` sends a file or
//! tree as one. The guest's own `tar` does the archive work (the default template's
//! busybox has it), so ownership, modes and links are the guest's to interpret.
//!
//! `fs_push` first streams the archive into a temp file beside the destination
//! (the agent's atomic `put`), extracts it into a staging directory there, and
//! only when that succeeded moves the result into place: a push cut short, or one
//! that is not a whole tar, leaves the destination untouched.

use std::sync::atomic::{AtomicU64, Ordering};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_vmm::client::{Client, ExecEvent};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::files::{guest_path, upload};
use super::frames::Response;
use super::{AgentSource, ErrorKind, OpError, DATA_CHUNK_BYTES};

/// Extracts the uploaded archive `$1` into a staging directory beside it and only
/// then moves it to `$2` (renamed whole when `$2` is new, merged with `cp -a` when
/// it exists); the archive and the staging directory go in every case. Status 65:
/// the archive is not a whole tar stream (busybox `tar -t` does not read members to
/// their end, so only a full extraction proves a stream complete).
const EXTRACT_SCRIPT: &str = r#"t="$1"; d="$2"; s="$1.d"
trap 'rm -rf "$t" "$s"' EXIT
mkdir "$s" && tar -xf "$t" -C "$s" || { echo "not a complete tar stream" >&2; exit 65; }
if [ -e "$d" ]; then cp -a "$s"/. "$d"/; else mv "$s" "$d"; fi"#;

/// Writes `$2` (a name inside the directory `$1`) as a tar stream on stdout.
const ARCHIVE_SCRIPT: &str = r#"cd "$1" && exec tar -cf - "$2""#;

/// Unique temp names within this daemon.
static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// `path` split into its directory and last component (`/` for the root's own).
fn split(path: &str) -> (&str, &str) {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        None | Some(0) if trimmed.is_empty() => ("/", "."),
        Some(0) => ("/", &trimmed[1..]),
        Some(at) => (&trimmed[..at], &trimmed[at + 1..]),
        None => ("/", trimmed),
    }
}

/// A guest command through `sh -c SCRIPT sh ARGS...`.
fn script(script: &str, args: &[&str]) -> ProcessSpec {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".into(),
        script.into(),
        "sh".into(),
    ];
    argv.extend(args.iter().map(|&arg| arg.to_owned()));
    ProcessSpec::new(Command::Argv(argv))
}

/// Runs a short guest script to completion; a non-zero exit is an error with its
/// stderr (status 65 is the client's fault: `bad_request`).
pub async fn run_script(client: &Client, what: &str, spec: ProcessSpec) -> Result<(), OpError> {
    let reply = client
        .exec(ExecRequest {
            spec,
            stdin: Vec::new(),
            timeout_ms: None,
            stream: false,
        })
        .await
        .map_err(|error| OpError::agent(what, &error))?;
    let code = super::exec::exit_code(reply.exit);
    if code == 0 {
        return Ok(());
    }
    let kind = if code == 65 {
        ErrorKind::BadRequest
    } else {
        ErrorKind::Internal
    };
    Err(OpError::reply(
        kind,
        format!("{what}: {}", String::from_utf8_lossy(&reply.stderr).trim()),
    ))
}

pub async fn push<S, R, W>(conn: &mut Conn<'_, S, R, W>, dest: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let dest = guest_path(dest)?;
    let client = conn.client().await?;
    let (parent, _) = split(dest);
    client
        .mkdir(parent, true, None)
        .await
        .map_err(|error| OpError::agent("push", &error))?;
    let archive = format!(
        "{}/.silkd-push-{}-{}.tar",
        parent.trim_end_matches('/'),
        std::process::id(),
        UPLOADS.fetch_add(1, Ordering::Relaxed)
    );
    upload(conn, &client, &archive, Some(0o600)).await?;
    run_script(&client, "push", script(EXTRACT_SCRIPT, &[&archive, dest])).await?;
    conn.send(&Response::Done).await
}

pub async fn pull<S, R, W>(conn: &mut Conn<'_, S, R, W>, path: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    client
        .stat(path)
        .await
        .map_err(|error| OpError::agent("pull", &error))?;
    let (parent, name) = split(path);
    let mut stream = client
        .exec_stream(ExecRequest {
            spec: script(ARCHIVE_SCRIPT, &[parent, name]),
            stdin: Vec::new(),
            timeout_ms: None,
            stream: true,
        })
        .map_err(|error| OpError::agent("pull", &error))?;
    let (mut pending, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let event = tokio::select! {
            event = stream.next() => event.map_err(|error| OpError::agent("pull", &error))?,
            spoke = conn.client_spoke() => {
                spoke?;
                if conn.client_gone().await? {
                    return Ok(());
                }
                continue;
            }
        };
        match event {
            ExecEvent::Started(_) => {}
            ExecEvent::Output(chunk) if chunk.stream == sandbox_protocol::Stream::Stdout => {
                pending.extend_from_slice(&chunk.data);
                if pending.len() >= DATA_CHUNK_BYTES {
                    let data = std::mem::take(&mut pending);
                    conn.send(&Response::Data { data }).await?;
                }
            }
            ExecEvent::Output(chunk) => {
                if stderr.len() < 4096 {
                    stderr.extend_from_slice(&chunk.data);
                }
            }
            ExecEvent::Finished(reply) => {
                if super::exec::exit_code(reply.exit) != 0 {
                    return Err(OpError::reply(
                        ErrorKind::Internal,
                        format!(
                            "pull: tar failed: {}",
                            String::from_utf8_lossy(&stderr).trim()
                        ),
                    ));
                }
                break;
            }
        }
    }
    if !pending.is_empty() {
        conn.send(&Response::Data { data: pending }).await?;
    }
    conn.send(&Response::Done).await
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn paths_split_into_the_directory_and_the_name_tar_is_given() {
        assert_eq!(split("/a/b/c"), ("/a/b", "c"));
        assert_eq!(split("/a/b/"), ("/a", "b"));
        assert_eq!(split("/top"), ("/", "top"));
        assert_eq!(split("/"), ("/", "."));
    }
}
