//! Where a child's output is read from: a pipe or a terminal, in chunks.
//!
//! # Why a streaming pipe is read on a timer
//! Under TCG every chunk the agent forwards costs the guest's one vCPU about a
//! millisecond and a half (the wake-up, the frame, the link's write and the VM exit
//! behind it), whatever its size; and every `write` a child makes to a pipe the
//! agent polls wakes the agent, which preempts the child. A program that prints in
//! 4 KiB pieces (anything writing through stdio to a pipe) would spend most of its
//! time on its reader. So once a pipe has been read recently (it is *streaming*),
//! its next read takes the pipe out of the reactor, sleeps [`COALESCE_WAIT`] while
//! the child writes into it undisturbed, and reads what accumulated; it stays out
//! while the stream goes on, and only a read that finds it empty puts it back, to
//! be woken by the next write. A pipe
//! holding [`COALESCE_BYTES`] or more is read at once, and a streaming pipe is made
//! [`PIPE_BYTES`] large, so a fast writer rarely blocks on a full pipe meanwhile.
//!
//! A writer fast enough to fill the pipe before the wait is over (`dd`, `cat` of a
//! big file) would sit blocked for the rest of it, the guest idle: each wait that
//! ends on a full pipe halves the next one (down to [`MIN_COALESCE_WAIT`]), and each
//! that does not doubles it back (up to [`COALESCE_WAIT`]).
//!
//! The first write after a quiet spell is read at once (an interactive program's
//! line is not held back), and so is everything once the process exited (its exec's
//! reply waits for it). A terminal is never held back: its echo is typing's
//! feedback.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use super::buffers::OUTPUT_BUFFERS;
use crate::sys;

/// How long a streaming pipe's read lets the child write before taking what the
/// pipe holds: the most a streamed line is held back.
pub const COALESCE_WAIT: Duration = Duration::from_millis(20);

/// The shortest wait a fast writer brings a streaming pipe's down to (see
/// [`OutputPipe::adapt_wait`]).
pub const MIN_COALESCE_WAIT: Duration = Duration::from_millis(1);

/// A pipe's capacity before it is enlarged (the kernel's default).
const DEFAULT_PIPE_BYTES: usize = 64 * 1024;

/// A pipe read again within this long of its last read is streaming.
pub const BURST_GAP: Duration = Duration::from_millis(50);

/// A streaming pipe holding this much is read without waiting.
pub const COALESCE_BYTES: usize = 32 * 1024;

/// The capacity asked for the agent's output pipes (the kernel's default is 64
/// KiB): what a child can write during one [`COALESCE_WAIT`] without blocking. The
/// kernel allocates a pipe's pages only as they are written, so an idle pipe costs
/// no more than a small one.
pub const PIPE_BYTES: usize = 1024 * 1024;

/// Where output comes from.
#[derive(Debug)]
pub enum Source {
    /// A pipe (stdout or stderr).
    Pipe(OutputPipe),
    /// A terminal's master end.
    Terminal(Arc<AsyncFd<OwnedFd>>),
}

impl Source {
    /// A pipe's read end.
    pub fn pipe(receiver: pipe::Receiver) -> Self {
        Self::Pipe(OutputPipe {
            state: PipeState::Registered(receiver),
            enlarged: false,
            capacity: DEFAULT_PIPE_BYTES,
            wait: COALESCE_WAIT,
        })
    }

    /// The next chunk of at most `max` bytes, or `None` at end of file. Cancel-safe.
    /// `last_read` is when the previous chunk was read: a pipe read again within
    /// [`BURST_GAP`] of it is streaming (see the module's documentation). `None`
    /// reads at once; a terminal always does.
    pub async fn read_chunk(
        &mut self,
        max: usize,
        last_read: Option<Instant>,
    ) -> io::Result<Option<Vec<u8>>> {
        match self {
            Self::Pipe(pipe) => pipe.read_chunk(max, last_read).await,
            Self::Terminal(fd) => read_terminal(fd, max).await,
        }
    }
}

/// A pipe's read end, in the reactor or, while it streams, out of it.
#[derive(Debug)]
pub struct OutputPipe {
    state: PipeState,
    /// Made [`PIPE_BYTES`] large (when it first streamed: a short-lived child's
    /// pipes are never resized).
    enlarged: bool,
    /// What the pipe holds when full, as far as the agent knows.
    capacity: usize,
    /// How long the next streaming read lets the child write.
    wait: Duration,
}

#[derive(Debug)]
enum PipeState {
    /// Polled by the reactor: the child's next write wakes the reader.
    Registered(pipe::Receiver),
    /// Out of the reactor (non-blocking): the child's writes wake nobody.
    Unregistered(OwnedFd),
    /// Putting the descriptor back into the reactor failed; every read fails.
    Broken,
}

