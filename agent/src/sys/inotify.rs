//! inotify behind tokio's reactor: one instance per watcher, read when the kernel
//! says it is readable, closed when dropped.
//!
//! The descriptor is non-blocking and close-on-exec, so a child started meanwhile
//! never inherits it and a read never parks the runtime's one thread. Dropping an
//! [`Inotify`] closes the descriptor, which removes every watch it holds: a wait
//! that is cancelled (its task aborted) leaves nothing behind in the kernel.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use nix::sys::inotify::{InitFlags, Inotify as RawInotify};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub use nix::sys::inotify::{AddWatchFlags as WatchMask, InotifyEvent, WatchDescriptor};

/// nix's instance, with the raw descriptor tokio's registration asks for.
#[derive(Debug)]
struct Fd(RawInotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify instance registered with the reactor.
#[derive(Debug)]
pub struct Inotify {
    fd: AsyncFd<Fd>,
}

impl Inotify {
    /// A new instance with no watches. Must be called inside a tokio runtime.
    /// Fails with `EMFILE` at the kernel's per-user instance limit
    /// (`fs.inotify.max_user_instances`, 128 by default).
    pub fn new() -> io::Result<Self> {
        let raw = RawInotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `register_with_interest` needs the descriptor to stay open and the
        // same for the life of the `AsyncFd`: `Fd` owns it (nix's instance holds an
        // `OwnedFd` and never replaces it), the `AsyncFd` owns `Fd` from here on, and
        // nothing else can close it.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(raw), Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Watches `path` for `mask`. Watching an inode already watched returns its
    /// descriptor again and replaces its mask. Does a path lookup: call it where
    /// blocking file I/O is allowed.
    pub fn add_watch(&self, path: &Path, mask: WatchMask) -> io::Result<WatchDescriptor> {
        Ok(self.fd.get_ref().0.add_watch(path, mask)?)
    }

    /// Stops a watch. A watch the kernel already dropped (its inode is gone) is
    /// `EINVAL`, which callers tidying up may ignore.
    pub fn rm_watch(&self, wd: WatchDescriptor) -> io::Result<()> {
        Ok(self.fd.get_ref().0.rm_watch(wd)?)
    }

    /// The next batch of events, waiting until there is one.
    pub async fn read_events(&self) -> io::Result<Vec<InotifyEvent>> {
        loop {
            let mut ready = self.fd.readable().await?;
            // `EAGAIN` comes back as `WouldBlock`: `try_io` then clears the readiness
            // and the loop waits for the next edge.
            if let Ok(events) = ready.try_io(|fd| Ok(fd.get_ref().0.read_events()?)) {
                return events;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_write_to_a_watched_file_is_read_as_an_event() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let inotify = Inotify::new().unwrap();
        let wd = inotify.add_watch(&file, WatchMask::IN_MODIFY).unwrap();
        // Nothing yet: the read waits.
        let early = tokio::time::timeout(Duration::from_millis(50), inotify.read_events()).await;
        assert!(early.is_err(), "an event before any change");
        std::fs::write(&file, b"x").unwrap();
        let events = tokio::time::timeout(Duration::from_secs(10), inotify.read_events())
            .await
            .expect("no event for a write")
            .unwrap();
        assert!(events
            .iter()
            .any(|e| e.wd == wd && e.mask.contains(WatchMask::IN_MODIFY)));
        inotify.rm_watch(wd).unwrap();
    }
}
