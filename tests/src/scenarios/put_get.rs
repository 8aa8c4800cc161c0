//! Streamed `put` and `get` of a big file ([`crate::transport::Facts::big_file_bytes`]:
//! 1 GiB on a host, 64 MiB in a guest's memory), checked with SHA-256 on both ends
//! and inside the agent's machine.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::Target;
use crate::{sh, within};

/// A round trip's limit: 1 GiB on a loaded two-core host takes minutes.
const ROUND_TRIP_SECS: u64 = 400;

pub async fn a_big_file_round_trips_with_its_checksum(target: Target) {
    let client = target.client();
    let size = target.facts().big_file_bytes;
    let dir = target.scratch("big").await;
    let remote = dir.join("big.bin");

    let started = Instant::now();
    let mut source = Pattern::new(size);
    let (written, mode) = within(
        ROUND_TRIP_SECS,
        client.put(&remote, Some(0o640), &mut source),
    )
    .await
    .unwrap();
    let put_took = started.elapsed();
    assert_eq!((written, mode), (size, 0o640));
    let sent = hex(source.hasher.finalize());

    // The agent's machine's own view of the file.
    let guest = sh(client, &format!("sha256sum '{}'", remote.display())).await;
    assert_eq!(guest.split_whitespace().next(), Some(sent.as_str()));

    let started = Instant::now();
    let mut sink = HashSink(Sha256::new(), 0);
    let (read, _) = within(ROUND_TRIP_SECS, client.get(&remote, &mut sink))
        .await
        .unwrap();
    let get_took = started.elapsed();
    assert_eq!((read, sink.1), (size, size));
    assert_eq!(hex(sink.0.finalize()), sent);
    client.remove(&dir, true).await.unwrap();
    eprintln!("{size} bytes: put {put_took:.2?}, get {get_took:.2?}");
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

/// Hashes and counts what it is given.
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
