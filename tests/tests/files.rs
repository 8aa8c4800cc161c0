//! File operations through the real agent: atomic writes, every `read_file` refusal,
//! names that are not UTF-8, and a 1 GiB streamed round trip with a checksum.

#![allow(clippy::unwrap_used)] // Tests fail by panicking, with the error in the message.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use sandbox_protocol::limits::READ_FILE_CAP_BYTES;
use sandbox_protocol::{ErrorKind, FileKind};
use sandbox_tests::{exec_sh, TestAgent};
use sandbox_vmm::client::{Client, ClientError};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn kind(error: &ClientError) -> Option<ErrorKind> {
    error.wire_kind()
}

/// A directory for one test, under the target dir (not /tmp, which may be small).
fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[tokio::test]
async fn readers_never_see_a_torn_file() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let dir = scratch("torn");
    let path = dir.join("f");
    let a = vec![b'a'; 512 * 1024];
    let b = vec![b'b'; 512 * 1024];
    client.write_file(&path, a.clone(), None).await.unwrap();

    let writer = {
        let (client, path, a, b) = (client.clone(), path.clone(), a.clone(), b.clone());
        tokio::spawn(async move {
            for i in 0..60 {
                let data = if i % 2 == 0 { b.clone() } else { a.clone() };
                client.write_file(&path, data, None).await.unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        let data = client.read_file(&path).await.unwrap();
        assert!(data == a || data == b, "torn read of {} bytes", data.len());
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 0);
    assert!(
        temp_files(&dir).is_empty(),
        "temp files left: {:?}",
        temp_files(&dir)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn failed_writes_and_abandoned_puts_leave_nothing_behind() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let dir = scratch("failed");
    std::fs::create_dir(dir.join("sub")).unwrap();

    let err = client
        .write_file(dir.join("sub"), b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::WrongType), "{err}");
    let err = client
        .write_file(dir.join("missing/f"), b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::NotFound), "{err}");
    assert!(err.to_string().contains("parent"), "{err}");
    let err = client
        .write_file("relative/f", b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::BadRequest), "{err}");

    // A put whose source stalls after 3 MiB, abandoned by the client: the agent
    // cancels it and removes its temp file; the target never appears.
    let target = dir.join("never");
    let put = client.put(&target, None, Stall { left: 3 << 20 });
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), put)
            .await
            .is_err()
    );
    wait_until(|| temp_files(&dir).is_empty()).await;
    assert!(!target.exists());
    assert!(temp_files(&dir).is_empty());
    agent_still_answers(&client).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn read_file_refuses_with_a_reason_for_each_case() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let dir = scratch("read");
    let cap = usize::try_from(READ_FILE_CAP_BYTES).unwrap();
    std::fs::write(dir.join("exact"), vec![7u8; cap]).unwrap();
    std::fs::write(dir.join("big"), vec![7u8; cap + 1]).unwrap();
    std::fs::write(dir.join("bad-utf8"), b"ok \xff\xfe bytes").unwrap();

    assert_eq!(
        client.read_file(dir.join("exact")).await.unwrap().len(),
        cap
    );
    assert_eq!(
        client.read_file(dir.join("bad-utf8")).await.unwrap(),
        b"ok \xff\xfe bytes"
    );
    let cases: [(PathBuf, ErrorKind, &str); 5] = [
        (dir.join("big"), ErrorKind::TooLarge, "1048576"),
        (dir.clone(), ErrorKind::WrongType, "directory"),
        (
            PathBuf::from("/dev/null"),
            ErrorKind::WrongType,
            "not a regular file",
        ),
        (dir.join("missing"), ErrorKind::NotFound, "missing"),
        (PathBuf::from("relative"), ErrorKind::BadRequest, "absolute"),
    ];
    for (path, expected, words) in cases {
        let err = client.read_file(&path).await.unwrap_err();
        assert_eq!(kind(&err), Some(expected), "{}: {err}", path.display());
        assert!(err.to_string().contains(words), "{}: {err}", path.display());
    }
    agent_still_answers(&client).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn names_that_are_not_utf8_survive_the_round_trip() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let dir = scratch("names");
    let name: &[u8] = b"caf\xe9-\xff";
    let path = dir.join(std::ffi::OsStr::from_bytes(name));
    client
        .write_file(&path, b"hi".to_vec(), Some(0o600))
        .await
        .unwrap();
    client.mkdir(dir.join("d/e"), true, None).await.unwrap();

    let entries = client.list_dir(&dir).await.unwrap();
    let listed: Vec<_> = entries
        .iter()
        .map(|e| (e.name.clone(), e.kind, e.size))
        .collect();
    assert!(
        listed.contains(&(name.to_vec(), FileKind::File, 2)),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|(n, k, _)| n == b"d" && *k == FileKind::Dir),
        "{listed:?}"
    );
    assert_eq!(client.read_file(&path).await.unwrap(), b"hi");
    let stat = client.stat(&path).await.unwrap();
    assert_eq!(
        (stat.kind, stat.size, stat.mode),
        (FileKind::File, 2, 0o600)
    );

    client.rename(&path, dir.join("plain")).await.unwrap();
    client.remove(dir.join("d"), true).await.unwrap();
    let names: Vec<_> = client
        .list_dir(&dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"plain".to_vec()]);
    let err = client.remove(dir.join("d"), true).await.unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::NotFound));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_1_gib_file_round_trips_with_its_checksum() {
    const SIZE: u64 = 1 << 30;
    let agent = TestAgent::start();
    let client = agent.client().await;
    let dir = scratch("big");
    let remote = dir.join("big.bin");

    let mut source = Pattern::new(SIZE);
    let (written, mode) = client.put(&remote, Some(0o640), &mut source).await.unwrap();
    assert_eq!((written, mode), (SIZE, 0o640));
    let sent = hex(source.hasher.finalize());

    // The guest's own view of the file.
    let reply = client
        .exec(exec_sh(&format!("sha256sum '{}'", remote.display())))
        .await
        .unwrap();
    let guest = String::from_utf8_lossy(&reply.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    assert_eq!(guest, sent);

    let mut sink = HashSink(Sha256::new(), 0);
    let (read, _) = client.get(&remote, &mut sink).await.unwrap();
    assert_eq!((read, sink.1), (SIZE, SIZE));
    assert_eq!(hex(sink.0.finalize()), sent);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn agent_still_answers(client: &Client) {
    client.info().await.expect("the agent stopped answering");
}

async fn wait_until(mut done: impl FnMut() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `size` bytes of a 1 MiB random block, each copy stamped with its index so that
/// lost, repeated or reordered blocks change the checksum. Hashes what it yields.
struct Pattern {
    block: Vec<u8>,
    left: u64,
    index: u64,
    pos: usize,
    hasher: Sha256,
}

impl Pattern {
    fn new(size: u64) -> Self {
        let mut block = vec![0u8; 1 << 20];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        Self {
            block,
            left: size,
            index: 0,
            pos: 0,
            hasher: Sha256::new(),
        }
    }
}

impl AsyncRead for Pattern {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.left == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.pos == 0 {
            this.block[..8].copy_from_slice(&this.index.to_le_bytes());
        }
        let n = (this.block.len() - this.pos)
            .min(buf.remaining())
            .min(usize::try_from(this.left).unwrap_or(usize::MAX));
        let bytes = &this.block[this.pos..this.pos + n];
        this.hasher.update(bytes);
        buf.put_slice(bytes);
        this.pos += n;
        this.left -= n as u64;
        if this.pos == this.block.len() {
            this.pos = 0;
            this.index += 1;
        }
        Poll::Ready(Ok(()))
    }
}

/// Yields `left` zero bytes, then never anything again.
struct Stall {
    left: usize,
}

impl AsyncRead for Stall {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.left == 0 {
            return Poll::Pending;
        }
        let n = self.left.min(buf.remaining());
        buf.put_slice(&vec![0u8; n]);
        self.left -= n;
        Poll::Ready(Ok(()))
    }
}

struct HashSink(Sha256, u64);

impl AsyncWrite for HashSink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.update(buf);
        self.1 += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
