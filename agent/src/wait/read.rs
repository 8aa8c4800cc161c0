//! One scan step of a waited-for file: the blocking half of [`super::file`], run on
//! tokio's blocking pool.
//!
//! A [`FileScan`] remembers which file it scanned (device and inode) and how far, so
//! a step reads only what was appended since the last one. It starts over from
//! offset 0 when the file at the path is another one (replaced by a rename, or
//! deleted and created again), when it shrank (truncated), or when the last bytes it
//! scanned are no longer there (truncated and rewritten past the old size between
//! two steps; a rewrite that leaves those bytes as they were goes unseen). One step
//! reads at most [`STEP_BYTES`], so a wait that is cancelled meanwhile stops soon;
//! memory is one read buffer and the scanner's window, whatever the file's size.
//!
//! The path's kind is checked with `stat` before it is opened, and the open is
//! non-blocking: a FIFO is refused, never opened (opening one would block until a
//! writer came).

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::scan::{Hit, Scanner};
use super::WaitError;
use crate::files::{display, special_kind};

/// Bytes one step reads at most (before a match; completing a match's line may read
/// one more buffer).
pub const STEP_BYTES: u64 = 8 * 1024 * 1024;

/// Bytes one `pread` asks for.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes compared to tell an appended file from a rewritten one.
const TAIL_CHECK_BYTES: usize = 64;

/// Where a step left the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The text was found ([`FileScan::hit`]).
    Found,
    /// Everything in the file was scanned.
    CaughtUp,
    /// The step's budget ran out before the end of the file.
    More,
    /// No file at the path (yet).
    Missing,
}

/// A file's scan between steps; see the module docs.
#[derive(Debug)]
pub struct FileScan {
    path: PathBuf,
    scanner: Scanner,
    /// Device and inode of the file scanned, once one was.
    identity: Option<(u64, u64)>,
    /// Bytes scanned: the next read starts here.
    scanned: u64,
    /// The last bytes scanned (at most [`TAIL_CHECK_BYTES`]).
    tail: Vec<u8>,
    /// Times the scan started over on another or rewritten file.
    restarts: u32,
    /// Whether the last step found a file.
    exists: bool,
}

impl FileScan {
    /// A scan of `path` (absolute) with `scanner`, nothing read yet.
    pub fn new(path: PathBuf, scanner: Scanner) -> Self {
        Self {
            path,
            scanner,
            identity: None,
            scanned: 0,
            tail: Vec::new(),
            restarts: 0,
            exists: false,
        }
    }

    /// The match, once found.
    pub fn hit(&self) -> Option<&Hit> {
        self.scanner.hit()
    }

    /// What the scan saw, for a timeout's message.
    pub fn describe(&self) -> String {
        if !self.exists {
            return "it does not exist".to_owned();
        }
        let mut seen = format!("scanned {} bytes of it", self.scanned);
        match self.restarts {
            0 => {}
            1 => seen.push_str(", from the start again once as it was replaced or rewritten"),
            n => seen.push_str(&format!(
                ", from the start again {n} times as it was replaced or rewritten"
            )),
        }
        seen
    }

    /// Scans what was added since the last step, up to `budget` bytes.
    pub fn step(&mut self, budget: u64) -> Result<Step, WaitError> {
        let Some(file) = self.open()? else {
            self.exists = false;
            return Ok(Step::Missing);
        };
        self.exists = true;
        let mut buf = vec![0u8; READ_CHUNK_BYTES];
        let mut read = 0u64;
        loop {
            if self.scanner.done() {
                return Ok(Step::Found);
            }
            if read >= budget && self.scanner.hit().is_none() {
                return Ok(Step::More);
            }
            let n = read_at(&file, &mut buf, self.scanned).map_err(|e| self.io("read", e))?;
            let Some(data) = buf.get(..n).filter(|data| !data.is_empty()) else {
                // The end: a match whose line goes on past it is reported as it is.
                return Ok(match self.scanner.hit() {
                    Some(_) => Step::Found,
                    None => Step::CaughtUp,
                });
            };
            self.scanner.feed(self.scanned, data);
            self.remember_tail(data);
            self.scanned += n as u64;
            read += n as u64;
        }
    }

