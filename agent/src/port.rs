//! Port pipes: a host connection turned into a byte pipe to a TCP port on the
//! guest's loopback (see `sandbox_protocol::port` for the wire).
//!
//! `server::connection` hands a connection here when its first request is a
//! `PortForward`, with the bytes it had already read past that frame. Here: take a
//! slot (at most [`MAX_PORT_CONNECTIONS`] pipes at once), connect to
//! `127.0.0.1:port`, answer `Done` or a typed error, then copy both ways with half
//! closes until both directions end, either side fails, or nothing moved for
//! [`PORT_IDLE_SECS`]. Memory per pipe is two copy buffers; a side that stops
//! reading stalls only its own pipe (the transport's flow control).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::port::{
    not_listening, MAX_PORT_CONNECTIONS, PORT_CONNECT_SECS, PORT_IDLE_SECS,
};
use sandbox_protocol::transport::FrameWriter;
use sandbox_protocol::{AgentFrame, AgentMsg, ErrorKind, Reply, RequestId, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes per read in each direction of a pipe.
const PIPE_CHUNK_BYTES: usize = 32 * 1024;

/// The agent's port pipes: the slots that cap them.
#[derive(Debug)]
pub struct Ports {
    slots: Arc<Semaphore>,
    idle: Duration,
}

impl Default for Ports {
    fn default() -> Self {
        Self::new(MAX_PORT_CONNECTIONS, Duration::from_secs(PORT_IDLE_SECS))
    }
}

impl Ports {
    /// At most `max` pipes at once, each closed after `idle` without a byte.
    pub fn new(max: usize, idle: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            idle,
        }
    }

    /// Serves one port pipe on `host`, whose `PortForward` came under `id`; `early`
    /// is what the host sent after that frame. Never fails: every refusal is
    /// answered on `host`, every error after it ends the pipe.
    pub async fn serve<H>(&self, mut host: H, early: Vec<u8>, id: RequestId, port: u16)
    where
        H: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let opened = self.open(port).await;
        let msg = match &opened {
            Ok(_) => AgentMsg::Reply(Reply::Done),
            Err(error) => AgentMsg::Error(error.clone()),
        };
        let mut writer = FrameWriter::new(&mut host, MAX_FRAME_BYTES);
        if writer.write(&AgentFrame { id, msg }).await.is_err() {
            return;
        }
        let (guest, _slot) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::info!(port, %error, "port connection refused");
                let _ = host.shutdown().await;
                return;
            }
        };
        tracing::debug!(port, "port pipe open");
        match pipe(host, guest, early, self.idle).await {
            Ok(Ended::Closed) => tracing::debug!(port, "port pipe closed"),
            Ok(Ended::Idle) => tracing::info!(port, "port pipe closed after idling"),
            Err(error) => tracing::debug!(port, %error, "port pipe failed"),
        }
    }

    /// A slot and a connection to the guest port, or why not.
    async fn open(&self, port: u16) -> Result<(TcpStream, OwnedSemaphorePermit), WireError> {
        if port == 0 {
            return Err(WireError::new(
                ErrorKind::BadRequest,
                "guest port 0 is not a port",
            ));
        }
        let slot = self.slots.clone().try_acquire_owned().map_err(|_| {
            WireError::new(
                ErrorKind::Busy,
                format!(
                    "{MAX_PORT_CONNECTIONS} port connections are open in this sandbox; close one first"
                ),
            )
        })?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let connect = TcpStream::connect(addr);
        let guest =
            match tokio::time::timeout(Duration::from_secs(PORT_CONNECT_SECS), connect).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Err(not_listening(port))
                }
                Ok(Err(error)) => {
                    return Err(WireError::from_io(
                        format_args!("connecting to guest port {port}"),
                        &error,
                    ))
                }
                Err(_) => {
                    return Err(WireError::new(
                        ErrorKind::TimedOut,
                        format!(
                            "guest port {port} accepted no connection within {PORT_CONNECT_SECS} s"
                        ),
                    ))
                }
            };
        // Requests and answers are small: send each as it comes.
        let _ = guest.set_nodelay(true);
        Ok((guest, slot))
    }
}

/// How a pipe ended without an error.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Both directions reached their end of stream.
    Closed,
    /// Nothing moved for the idle bound.
    Idle,
}

/// Copies host ⇄ guest until both directions end (each end of stream is passed on as
/// a write shutdown), an error on either, or `idle` without a byte.
async fn pipe<H>(
    host: H,
    guest: TcpStream,
    early: Vec<u8>,
    idle: Duration,
) -> std::io::Result<Ended>
where
    H: AsyncRead + AsyncWrite + Unpin + Send,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (mut host_read, mut host_write) = tokio::io::split(host);
    let (mut guest_read, mut guest_write) = guest.into_split();
    let up = async {
        guest_write.write_all(&early).await?;
        copy(&mut host_read, &mut guest_write, start, &last).await?;
        guest_write.shutdown().await
    };
    let down = async {
        copy(&mut guest_read, &mut host_write, start, &last).await?;
        host_write.shutdown().await
    };
    tokio::select! {
        result = async { tokio::try_join!(up, down) } => result.map(|_| Ended::Closed),
        () = idle_out(start, &last, idle) => Ok(Ended::Idle),
    }
}

