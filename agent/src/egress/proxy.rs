//! The proxy on the guest's loopback: one task per program connection, at most
//! [`MAX_EGRESS_CONNECTIONS`] at once (more wait in the listen backlog).
//!
//! Per connection: read the head (at most [`HEAD_MAX_BYTES`], within
//! [`HEAD_TIMEOUT`]), ask the host to dial, then answer `200` to a `CONNECT` or send
//! the rewritten head upstream, and splice. Memory per connection is the head buffer
//! and the channel's window; a program that stops reading stalls only its channel.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::link::egress::{EGRESS_PROXY_PORT, MAX_EGRESS_CONNECTIONS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::http::{self, HeadError, Target, HEAD_MAX_BYTES};
use super::{DialError, Egress};

/// How long a program may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Listens on `127.0.0.1:EGRESS_PROXY_PORT` and serves until the agent ends.
pub async fn serve(egress: Arc<Egress>) -> std::io::Result<()> {
    let listener = bind().await?;
    let slots = Arc::new(Semaphore::new(MAX_EGRESS_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let egress = egress.clone();
        tokio::spawn(async move {
            handle(stream, &egress).await;
            drop(permit);
        });
    }
}

/// Binds the proxy port. The previous session's listener is aborted just before a
/// new session enables egress, and an aborted task lets go of its socket only when
/// the runtime drops it: so `AddrInUse` is retried briefly.
async fn bind() -> std::io::Result<TcpListener> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, EGRESS_PROXY_PORT));
    let mut tries = 0;
    loop {
        match TcpListener::bind(addr).await {
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse && tries < BIND_TRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            result => return result,
        }
    }
}

/// How many times [`bind`] tries, 10 ms apart.
const BIND_TRIES: u32 = 200;

/// One program connection.
async fn handle(mut stream: TcpStream, egress: &Egress) {
    let mut buf = Vec::with_capacity(1024);
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream, &mut buf)).await {
        Ok(Ok(Some(len))) => len,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            refuse(&mut stream, egress, 400, "Bad Request", &error.to_string()).await;
            return;
        }
        Err(_) => {
            refuse(
                &mut stream,
                egress,
                408,
                "Request Timeout",
                "No request head in time",
            )
            .await;
            return;
        }
    };
    let target = match http::parse(&buf[..head]) {
        Ok(target) => target,
        Err(error) => {
            refuse(&mut stream, egress, 400, "Bad Request", &error.to_string()).await;
            return;
        }
    };
    let (host, port) = target.destination();
    let channel = match egress.dial(host, port).await {
        Ok(Ok(channel)) => channel,
        Ok(Err((kind, message))) => {
            let (status, reason) = kind.http_status();
            answer(&mut stream, status, reason, &message).await;
            return;
        }
        Err(error @ (DialError::NoRoute | DialError::HostGone)) => {
            answer(&mut stream, 502, "Bad Gateway", &error.to_string()).await;
            return;
        }
        Err(error @ DialError::NoAnswer) => {
            answer(&mut stream, 504, "Gateway Timeout", &error.to_string()).await;
            return;
        }
        Err(error @ DialError::TooMany) => {
            answer(&mut stream, 503, "Service Unavailable", &error.to_string()).await;
            return;
        }
    };
    let rest = buf.split_off(head);
    let first = match target {
        Target::Connect { .. } => {
            if stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                channel.discard();
                return;
            }
            rest
        }
        Target::Forward { mut head, .. } => {
            head.extend_from_slice(&rest);
            head
        }
    };
    channel.splice(Prefixed::new(first, stream)).await;
}

/// Reads until the blank line: `Some(head length)`, `None` for a program that left
/// without sending anything.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<usize>, HeadError> {
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(len) = http::head_len(buf) {
            return Ok(Some(len));
        }
        http::check_prefix(buf)?;
        if buf.len() >= HEAD_MAX_BYTES {
            return Err(HeadError::TooLong);
        }
        let want = chunk.len().min(HEAD_MAX_BYTES - buf.len());
        match stream.read(&mut chunk[..want]).await {
            Ok(0) | Err(_) if buf.is_empty() => return Ok(None),
            Ok(0) | Err(_) => return Err(HeadError::NotHttp(http::printable(buf))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answers a request the proxy refused itself, and notes it in the host's log.
async fn refuse(stream: &mut TcpStream, egress: &Egress, status: u16, reason: &str, message: &str) {
    tracing::info!(status, message, "proxy request refused");
    egress.note_refusal(message).await;
    answer(stream, status, reason, message).await;
}

/// Writes a short error response and closes.
async fn answer(stream: &mut TcpStream, status: u16, reason: &str, message: &str) {
    let body = format!("sandbox egress: {message}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A stream whose first reads return `prefix`: the head (rewritten) and whatever the
/// program sent after it in the same reads.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = out.remaining().min(this.prefix.len() - this.at);
            out.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
