//! File descriptors: non-blocking mode, single reads and writes, and registration
//! with tokio's reactor.
//!
//! A terminal's master end has no tokio type of its own, so the process layer drives
//! it through an [`AsyncFd`] and these single `read`/`write` calls inside `try_io`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;

/// Puts `fd` into non-blocking mode (for tokio's [`AsyncFd`]).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Puts the agent's end of a pipe it has just made into non-blocking mode: one
/// `fcntl`, as such an end has no other status flag to keep (`F_SETFL` ignores the
/// access mode). Tokio's checked constructors spend three calls on it (`fstat`,
/// `F_GETFL`, `F_SETFL`), six or nine more system calls on every start.
pub fn set_fresh_pipe_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(())
}

/// One `read(2)` into `buf`: the bytes read, 0 at end of file. `WouldBlock` on a
/// non-blocking descriptor with nothing to read, as `AsyncFd::try_io` expects.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    Ok(nix::unistd::read(fd.as_raw_fd(), buf)?)
}

/// One `read(2)` of at most `max` bytes into the spare capacity of `buf` (no
/// zeroing first), appended to what it holds: the bytes read, 0 at end of file.
pub fn read_into_spare(fd: BorrowedFd<'_>, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(max);
    // SAFETY: `read` writes at most `len` bytes into `spare`, which has room for
    // `len`; the bytes it reports written are initialised before `set_len` counts them.
    let read = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), len) };
    let read = usize::try_from(read).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: see above; `read <= len <= spare capacity`.
    unsafe { buf.set_len(buf.len() + read) };
    Ok(read)
}

/// One `write(2)` of (a prefix of) `buf`: the bytes written.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    Ok(nix::unistd::write(fd, buf)?)
}

/// Bytes a pipe holds now, unread (`FIONREAD`).
pub fn bytes_queued(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one `int` through the pointer, which points at one.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(queued).unwrap_or(0))
}

/// Asks the kernel to make the pipe `fd` hold `bytes` (rounded up to pages).
pub fn set_pipe_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let bytes =
        libc::c_int::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // The kernel rounds up and answers the size it set.
    let set = fcntl(fd.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(bytes))?;
    usize::try_from(set).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Hands `fd` to tokio's reactor. The caller must be inside a tokio runtime.
pub fn register_async(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register` needs the descriptor to stay open and the same for the life
    // of the `AsyncFd`: an `OwnedFd` returns one descriptor until dropped, and the
    // `AsyncFd` owns it from here on, so nothing else can close it.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pipe_reads_what_was_written_and_would_block_when_empty() {
        let (reader, writer) = nix::unistd::pipe().unwrap();
        set_nonblocking(reader.as_fd()).unwrap();
        assert_eq!(write(writer.as_fd(), b"hi").unwrap(), 2);
        let mut buf = [0u8; 8];
        assert_eq!(read(reader.as_fd(), &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"hi");
        let empty = read(reader.as_fd(), &mut buf).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(bytes_queued(reader.as_fd()).unwrap(), 0);
        assert_eq!(write(writer.as_fd(), b"abc").unwrap(), 3);
        assert_eq!(bytes_queued(reader.as_fd()).unwrap(), 3);
        assert_eq!(read(reader.as_fd(), &mut buf).unwrap(), 3);
        set_pipe_size(reader.as_fd(), 1 << 20).unwrap();
        drop(writer);
        assert_eq!(read(reader.as_fd(), &mut buf).unwrap(), 0);
    }
}