    /// Opens the file at the path if there is one, after checking its kind, and
    /// decides where scanning goes on: where it stopped, or from the start.
    fn open(&mut self) -> Result<Option<File>, WaitError> {
        // Check the kind before opening: opening a FIFO would block.
        let meta = match std::fs::metadata(&self.path) {
            Ok(meta) => meta,
            Err(error) if is_missing(&error) => return Ok(None),
            Err(error) => return Err(self.io("stat", error)),
        };
        self.check_kind(&meta)?;
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(&self.path)
        {
            Ok(file) => file,
            Err(error) if is_missing(&error) => return Ok(None),
            Err(error) => return Err(self.io("open", error)),
        };
        // The path may have been swapped between the two calls; trust what was opened.
        let meta = file.metadata().map_err(|e| self.io("stat", e))?;
        self.check_kind(&meta)?;
        let identity = (meta.dev(), meta.ino());
        let same_file = self.identity == Some(identity);
        if !same_file || meta.len() < self.scanned || !self.tail_is_unchanged(&file)? {
            if self.identity.is_some() {
                self.restarts += 1;
            }
            self.identity = Some(identity);
            self.scanned = 0;
            self.tail.clear();
            self.scanner.reset();
        }
        Ok(Some(file))
    }

    /// Whether the bytes just before the scanned offset are still those scanned.
    fn tail_is_unchanged(&self, file: &File) -> Result<bool, WaitError> {
        let Some(start) = self.scanned.checked_sub(self.tail.len() as u64) else {
            return Ok(false);
        };
        let mut now = vec![0u8; self.tail.len()];
        let mut filled = 0;
        while filled < now.len() {
            let Some(rest) = now.get_mut(filled..) else {
                break;
            };
            match read_at(file, rest, start + filled as u64).map_err(|e| self.io("read", e))? {
                0 => return Ok(false),
                n => filled += n,
            }
        }
        Ok(now == self.tail)
    }

    fn remember_tail(&mut self, data: &[u8]) {
        let keep = TAIL_CHECK_BYTES.min(data.len());
        let drop = (self.tail.len() + keep).saturating_sub(TAIL_CHECK_BYTES);
        self.tail.drain(..drop.min(self.tail.len()));
        self.tail
            .extend_from_slice(&data[data.len().saturating_sub(keep)..]);
    }

    fn check_kind(&self, meta: &Metadata) -> Result<(), WaitError> {
        if meta.is_dir() {
            Err(WaitError::IsDirectory {
                path: display(&self.path),
            })
        } else if !meta.is_file() {
            Err(WaitError::NotRegular {
                path: display(&self.path),
                kind: special_kind(meta.file_type()),
            })
        } else {
            Ok(())
        }
    }

    fn io(&self, op: &'static str, error: io::Error) -> WaitError {
        io_error(op, &self.path, error)
    }
}

/// An I/O error while doing `op` on `path`.
pub fn io_error(op: &'static str, path: &Path, error: io::Error) -> WaitError {
    WaitError::Io {
        op,
        path: display(path),
        error,
    }
}

/// Nothing at the path, or a component on the way is not a directory (yet).
pub fn is_missing(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENOTDIR)
}

