//! Waiting for the agent's `Ready`.
//!
//! Once it listens, the agent connects to the host on
//! [`READY_VSOCK_PORT`](sandbox_protocol::limits::READY_VSOCK_PORT) and writes one frame
//! holding a [`Ready`]. `vhost-device-vsock` turns that connection into a connection
//! to the Unix socket `vm.vsock_<port>`, so the launcher binds that socket **before**
//! QEMU starts and accepts exactly one connection. Nothing polls the guest during boot.

use std::path::{Path, PathBuf};

use sandbox_protocol::frame::{Decoded, FrameDecoder, FrameError};
use sandbox_protocol::{Ready, MAGIC, PROTOCOL_VERSION};
use tokio::io::AsyncReadExt;
use tokio::net::UnixListener;

/// The largest `Ready` body accepted; a real one is well under 100 bytes.
pub const READY_FRAME_MAX_BYTES: usize = 4096;

/// How many leading bytes of a bad message an error quotes.
const QUOTED_BYTES: usize = 32;

/// Why no valid `Ready` came out of the readiness connection.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    /// The listening socket could not be created.
    #[error("Cannot listen on {path}")]
    Listen {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// Accepting the connection failed.
    #[error("Cannot accept the readiness connection")]
    Accept(#[source] std::io::Error),
    /// Reading the frame failed.
    #[error("Cannot read the readiness frame")]
    Read(#[source] std::io::Error),
    /// The guest closed the connection before a whole frame arrived.
    #[error("The guest closed the readiness connection after {received} bytes")]
    Closed {
        /// Bytes received.
        received: usize,
    },
    /// The bytes are not a `Ready` frame (a foreign or broken agent).
    #[error("The readiness message is not a Ready frame (starts with {head})")]
    Malformed {
        /// The first bytes, escaped.
        head: String,
        /// Why decoding failed.
        #[source]
        error: FrameError,
    },
    /// The frame is not from a sandbox agent.
    #[error("The readiness frame has magic {found:?}, expected {MAGIC:?}")]
    Magic {
        /// What arrived.
        found: [u8; 4],
    },
    /// The agent speaks another protocol version.
    #[error("The agent speaks protocol version {found}, this host speaks {PROTOCOL_VERSION}")]
    Version {
        /// The agent's version.
        found: u32,
    },
}

/// The host end of the readiness port.
#[derive(Debug)]
pub(crate) struct ReadyListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ReadyListener {
    /// Binds `path` (inside the run folder). Needs a tokio runtime.
    pub(crate) fn bind(path: &Path) -> Result<Self, ReadyError> {
        let listener = UnixListener::bind(path).map_err(|error| ReadyError::Listen {
            path: path.to_owned(),
            error,
        })?;
        Ok(Self {
            listener,
            path: path.to_owned(),
        })
    }

    /// Accepts the guest's connection and reads its one `Ready` frame. A connection
    /// that closes without sending a byte is skipped: the agent retries a failed
    /// attempt, and a failed attempt may still reach the host as an empty connection.
    pub(crate) async fn receive(&self) -> Result<Ready, ReadyError> {
        loop {
            match self.receive_one().await {
                Err(ReadyError::Closed { received: 0 }) => {
                    tracing::debug!(path = %self.path.display(), "empty readiness connection; waiting for another");
                }
                other => return other,
            }
        }
    }

    async fn receive_one(&self) -> Result<Ready, ReadyError> {
        let (mut stream, _) = self.listener.accept().await.map_err(ReadyError::Accept)?;
        tracing::debug!(path = %self.path.display(), "readiness connection");
        let mut decoder = FrameDecoder::new(READY_FRAME_MAX_BYTES);
        let mut buf = Vec::with_capacity(256);
        loop {
            if let (_, Some(decoded)) = decoder.decode::<Ready>(&buf) {
                return match decoded {
                    Decoded::Frame(ready) => check(ready),
                    Decoded::Rejected { error, .. } => Err(ReadyError::Malformed {
                        head: quote(&buf),
                        error,
                    }),
                };
            }
            let start = buf.len();
            let wanted = decoder.bytes_wanted(&buf).max(start + 64);
            buf.resize(wanted, 0);
            let read = stream
                .read(&mut buf[start..])
                .await
                .map_err(ReadyError::Read)?;
            buf.truncate(start + read);
            if read == 0 {
                return Err(ReadyError::Closed { received: start });
            }
        }
    }
}

impl Drop for ReadyListener {
    fn drop(&mut self) {
        // The run folder goes away too; this only matters when it is kept.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn check(ready: Ready) -> Result<Ready, ReadyError> {
    if ready.magic != MAGIC {
        return Err(ReadyError::Magic { found: ready.magic });
    }
    if ready.version != PROTOCOL_VERSION {
        return Err(ReadyError::Version {
            found: ready.version,
        });
    }
    Ok(ready)
}

/// The first bytes of `buf` as an escaped, quoted string.
fn quote(buf: &[u8]) -> String {
    let head = &buf[..buf.len().min(QUOTED_BYTES)];
    format!("\"{}\"", head.escape_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::frame::encode;
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    fn socket(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("sbx-ready-{tag}-{}", std::process::id()))
    }

    fn ready() -> Ready {
        Ready {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            agent_version: "0.1.0".into(),
            boot_id: "b".into(),
            uptime_ms: 900,
        }
    }

    async fn send_and_receive(tag: &str, chunks: Vec<Vec<u8>>) -> Result<Ready, ReadyError> {
        let path = socket(tag);
        let _ = std::fs::remove_file(&path);
        let listener = ReadyListener::bind(&path).unwrap();
        let writer = tokio::spawn({
            let path = path.clone();
            async move {
                let mut stream = UnixStream::connect(&path).await.unwrap();
                for chunk in chunks {
                    stream.write_all(&chunk).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        });
        let result = listener.receive().await;
        writer.await.unwrap();
        result
    }

    #[tokio::test]
    async fn a_ready_frame_in_pieces_is_received() {
        let bytes = encode(&ready(), READY_FRAME_MAX_BYTES).unwrap();
        let chunks = bytes.chunks(3).map(<[u8]>::to_vec).collect();
        assert_eq!(send_and_receive("pieces", chunks).await.unwrap(), ready());
    }

    #[tokio::test]
    async fn a_foreign_message_is_quoted_in_the_error() {
        let err = send_and_receive("foreign", vec![b"READY 123456\n".to_vec()])
            .await
            .unwrap_err();
        assert!(matches!(err, ReadyError::Malformed { .. }), "{err}");
        assert!(err.to_string().contains("READY 123456"), "{err}");
    }

    #[tokio::test]
    async fn wrong_magic_version_and_early_close_are_errors() {
        let mut bad = ready();
        bad.magic = *b"XXXX";
        let err = send_and_receive("magic", vec![encode(&bad, 4096).unwrap()]).await;
        assert!(matches!(err, Err(ReadyError::Magic { .. })));
        let mut bad = ready();
        bad.version = 99;
        let err = send_and_receive("version", vec![encode(&bad, 4096).unwrap()]).await;
        assert!(matches!(err, Err(ReadyError::Version { found: 99 })));
        let err = send_and_receive("closed", vec![vec![20, 0, 0]]).await;
        assert!(matches!(err, Err(ReadyError::Closed { received: 3 })));
    }

    #[tokio::test]
    async fn an_empty_connection_is_skipped_for_the_next_one() {
        let path = socket("retry");
        let _ = std::fs::remove_file(&path);
        let listener = ReadyListener::bind(&path).unwrap();
        let writer = tokio::spawn({
            let path = path.clone();
            async move {
                drop(UnixStream::connect(&path).await.unwrap());
                let mut stream = UnixStream::connect(&path).await.unwrap();
                let frame = encode(&ready(), READY_FRAME_MAX_BYTES).unwrap();
                stream.write_all(&frame).await.unwrap();
            }
        });
        assert_eq!(listener.receive().await.unwrap(), ready());
        writer.await.unwrap();
    }
}
