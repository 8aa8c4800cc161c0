//! The hybrid-vsock handshake.
//!
//! Firecracker, Cloud Hypervisor and vhost-device-vsock expose a guest's vsock ports
//! on one Unix socket. The host connects, writes `CONNECT <port>\n`, and the VMM
//! answers one line: `OK <host port>\n` once the guest accepted, anything else (or a
//! hang-up) when nothing listens on that port yet. After the line the socket is a
//! plain byte stream to the guest.
//!
//! The answer is read one byte at a time so that nothing after the newline, which
//! already belongs to the agent's stream, is consumed here.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest answer line accepted; real VMMs send about a dozen bytes.
const MAX_ANSWER_BYTES: usize = 256;

/// Why the `CONNECT` handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HvsockError {
    /// Writing `CONNECT` or reading the answer failed.
    #[error("Socket I/O failed")]
    Io(#[from] io::Error),
    /// The VMM hung up before answering (usually: no guest listener on the port yet).
    #[error("VMM closed the connection before answering CONNECT {port}")]
    Closed {
        /// The guest port asked for.
        port: u32,
    },
    /// The VMM answered with something other than `OK ...`.
    #[error("VMM refused CONNECT {port}: {answer:?}")]
    Refused {
        /// The guest port asked for.
        port: u32,
        /// The line it sent instead, without the newline.
        answer: String,
    },
    /// The answer line went on past [`MAX_ANSWER_BYTES`].
    #[error("VMM answer to CONNECT {port} is longer than {MAX_ANSWER_BYTES} bytes")]
    AnswerTooLong {
        /// The guest port asked for.
        port: u32,
    },
}

/// Asks the VMM behind `stream` for guest port `port`; on success the stream is
/// connected to the guest and positioned right after the answer line.
pub async fn handshake<S>(stream: &mut S, port: u32) -> Result<(), HvsockError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    stream.flush().await?;
    let mut line = Vec::with_capacity(32);
    loop {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await? == 0 {
            return Err(HvsockError::Closed { port });
        }
        if byte[0] == b'\n' {
            break;
        }
        if line.len() == MAX_ANSWER_BYTES {
            return Err(HvsockError::AnswerTooLong { port });
        }
        line.push(byte[0]);
    }
    if line.starts_with(b"OK ") {
        Ok(())
    } else {
        Err(HvsockError::Refused {
            port,
            answer: String::from_utf8_lossy(&line).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{UnixListener, UnixStream};

    /// A VMM stand-in: reads the CONNECT line, checks it, writes `answer`, then keeps
    /// its end open (returned by the task) or hangs up when `answer` is empty.
    async fn fake_vmm(
        answer: &'static [u8],
    ) -> (UnixStream, tokio::task::JoinHandle<Option<UnixStream>>) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sandbox-hvsock-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.vsock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut byte = [0u8; 1];
            while conn.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
                got.push(byte[0]);
            }
            assert_eq!(got, b"CONNECT 1024");
            if answer.is_empty() {
                return None;
            }
            conn.write_all(answer).await.unwrap();
            Some(conn)
        });
        let client = UnixStream::connect(&path).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn ok_line_connects_and_leaves_following_bytes_unread() {
        let (mut client, server) = fake_vmm(b"OK 1\nagent-bytes").await;
        handshake(&mut client, 1024).await.unwrap();
        let mut rest = [0u8; 11];
        client.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"agent-bytes");
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn error_line_is_refused_with_its_text() {
        let (mut client, server) = fake_vmm(b"ERR no listener\n").await;
        let err = handshake(&mut client, 1024).await.unwrap_err();
        assert!(
            matches!(&err, HvsockError::Refused { port: 1024, answer } if answer == "ERR no listener"),
            "{err:?}"
        );
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn hang_up_before_answer_is_closed() {
        let (mut client, server) = fake_vmm(b"").await;
        let err = handshake(&mut client, 1024).await.unwrap_err();
        assert!(matches!(err, HvsockError::Closed { port: 1024 }), "{err:?}");
        assert!(server.await.unwrap().is_none());
    }

    #[tokio::test]
    async fn endless_answer_is_cut_off() {
        static LONG: [u8; 300] = [b'O'; 300];
        let (mut client, server) = fake_vmm(&LONG).await;
        let err = handshake(&mut client, 1024).await.unwrap_err();
        assert!(
            matches!(err, HvsockError::AnswerTooLong { port: 1024 }),
            "{err:?}"
        );
        drop(server.await.unwrap());
    }
}
