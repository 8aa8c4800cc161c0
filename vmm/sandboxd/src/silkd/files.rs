//! Files: `fs_write` (chunked, atomic), `fs_read` (streamed), `fs_list`, `fs_stat`,
//! `fs_mkdir`, `fs_rm`, `fs_rename`, on the agent's file requests.
//!
//! `fs_write` feeds the client's `data` frames into the agent's streamed `put`
//! as they arrive (its window bounds what the node holds), and the file appears
//! only once `data_end` came: a client that hangs up before drops the `put`, which
//! the agent discards with its temp file.

use sandbox_protocol::{Event, FileKind, PathRequest, Reply, Request};
use sandbox_vmm::client::{Client, Step};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::conn::Conn;
use super::frames::{EntryRow, Response, StatRow};
use super::{AgentSource, ErrorKind, OpError, DATA_CHUNK_BYTES};

/// The pipe between the client's frames and the agent's `put`.
const UPLOAD_PIPE_BYTES: usize = 256 * 1024;

/// A path as the agent wants it: absolute. A relative one is refused here, with
/// the reason, rather than by the agent.
pub fn guest_path(path: &str) -> Result<&str, OpError> {
    if path.starts_with('/') {
        Ok(path)
    } else {
        Err(OpError::bad_request(format!(
            "path {path:?} is not absolute"
        )))
    }
}

pub fn kind_name(kind: FileKind) -> &'static str {
    kind.as_str()
}

pub async fn write<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    path: &str,
    mode: Option<u32>,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    upload(conn, &client, path, mode).await?;
    conn.send(&Response::Done).await
}

/// Streams the client's `data` frames up to `data_end` into the guest file `path`
/// (atomically, through `put`).
pub async fn upload<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    client: &Client,
    path: &str,
    mode: Option<u32>,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (mut pipe_in, pipe_out) = tokio::io::duplex(UPLOAD_PIPE_BYTES);
    let put = client.put(path, mode, pipe_out);
    tokio::pin!(put);
    let feed = async {
        while let Some(data) = conn.next_data().await? {
            pipe_in.write_all(&data).await.map_err(|_| {
                OpError::reply(ErrorKind::Internal, "the agent stopped taking the upload")
            })?;
        }
        drop(pipe_in);
        Ok::<(), OpError>(())
    };
    tokio::select! {
        fed = feed => fed?,
        // The agent finished before data_end: it refused the upload.
        put = &mut put => {
            put.map_err(|error| OpError::agent("write", &error))?;
            return Err(OpError::reply(ErrorKind::Internal, "the upload ended early"));
        }
    }
    put.await.map_err(|error| OpError::agent("write", &error))?;
    Ok(())
}

pub async fn read<S, R, W>(conn: &mut Conn<'_, S, R, W>, path: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    let mut stream = client
        .stream(Request::Get(PathRequest {
            path: path.as_bytes().to_vec(),
        }))
        .map_err(|error| OpError::agent("read", &error))?;
    let mut pending = Vec::new();
    loop {
        match stream
            .next()
            .await
            .map_err(|error| OpError::agent("read", &error))?
        {
            Step::Event(Event::Data(data)) => {
                pending.extend_from_slice(&data);
                if pending.len() >= DATA_CHUNK_BYTES {
                    let data = std::mem::take(&mut pending);
                    conn.send(&Response::Data { data }).await?;
                }
            }
            Step::Event(_) => {}
            Step::Reply(Reply::Transferred { .. }) => break,
            Step::Reply(other) => {
                return Err(OpError::reply(
                    ErrorKind::Internal,
                    format!("read: unexpected reply {other:?}"),
                ))
            }
        }
    }
    if !pending.is_empty() {
        conn.send(&Response::Data { data: pending }).await?;
    }
    conn.send(&Response::Done).await
}

pub async fn list<S, R, W>(conn: &mut Conn<'_, S, R, W>, path: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    let entries = client
        .list_dir(path)
        .await
        .map_err(|error| OpError::agent("list", &error))?
        .into_iter()
        .map(|entry| EntryRow {
            name: String::from_utf8_lossy(&entry.name).into_owned(),
            kind: kind_name(entry.kind),
            size: entry.size,
        })
        .collect();
    conn.send(&Response::Entries { entries }).await?;
    conn.send(&Response::Done).await
}

pub async fn stat<S, R, W>(conn: &mut Conn<'_, S, R, W>, path: &str) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    let stat = client
        .stat(path)
        .await
        .map_err(|error| OpError::agent("stat", &error))?;
    conn.send(&Response::Stat {
        info: StatRow {
            kind: kind_name(stat.kind),
            size: stat.size,
            mode: stat.mode,
            mtime_epoch_secs: u64::try_from(stat.modified_ms / 1000).unwrap_or(0),
        },
    })
    .await
}

pub async fn mkdir<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    path: &str,
    parents: bool,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    client
        .mkdir(path, parents, None)
        .await
        .map_err(|error| OpError::agent("mkdir", &error))?;
    conn.send(&Response::Done).await
}

pub async fn remove<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    path: &str,
    recursive: bool,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let path = guest_path(path)?;
    let client = conn.client().await?;
    client
        .remove(path, recursive)
        .await
        .map_err(|error| OpError::agent("remove", &error))?;
    conn.send(&Response::Done).await
}

pub async fn rename<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    from: &str,
    to: &str,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (from, to) = (guest_path(from)?, guest_path(to)?);
    let client = conn.client().await?;
    client
        .rename(from, to)
        .await
        .map_err(|error| OpError::agent("rename", &error))?;
    conn.send(&Response::Done).await
}
