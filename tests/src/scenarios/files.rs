//! File operations through the agent: atomic writes, every `read_file` refusal, names
//! that are not UTF-8, and what the agent's machine itself sees. Each scenario works
//! in a directory of its own, inspected through the agent (so it holds in a guest).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use sandbox_protocol::limits::READ_FILE_CAP_BYTES;
use sandbox_protocol::{ErrorKind, FileKind};
use sandbox_vmm::client::Client;
use tokio::io::{AsyncRead, ReadBuf};

use crate::transport::Target;
use crate::{eventually, sh};

/// Names of the atomic writes' temp files left in `dir`.
async fn temp_files(client: &Client, dir: &Path) -> Vec<String> {
    client
        .list_dir(dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

async fn agent_still_answers(client: &Client) {
    client.info().await.expect("the agent stopped answering");
}

pub async fn writes_reads_and_stat_agree_with_the_agents_machine(target: Target) {
    let client = target.client();
    let dir = target.scratch("agree").await;
    let text = dir.join("hello.txt");
    let data = b"hello \xff\x00 world\n".to_vec();
    client
        .write_file(&text, data.clone(), Some(0o640))
        .await
        .unwrap();
    assert_eq!(client.read_file(&text).await.unwrap(), data);
    let stat = client.stat(&text).await.unwrap();
    assert_eq!(
        (stat.kind, stat.size, stat.mode),
        (FileKind::File, 15, 0o640)
    );
    // Seen the same from inside the agent's machine.
    let listed = sh(client, &format!("stat -c '%a %s' '{}'", text.display())).await;
    assert_eq!(listed.trim(), "640 15");
    client.remove(&dir, true).await.unwrap();
    let err = client.stat(&dir).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

pub async fn readers_never_see_a_torn_file(target: Target) {
    let client = target.client();
    let dir = target.scratch("torn").await;
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
    let left = temp_files(client, &dir).await;
    assert!(left.is_empty(), "temp files left: {left:?}");
    client.remove(&dir, true).await.unwrap();
}

pub async fn failed_writes_and_abandoned_puts_leave_nothing_behind(target: Target) {
    let client = target.client();
    let dir = target.scratch("failed").await;
    client.mkdir(dir.join("sub"), false, None).await.unwrap();

    let err = client
        .write_file(dir.join("sub"), b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::WrongType), "{err}");
    let err = client
        .write_file(dir.join("missing/f"), b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
    assert!(err.to_string().contains("parent"), "{err}");
    let err = client
        .write_file("relative/f", b"x".to_vec(), None)
        .await
        .unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::BadRequest), "{err}");

    // A put whose source stalls after 3 MiB, abandoned by the client after half a
    // second (that wait is the test: the put is under way when it is dropped): the
    // agent cancels it and removes its temp file; the target never appears.
    let never = dir.join("never");
    let put = client.put(&never, None, Stall { left: 3 << 20 });
    assert!(tokio::time::timeout(Duration::from_millis(500), put)
        .await
        .is_err());
    let limit = Duration::from_secs(10);
    eventually(limit, "the abandoned put's temp file to go", || async {
        temp_files(client, &dir).await.is_empty().then_some(())
    })
    .await;
    let err = client.stat(&never).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
    agent_still_answers(client).await;
    client.remove(&dir, true).await.unwrap();
}

pub async fn read_file_refuses_with_a_reason_for_each_case(target: Target) {
    let client = target.client();
    let dir = target.scratch("read").await;
    let cap = READ_FILE_CAP_BYTES;
    sh(
        client,
        &format!(
            "head -c {cap} /dev/zero > '{d}/exact' && head -c {} /dev/zero > '{d}/big'",
            cap + 1,
            d = dir.display()
        ),
    )
    .await;
    client
        .write_file(dir.join("bad-utf8"), b"ok \xff\xfe bytes".to_vec(), None)
        .await
        .unwrap();

    assert_eq!(
        client.read_file(dir.join("exact")).await.unwrap().len() as u64,
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
        assert_eq!(err.wire_kind(), Some(expected), "{}: {err}", path.display());
        assert!(err.to_string().contains(words), "{}: {err}", path.display());
    }
    agent_still_answers(client).await;
    client.remove(&dir, true).await.unwrap();
}

pub async fn names_that_are_not_utf8_survive_the_round_trip(target: Target) {
    let client = target.client();
    let dir = target.scratch("names").await;
    let name: &[u8] = b"caf\xe9-\xff";
    let path = dir.join(OsStr::from_bytes(name));
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
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound));
    client.remove(&dir, true).await.unwrap();
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