/// One `pread`, retried when a signal interrupts it.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, offset) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::wait::WAIT_LINE_CAP_BYTES;
    use std::io::Write;

    fn scan_of(path: &Path, text: &str) -> FileScan {
        FileScan::new(
            path.to_owned(),
            Scanner::new(text.as_bytes(), WAIT_LINE_CAP_BYTES),
        )
    }

    fn append(path: &Path, data: &[u8]) {
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap();
        file.write_all(data).unwrap();
    }

    #[test]
    fn appends_are_scanned_incrementally_and_a_split_match_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut scan = scan_of(&path, "listening on");
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::Missing);
        assert_eq!(scan.describe(), "it does not exist");
        append(&path, b"starting\nlisten");
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::CaughtUp);
        assert_eq!(scan.scanned, 15);
        append(&path, b"ing on :8080\nmore");
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::Found);
        let hit = scan.hit().unwrap();
        assert_eq!(hit.offset, 9);
        assert_eq!(
            hit.line("listening on", WAIT_LINE_CAP_BYTES),
            "listening on :8080"
        );
        assert_eq!(scan.restarts, 0);
    }

    #[test]
    fn a_replaced_truncated_or_rewritten_file_is_scanned_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"old content, no match here\n").unwrap();
        let mut scan = scan_of(&path, "ready");
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::CaughtUp);
        // Truncated: shorter than what was scanned.
        std::fs::write(&path, b"short\n").unwrap();
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::CaughtUp);
        assert_eq!((scan.scanned, scan.restarts), (6, 1));
        // Rewritten in place past the old size: its tail differs.
        std::fs::write(&path, b"longer than before: ready\n").unwrap();
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::Found);
        assert_eq!(scan.hit().unwrap().offset, 20);
        assert_eq!(scan.restarts, 2);
        // Replaced by a rename: another inode.
        let path2 = dir.path().join("g");
        std::fs::write(&path2, b"a\n").unwrap();
        let mut scan = scan_of(&path2, "ready");
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::CaughtUp);
        let new = dir.path().join("g.new");
        std::fs::write(&new, b"ready\n").unwrap();
        std::fs::rename(&new, &path2).unwrap();
        assert_eq!(scan.step(STEP_BYTES).unwrap(), Step::Found);
        assert_eq!(scan.hit().unwrap().offset, 0);
    }

    #[test]
    fn a_big_file_is_read_in_bounded_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let file = File::create(&path).unwrap();
        // Sparse: 20 MiB of zeros cost no disk, then the text.
        file.set_len(20 << 20).unwrap();
        append(&path, b"\nthe end\n");
        let mut scan = scan_of(&path, "the end");
        let mut steps = 0;
        loop {
            steps += 1;
            match scan.step(STEP_BYTES).unwrap() {
                Step::More => assert!(scan.scanned <= steps * STEP_BYTES),
                Step::Found => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(steps, 3);
        assert_eq!(scan.hit().unwrap().offset, (20 << 20) + 1);
        assert!(scan.scanner.hit().is_some());
    }

    #[test]
    fn directories_and_special_files_are_refused_and_a_fifo_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            scan_of(dir.path(), "x").step(STEP_BYTES),
            Err(WaitError::IsDirectory { .. })
        ));
        assert!(matches!(
            scan_of(Path::new("/dev/null"), "x").step(STEP_BYTES),
            Err(WaitError::NotRegular {
                kind: "character device",
                ..
            })
        ));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let error = scan_of(&fifo, "x").step(STEP_BYTES).unwrap_err();
        assert!(matches!(error, WaitError::NotRegular { kind: "FIFO", .. }));
        assert!(error.to_string().contains("is a FIFO"), "{error}");
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_across_small_and_large_reads() {
        let mut scan = scan_of(Path::new("/x"), "x");
        scan.remember_tail(b"abc");
        scan.remember_tail(b"def");
        assert_eq!(scan.tail, b"abcdef");
        let big: Vec<u8> = (0..200u8).collect();
        scan.remember_tail(&big);
        assert_eq!(scan.tail, &big[200 - TAIL_CHECK_BYTES..]);
        scan.remember_tail(b"z");
        assert_eq!(scan.tail.len(), TAIL_CHECK_BYTES);
        assert_eq!(scan.tail.last(), Some(&b'z'));
    }
}