impl OutputPipe {
    async fn read_chunk(
        &mut self,
        max: usize,
        last_read: Option<Instant>,
    ) -> io::Result<Option<Vec<u8>>> {
        let streaming = last_read.is_some_and(|at| at.elapsed() < BURST_GAP);
        let mut waited = !streaming;
        let mut slept = false;
        loop {
            match &self.state {
                PipeState::Registered(receiver) => {
                    receiver.readable().await?;
                    if !waited {
                        waited = true;
                        if queued(receiver.as_fd()) < COALESCE_BYTES.min(max) {
                            self.unregister()?;
                            // Cancelled here, the pipe stays out of the reactor
                            // with nothing read; the next call reads it.
                            tokio::time::sleep(self.wait).await;
                            slept = true;
                            continue;
                        }
                    }
                    match receiver.try_io(|| read_pooled(receiver.as_fd(), max)) {
                        Ok(chunk) => return Ok(chunk),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                PipeState::Unregistered(fd) => {
                    let queued = queued(fd.as_fd());
                    if slept {
                        slept = false;
                        self.wait = next_wait(self.wait, self.capacity, queued);
                    }
                    if !waited {
                        waited = true;
                        if queued < COALESCE_BYTES.min(max) {
                            tokio::time::sleep(self.wait).await;
                            slept = true;
                            continue;
                        }
                    }
                    // Empty (or at its end): the reactor says which, without a
                    // buffer allocated for nothing.
                    if queued == 0 {
                        self.register()?;
                        continue;
                    }
                    // A buffer the size of what is there: no 64 KiB zeroed and
                    // kept for a few bytes.
                    match read_up_to(fd.as_fd(), queued.min(max))? {
                        Some(buf) if buf.is_empty() => return Ok(None),
                        Some(buf) => return Ok(Some(buf)),
                        // Empty: the next write wakes the reader again.
                        None => self.register()?,
                    }
                }
                PipeState::Broken => {
                    return Err(io::Error::other(
                        "the output pipe could not rejoin the reactor",
                    ))
                }
            }
        }
    }

    #[cfg(test)]
    fn adapt_wait(&mut self, queued: usize) {
        self.wait = next_wait(self.wait, self.capacity, queued);
    }

    fn unregister(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.state, PipeState::Broken) {
            PipeState::Registered(receiver) => {
                let fd = receiver.into_nonblocking_fd()?;
                if !self.enlarged {
                    self.enlarged = true;
                    if let Some(capacity) = enlarge(&fd) {
                        self.capacity = capacity;
                    }
                }
                self.state = PipeState::Unregistered(fd);
            }
            other => self.state = other,
        }
        Ok(())
    }

    fn register(&mut self) -> io::Result<()> {
        if let PipeState::Unregistered(fd) = std::mem::replace(&mut self.state, PipeState::Broken) {
            // It was registered before, so it is a pipe's read end in
            // non-blocking mode still: the checks would be three system calls.
            self.state = PipeState::Registered(pipe::Receiver::from_owned_fd_unchecked(fd)?);
        }
        Ok(())
    }
}

/// The wait after one of `wait` that found `queued` bytes in a pipe of `capacity`:
/// a pipe (nearly) full had its writer blocked for part of the wait, so the next is
/// halved; otherwise it is doubled back toward [`COALESCE_WAIT`].
fn next_wait(wait: Duration, capacity: usize, queued: usize) -> Duration {
    let full = queued >= capacity - capacity / 8;
    if full {
        (wait / 2).max(MIN_COALESCE_WAIT)
    } else {
        (wait * 2).min(COALESCE_WAIT)
    }
}

/// Bytes the pipe holds; 0 when the kernel cannot tell (the read then waits).
fn queued(fd: BorrowedFd<'_>) -> usize {
    sys::bytes_queued(fd).unwrap_or(0)
}

/// One non-blocking read of at most `max` bytes: `Some(empty)` at end of file,
/// `None` when the pipe is empty.
fn read_up_to(fd: BorrowedFd<'_>, max: usize) -> io::Result<Option<Vec<u8>>> {
    loop {
        match read_pooled(fd, max) {
            Ok(Some(buf)) => return Ok(Some(buf)),
            Ok(None) => return Ok(Some(Vec::new())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// One `read(2)` of at most `max` bytes into a buffer from [`OUTPUT_BUFFERS`]:
/// the bytes read, `None` at end of file. The buffer goes back to the pool unless
/// it carries bytes.
fn read_pooled(fd: BorrowedFd<'_>, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = OUTPUT_BUFFERS.take(max);
    let read = sys::read_into_spare(fd, &mut buf, max);
    match read {
        Ok(n) if n > 0 => Ok(Some(buf)),
        other => {
            OUTPUT_BUFFERS.give_back(buf);
            other.map(|_end| None)
        }
    }
}

async fn read_terminal(fd: &AsyncFd<OwnedFd>, max: usize) -> io::Result<Option<Vec<u8>>> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| read_pooled(inner.get_ref().as_fd(), max)) {
            Err(_would_block) => continue,
            Ok(Ok(chunk)) => return Ok(chunk),
            // The last holder of the terminal's other end closed it.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(None),
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// Asks for a [`PIPE_BYTES`] pipe and answers its new capacity; a kernel that
/// refuses keeps the default size (only the coalescing suffers).
fn enlarge(fd: &OwnedFd) -> Option<usize> {
    match sys::set_pipe_size(fd.as_fd(), PIPE_BYTES) {
        Ok(capacity) => Some(capacity),
        Err(error) => {
            tracing::debug!(%error, "cannot enlarge an output pipe");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A pipe whose read end is a [`Source`] and whose write end a blocking `File`.
    fn pipe_pair() -> (Source, std::fs::File) {
        let (read, write) = nix::unistd::pipe().unwrap();
        let receiver = pipe::Receiver::from_owned_fd(read).unwrap();
        (Source::pipe(receiver), std::fs::File::from(write))
    }

    #[tokio::test]
    async fn a_quiet_pipe_is_read_at_once() {
        let (mut source, mut writer) = pipe_pair();
        writer.write_all(b"hello").unwrap();
        let started = Instant::now();
        let long_ago = Instant::now().checked_sub(BURST_GAP * 2);
        let chunk = source.read_chunk(1024, long_ago).await.unwrap();
        assert_eq!(chunk.as_deref(), Some(&b"hello"[..]));
        assert!(started.elapsed() < COALESCE_WAIT, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_streaming_pipe_gathers_what_the_child_writes_meanwhile() {
        let (mut source, mut writer) = pipe_pair();
        let writes = std::thread::spawn(move || {
            for _ in 0..40 {
                writer.write_all(&[b'x'; 100]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let (mut total, mut chunks, mut last_read) = (0, 0, None);
        while let Some(chunk) = source.read_chunk(64 * 1024, last_read).await.unwrap() {
            last_read = Some(Instant::now());
            total += chunk.len();
            chunks += 1;
        }
        writes.join().unwrap();
        assert_eq!(total, 4000);
        // 40 writes 1 ms apart: read at most every COALESCE_WAIT after the first.
        assert!(chunks <= 10, "{chunks} chunks");
    }

    #[tokio::test]
    async fn a_full_streaming_pipe_is_read_without_waiting() {
        let (mut source, mut writer) = pipe_pair();
        writer.write_all(&vec![7u8; COALESCE_BYTES]).unwrap();
        let started = Instant::now();
        let chunk = source
            .read_chunk(64 * 1024, Some(Instant::now()))
            .await
            .unwrap();
        assert_eq!(chunk.map(|c| c.len()), Some(COALESCE_BYTES));
        assert!(started.elapsed() < COALESCE_WAIT, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_writer_that_fills_the_pipe_shortens_the_wait_and_a_slow_one_restores_it() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let receiver = pipe::Receiver::from_owned_fd(read).unwrap();
        let Source::Pipe(mut pipe) = Source::pipe(receiver) else {
            unreachable!()
        };
        let mut writer = std::fs::File::from(write);
        // A first streaming read takes the pipe out of the reactor and enlarges it.
        writer.write_all(b"x").unwrap();
        pipe.read_chunk(64 * 1024, Some(Instant::now()))
            .await
            .unwrap();
        assert_eq!(pipe.capacity, PIPE_BYTES);
        let capacity = pipe.capacity;
        // Full after every wait: the waits shrink to the floor.
        for _ in 0..8 {
            pipe.adapt_wait(capacity);
        }
        assert_eq!(pipe.wait, MIN_COALESCE_WAIT);
        // Little written during the waits: back to the full wait.
        for _ in 0..8 {
            pipe.adapt_wait(100);
        }
        assert_eq!(pipe.wait, COALESCE_WAIT);
        // Real waits: a writer with twice the pipe's capacity to write fills it
        // during each wait, and the waits get shorter.
        let fill = vec![1u8; 2 * capacity];
        let filler = std::thread::spawn(move || writer.write_all(&fill));
        let (mut total, mut shortest) = (0, COALESCE_WAIT);
        while total < 2 * capacity {
            let chunk = pipe.read_chunk(64 * 1024, Some(Instant::now())).await;
            total += chunk.unwrap().map_or(0, |c| c.len());
            shortest = shortest.min(pipe.wait);
        }
        filler.join().unwrap().unwrap();
        assert!(shortest <= COALESCE_WAIT / 2, "{shortest:?}");
    }

    #[tokio::test]
    async fn a_read_cancelled_while_waiting_loses_nothing() {
        let (mut source, mut writer) = pipe_pair();
        writer.write_all(b"abc").unwrap();
        let cut = tokio::time::timeout(
            COALESCE_WAIT / 4,
            source.read_chunk(1024, Some(Instant::now())),
        )
        .await;
        assert!(cut.is_err(), "the streaming read waits");
        writer.write_all(b"def").unwrap();
        drop(writer);
        let chunk = source.read_chunk(1024, None).await.unwrap();
        assert_eq!(chunk.as_deref(), Some(&b"abcdef"[..]));
        assert_eq!(source.read_chunk(1024, None).await.unwrap(), None);
    }
}
