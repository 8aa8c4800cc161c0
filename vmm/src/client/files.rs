//! File requests: whole files, directories, streamed `put`/`get`. Requests about
//! the whole guest are in `machine`.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use sandbox_protocol::limits::{FILE_CHUNK_BYTES, PUT_WINDOW_BYTES};
use sandbox_protocol::{
    ClientMsg, DirEntry, Event, FileStat, MkdirRequest, PathRequest, PutRequest, RemoveRequest,
    RenameRequest, Reply, Request, WriteFileRequest,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::stream::Step;
use super::{unexpected, Client, ClientError};

fn bytes(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

fn local(what: String) -> impl FnOnce(std::io::Error) -> ClientError {
    move |error| ClientError::Local { what, error }
}

impl Client {
    /// Replaces `path` in the guest atomically with `data`.
    pub async fn write_file(
        &self,
        path: impl AsRef<Path>,
        data: Vec<u8>,
        mode: Option<u32>,
    ) -> Result<(), ClientError> {
        let request = WriteFileRequest {
            path: bytes(path.as_ref()),
            data,
            mode,
        };
        self.expect_done("write_file", Request::WriteFile(request))
            .await
    }

    /// Reads a regular file of at most 1 MiB.
    pub async fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>, ClientError> {
        match self.request(Request::ReadFile(path_request(path))).await? {
            Reply::File(data) => Ok(data),
            other => Err(unexpected("read_file", other)),
        }
    }

    /// One level of a directory, sorted by name.
    pub async fn list_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>, ClientError> {
        match self.request(Request::ListDir(path_request(path))).await? {
            Reply::Dir(entries) => Ok(entries),
            other => Err(unexpected("list_dir", other)),
        }
    }

    /// Metadata of a path (a final symlink is not followed).
    pub async fn stat(&self, path: impl AsRef<Path>) -> Result<FileStat, ClientError> {
        match self.request(Request::Stat(path_request(path))).await? {
            Reply::Stat(stat) => Ok(stat),
            other => Err(unexpected("stat", other)),
        }
    }

    /// Creates a directory (with `parents`, like `mkdir -p`).
    pub async fn mkdir(
        &self,
        path: impl AsRef<Path>,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<(), ClientError> {
        let request = MkdirRequest {
            path: bytes(path.as_ref()),
            parents,
            mode,
        };
        self.expect_done("mkdir", Request::Mkdir(request)).await
    }

    /// Removes a path (with `recursive`, a whole tree).
    pub async fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<(), ClientError> {
        let request = RemoveRequest {
            path: bytes(path.as_ref()),
            recursive,
        };
        self.expect_done("remove", Request::Remove(request)).await
    }

    /// Renames a path inside the guest.
    pub async fn rename(
        &self,
        from: impl AsRef<Path>,
        to: impl AsRef<Path>,
    ) -> Result<(), ClientError> {
        let request = RenameRequest {
            from: bytes(from.as_ref()),
            to: bytes(to.as_ref()),
        };
        self.expect_done("rename", Request::Rename(request)).await
    }

    /// Streams `source` into the guest file `path`, which appears atomically at the
    /// end. Returns the size and mode the file got.
    pub async fn put<R: AsyncRead + Unpin>(
        &self,
        path: impl AsRef<Path>,
        mode: Option<u32>,
        mut source: R,
    ) -> Result<(u64, u32), ClientError> {
        let request = PutRequest {
            path: bytes(path.as_ref()),
            mode,
        };
        let mut stream = self.stream(Request::Put(request))?;
        let (mut sent, mut acked, mut ended) = (0u64, 0u64, false);
        let mut chunk = vec![0u8; FILE_CHUNK_BYTES];
        loop {
            if !ended && sent - acked < PUT_WINDOW_BYTES {
                let len = read_full(&mut source, &mut chunk)
                    .await
                    .map_err(local("read the local source".into()))?;
                if len == 0 {
                    stream.send(ClientMsg::DataEnd)?;
                    ended = true;
                } else {
                    stream.send(ClientMsg::Data(chunk[..len].to_vec()))?;
                    sent += len as u64;
                }
                continue;
            }
            match stream.next().await? {
                Step::Event(Event::Acked(total)) => acked = total,
                Step::Event(other) => tracing::debug!(?other, "ignored an event during put"),
                Step::Reply(Reply::Transferred { bytes, mode }) => return Ok((bytes, mode)),
                Step::Reply(other) => return Err(unexpected("put", other)),
            }
        }
    }

    /// Streams the guest file `path` into `sink`. Returns its size and mode.
    pub async fn get<W: AsyncWrite + Unpin>(
        &self,
        path: impl AsRef<Path>,
        mut sink: W,
    ) -> Result<(u64, u32), ClientError> {
        let mut stream = self.stream(Request::Get(path_request(path)))?;
        loop {
            match stream.next().await? {
                Step::Event(Event::Data(data)) => sink
                    .write_all(&data)
                    .await
                    .map_err(local("write the local file".into()))?,
                Step::Event(other) => tracing::debug!(?other, "ignored an event during get"),
                Step::Reply(Reply::Transferred { bytes, mode }) => {
                    sink.flush()
                        .await
                        .map_err(local("flush the local file".into()))?;
                    return Ok((bytes, mode));
                }
                Step::Reply(other) => return Err(unexpected("get", other)),
            }
        }
    }
}

impl Client {
    /// Reads at most `len` bytes of the guest file `path` from byte `offset`, through
    /// the streamed `get`: bytes before `offset` arrive and are dropped, and the
    /// request is cancelled (by dropping its stream) once `len` bytes are in, so the
    /// rest of a large file is never sent. Shorter than `len` when the file ends.
    pub async fn get_range(
        &self,
        path: impl AsRef<Path>,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, ClientError> {
        let mut stream = self.stream(Request::Get(path_request(path)))?;
        let mut out = Vec::with_capacity(len.min(FILE_CHUNK_BYTES));
        let mut seen = 0u64;
        while out.len() < len {
            match stream.next().await? {
                Step::Event(Event::Data(data)) => {
                    let start = offset.saturating_sub(seen).min(data.len() as u64);
                    seen += data.len() as u64;
                    // `start` is at most `data.len()`, a usize.
                    let start = usize::try_from(start).unwrap_or(data.len());
                    let take = (len - out.len()).min(data.len() - start);
                    out.extend_from_slice(&data[start..start + take]);
                }
                Step::Event(other) => tracing::debug!(?other, "ignored an event during get"),
                Step::Reply(Reply::Transferred { .. }) => return Ok(out),
                Step::Reply(other) => return Err(unexpected("get", other)),
            }
        }
        Ok(out)
    }
}

fn path_request(path: impl AsRef<Path>) -> PathRequest {
    PathRequest {
        path: bytes(path.as_ref()),
    }
}

/// Fills `buf` unless the source ends first; returns how much was read.
async fn read_full<R: AsyncRead + Unpin>(source: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = source.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}
