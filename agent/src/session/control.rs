//! The control channel between the agent and a session's driver: a Unix socket pair
//! whose child end becomes the interpreter's fd 0 (the driver moves it aside at
//! once, see [`super::driver`]). Messages are framed by length (Python: a 4-byte
//! little-endian length, then the body) or by line (sh), never by a marker in the
//! output streams, so nothing user code prints can be taken for a message.
//!
//! Reads keep what they have read in the channel, so a read that loses a
//! `select!` race loses no byte: both reads are cancel-safe.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Longest line a shell driver may send.
pub const CONTROL_LINE_MAX_BYTES: usize = 4096;

/// Why a control message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The driver closed its end (it exited, or user code closed the socket).
    #[error("The driver closed the control channel")]
    Closed,
    /// A message longer than the channel admits: the driver is not ours, or broken.
    #[error("A control message of {len} bytes is over the limit of {max}")]
    TooLong {
        /// Its announced or read length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A message that is not what the protocol says.
    #[error("Unexpected control message: {0}")]
    Invalid(String),
    /// The socket failed.
    #[error("Control channel I/O failed")]
    Io(#[from] io::Error),
    /// The interpreter ended while a message was sent or awaited.
    #[error("The interpreter ended")]
    Exited(sandbox_protocol::ExitStatus),
}

/// The agent's end of a control channel.
#[derive(Debug)]
pub struct Control {
    stream: UnixStream,
    /// Bytes read and not yet returned as a message.
    buffer: Vec<u8>,
}

impl Control {
    /// A connected pair: the agent's end, and the child's (blocking, close-on-exec
    /// until it is made the child's stdin).
    pub fn pair() -> io::Result<(Self, OwnedFd)> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let stream = UnixStream::from_std(ours)?;
        Ok((
            Self {
                stream,
                buffer: Vec::new(),
            },
            OwnedFd::from(theirs),
        ))
    }

    /// Writes all of `bytes`. Not cancel-safe: a message cut short desynchronises
    /// the channel, so the caller only races it against the interpreter's death.
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// The next length-prefixed message body, refusing one over `max` bytes before
    /// reading it. Cancel-safe.
    pub async fn read_frame(&mut self, max: usize) -> Result<Vec<u8>, ControlError> {
        loop {
            if let Some(head) = self.buffer.first_chunk::<4>() {
                let len = usize::try_from(u32::from_le_bytes(*head)).unwrap_or(usize::MAX);
                if len > max {
                    return Err(ControlError::TooLong { len, max });
                }
                if self.buffer.len() >= 4 + len {
                    let body = self.buffer[4..4 + len].to_vec();
                    self.buffer.drain(..4 + len);
                    return Ok(body);
                }
            }
            self.fill().await?;
        }
    }

    /// The next line, without its newline, refusing one over `max` bytes.
    /// Cancel-safe.
    pub async fn read_line(&mut self, max: usize) -> Result<String, ControlError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                if end > max {
                    return Err(ControlError::TooLong { len: end, max });
                }
                let line = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
                self.buffer.drain(..=end);
                return Ok(line);
            }
            if self.buffer.len() > max {
                return Err(ControlError::TooLong {
                    len: self.buffer.len(),
                    max,
                });
            }
            self.fill().await?;
        }
    }

    /// Reads what the socket has into the buffer. Cancel-safe: `read_buf` reads
    /// nothing unless it completes.
    async fn fill(&mut self) -> Result<(), ControlError> {
        self.buffer.reserve(4096);
        match self.stream.read_buf(&mut self.buffer).await? {
            0 => Err(ControlError::Closed),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn frames_and_lines_arrive_whole_however_the_bytes_are_cut() {
        let (mut control, theirs) = Control::pair().unwrap();
        let mut theirs = std::os::unix::net::UnixStream::from(theirs);
        let writer = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&5u32.to_le_bytes());
            bytes.extend_from_slice(b"hello");
            bytes.extend_from_slice(b"done 3\nok\n");
            for byte in bytes {
                theirs.write_all(&[byte]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            theirs
        });
        assert_eq!(control.read_frame(16).await.unwrap(), b"hello");
        assert_eq!(control.read_line(16).await.unwrap(), "done 3");
        assert_eq!(control.read_line(16).await.unwrap(), "ok");
        drop(writer.join().unwrap());
        assert!(matches!(
            control.read_line(16).await,
            Err(ControlError::Closed)
        ));
    }

    #[tokio::test]
    async fn oversize_messages_are_refused_before_they_are_read() {
        let (mut control, theirs) = Control::pair().unwrap();
        let mut theirs = std::os::unix::net::UnixStream::from(theirs);
        theirs.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            control.read_frame(1024).await,
            Err(ControlError::TooLong { max: 1024, .. })
        ));
        let (mut control, theirs) = Control::pair().unwrap();
        let mut theirs = std::os::unix::net::UnixStream::from(theirs);
        theirs.write_all(&[b'x'; 100]).unwrap();
        assert!(matches!(
            control.read_line(10).await,
            Err(ControlError::TooLong { .. })
        ));
    }
}
