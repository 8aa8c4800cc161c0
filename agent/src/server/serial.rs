//! A virtio-serial port as a tokio byte stream.
//!
//! The guest end of a port is a character device (`/dev/vportNpM`), found by the
//! name QEMU gave it (`virtserialport,name=...`, shown in
//! `/sys/class/virtio-ports/*/name`). Two of its rules shape this type:
//! - It is opened once and never closed: closing drops whatever the kernel still
//!   queues for the host.
//! - While no host is connected a read returns 0 at once and poll reports it readable,
//!   so a plain reader would spin. Here a read of 0 clears the readiness and is
//!   reported as a 0-byte read; the next read then waits for the port's next wakeup
//!   (a host connecting and sending), which tokio's edge-triggered registration sees.
//!   A write while no host is connected waits the same way.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where the kernel lists virtio-serial ports.
pub const PORTS_DIR: &str = "/sys/class/virtio-ports";

/// How long to wait for the named port to appear (its driver probes after the agent
/// loaded the module).
pub const PORT_APPEAR_TIMEOUT: Duration = Duration::from_secs(10);

/// An open virtio-serial port.
#[derive(Debug)]
pub struct SerialPort {
    fd: AsyncFd<OwnedFd>,
    path: PathBuf,
}

impl SerialPort {
    /// Opens the port named `name`, waiting up to [`PORT_APPEAR_TIMEOUT`] for it.
    pub async fn open(name: &str) -> io::Result<Self> {
        let deadline = tokio::time::Instant::now() + PORT_APPEAR_TIMEOUT;
        loop {
            match find_port(Path::new(PORTS_DIR), name) {
                Some(device) => return Self::open_device(&device),
                None if tokio::time::Instant::now() >= deadline => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no virtio-serial port named {name:?} in {PORTS_DIR}"),
                    ))
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Opens a port's device node.
    pub fn open_device(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)?;
        Ok(Self {
            fd: crate::sys::fd::register_async(OwnedFd::from(file))?,
            path: path.to_owned(),
        })
    }

    /// The device node.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The device node of the port named `name`: `/dev/<entry>` for the entry of
/// `ports_dir` whose `name` file holds it.
pub fn find_port(ports_dir: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(ports_dir)
        .ok()?
        .flatten()
        .find(|entry| {
            std::fs::read_to_string(entry.path().join("name"))
                .is_ok_and(|found| found.trim_end() == name)
        })
        .map(|entry| Path::new("/dev").join(entry.file_name()))
}

impl AsyncRead for SerialPort {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| crate::sys::fd::read(fd.get_ref().as_fd(), unfilled)) {
                Ok(Ok(0)) => {
                    // No host connected: wait for the next wakeup, do not spin.
                    guard.clear_ready();
                    return Poll::Ready(Ok(()));
                }
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for SerialPort {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| crate::sys::fd::write(fd.get_ref().as_fd(), buf)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Never closed early: see the module docs.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_found_by_name() {
        let dir = std::env::temp_dir().join(format!("sbx-ports-{}", std::process::id()));
        for (entry, name) in [("vport0p1", "other"), ("vport0p2", "sandbox.agent")] {
            std::fs::create_dir_all(dir.join(entry)).unwrap();
            std::fs::write(dir.join(entry).join("name"), format!("{name}\n")).unwrap();
        }
        assert_eq!(
            find_port(&dir, "sandbox.agent"),
            Some(PathBuf::from("/dev/vport0p2"))
        );
        assert_eq!(find_port(&dir, "missing"), None);
        assert_eq!(find_port(&dir.join("nope"), "sandbox.agent"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