/// Copies until `from` ends, noting the time of every chunk in `last` (milliseconds
/// since `start`).
async fn copy<R, W>(
    from: &mut R,
    to: &mut W,
    start: Instant,
    last: &AtomicU64,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; PIPE_CHUNK_BYTES];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        last.store(millis_since(start), Ordering::Relaxed);
    }
}

/// Resolves once nothing has moved for `idle`.
async fn idle_out(start: Instant, last: &AtomicU64, idle: Duration) {
    loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = start + since + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

fn millis_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::frame::Decoded;
    use sandbox_protocol::transport::FrameReader;
    use tokio::net::TcpListener;

    /// Serves `port` on one end of a duplex and returns the other end, past the answer.
    async fn ask(ports: Arc<Ports>, port: u16) -> (tokio::io::DuplexStream, AgentMsg) {
        let (near, far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move { ports.serve(far, Vec::new(), RequestId(1), port).await });
        let mut reader = FrameReader::new(near, MAX_FRAME_BYTES);
        let Some(Decoded::Frame(AgentFrame { id, msg })) =
            reader.read::<AgentFrame>().await.unwrap()
        else {
            panic!("no answer");
        };
        assert_eq!(id, RequestId(1));
        let (near, early) = reader.into_parts();
        assert!(early.is_empty());
        (near, msg)
    }

    async fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let _ = stream.read_to_end(&mut got).await;
                    // Answer after the client's half close: it must still get this.
                    let _ = stream.write_all(&got).await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_half_closed_pipe_still_gets_the_answer() {
        let port = echo_server().await;
        let (mut near, msg) = ask(Arc::new(Ports::default()), port).await;
        assert_eq!(msg, AgentMsg::Reply(Reply::Done));
        near.write_all(b"hello port").await.unwrap();
        near.shutdown().await.unwrap();
        let mut back = Vec::new();
        near.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"hello port");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_typed_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let (_near, msg) = ask(Arc::new(Ports::default()), port).await;
        assert_eq!(msg, AgentMsg::Error(not_listening(port)));
        let AgentMsg::Error(error) = msg else {
            unreachable!()
        };
        assert_eq!(
            error.message,
            format!("nothing is listening on guest port {port}")
        );
    }

    #[tokio::test]
    async fn port_zero_is_a_bad_request() {
        let (_near, msg) = ask(Arc::new(Ports::default()), 0).await;
        assert!(matches!(
            msg,
            AgentMsg::Error(WireError {
                kind: ErrorKind::BadRequest,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn past_the_cap_is_busy_and_a_closed_pipe_frees_its_slot() {
        let port = echo_server().await;
        let ports = Arc::new(Ports::new(2, Duration::from_secs(60)));
        let (first, a) = ask(ports.clone(), port).await;
        let (_second, b) = ask(ports.clone(), port).await;
        let (_third, c) = ask(ports.clone(), port).await;
        assert_eq!(a, AgentMsg::Reply(Reply::Done));
        assert_eq!(b, AgentMsg::Reply(Reply::Done));
        assert!(
            matches!(
                c,
                AgentMsg::Error(WireError {
                    kind: ErrorKind::Busy,
                    ..
                })
            ),
            "{c:?}"
        );
        // The first pipe ends (the host hangs up; the echo server answers into the
        // void and closes): its slot comes back.
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (_again, msg) = ask(ports.clone(), port).await;
            if msg == AgentMsg::Reply(Reply::Done) {
                break;
            }
            assert!(Instant::now() < deadline, "the slot never came back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn an_idle_pipe_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // A server that accepts and never says a word.
        let held = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        });
        let ports = Arc::new(Ports::new(4, Duration::from_millis(200)));
        let (mut near, msg) = ask(ports, port).await;
        assert_eq!(msg, AgentMsg::Reply(Reply::Done));
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        near.read_to_end(&mut rest).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        held.abort();
    }

    #[tokio::test]
    async fn early_bytes_reach_the_guest_first() {
        let port = echo_server().await;
        let (near, far) = tokio::io::duplex(64 * 1024);
        let ports = Ports::default();
        let serve = tokio::spawn(async move {
            ports
                .serve(far, b"early ".to_vec(), RequestId(1), port)
                .await;
        });
        let mut reader = FrameReader::new(near, MAX_FRAME_BYTES);
        let _ = reader.read::<AgentFrame>().await.unwrap();
        let (mut near, _) = reader.into_parts();
        near.write_all(b"late").await.unwrap();
        near.shutdown().await.unwrap();
        let mut back = Vec::new();
        near.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"early late");
        serve.await.unwrap();
    }
}
