//! File operations: whole-file read and atomic write, directories, and streamed
//! transfer of files of any size.
//!
//! # Layout
//! - [`whole`]: `write_file` (temp file, fsync, rename, fsync the directory) and
//!   `read_file` (regular files up to 1 MiB, with a typed error for everything else).
//! - [`tree`]: `list_dir`, `stat`, `mkdir`, `remove`, `rename`.
//! - [`stream`]: `put` and `get`, chunked, with the put window (see
//!   [`sandbox_protocol::files`]).
//! - [`atomic`]: the temp-file-then-rename writer both `write_file` and `put` use.
//!
//! All of it is blocking file I/O: the dispatcher runs it on tokio's blocking pool.
//! Paths arrive as raw bytes and must be absolute.

pub mod atomic;
pub mod stream;
pub mod tree;
pub mod whole;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sandbox_protocol::{ErrorKind, WireError};

/// Why a file request failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Paths must be absolute, so their meaning never depends on the agent's cwd.
    #[error("Path {path} is not absolute")]
    NotAbsolute {
        /// The path as given.
        path: String,
    },
    /// `read_file` refuses files over its cap.
    #[error(
        "{path} is {size} bytes, over the read_file limit of {limit} bytes; use get to stream it"
    )]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// A file operation met a directory.
    #[error("{path} is a directory")]
    IsDirectory {
        /// The path.
        path: String,
    },
    /// A file operation met a device, FIFO or socket.
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The path.
        path: String,
    },
    /// An atomic write would replace a device, FIFO or socket with a regular file
    /// (every program using it would then write into a file instead).
    #[error(
        "{path} is a {kind}; an atomic write only replaces regular files (write into it with exec, e.g. `cat > {path}`)"
    )]
    NotReplaceable {
        /// The path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// The file changed while it was being read, so what was sent may be torn.
    #[error("{path} changed while it was read ({what}); read it again")]
    Changed {
        /// The path.
        path: String,
        /// What changed.
        what: String,
    },
    /// A directory holds more names than one reply can carry.
    #[error(
        "{path} holds more entries than one listing can carry (over {entries} read); list it with exec, e.g. `ls -f`"
    )]
    ListingTooLarge {
        /// The directory.
        path: String,
        /// Entries read before giving up.
        entries: usize,
    },
    /// A directory operation met something else.
    #[error("{path} is not a directory")]
    NotDirectory {
        /// The path.
        path: String,
    },
    /// A write needs its parent directory to exist.
    #[error("The parent directory of {path} does not exist")]
    NoParent {
        /// The path.
        path: String,
    },
    /// Removing `/` is never what anyone wants.
    #[error("Refusing to remove /")]
    RemoveRoot,
    /// The client sent more unacknowledged `put` data than the window allows.
    #[error("The put sent more than {window} bytes beyond the last acknowledgement")]
    WindowExceeded {
        /// The window.
        window: u64,
    },
    /// The client ended the put without `DataEnd` (cancel or disconnect).
    #[error("The put of {path} ended before DataEnd; nothing was written")]
    Incomplete {
        /// The path.
        path: String,
    },
    /// A system call failed.
    #[error("Cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
}

impl FileError {
    /// An I/O error while doing `op` on `path`.
    pub fn io(op: &'static str, path: &Path, error: io::Error) -> Self {
        Self::Io {
            op,
            path: display(path),
            error,
        }
    }

    /// The error as the client sees it.
    pub fn to_wire(&self) -> WireError {
        let kind = match self {
            Self::NotAbsolute { .. } | Self::RemoveRoot | Self::WindowExceeded { .. } => {
                ErrorKind::BadRequest
            }
            Self::TooLarge { .. } | Self::ListingTooLarge { .. } => ErrorKind::TooLarge,
            Self::IsDirectory { .. }
            | Self::NotRegular { .. }
            | Self::NotReplaceable { .. }
            | Self::NotDirectory { .. } => ErrorKind::WrongType,
            Self::Changed { .. } => ErrorKind::Conflict,
            Self::NoParent { .. } => ErrorKind::NotFound,
            Self::Incomplete { .. } => ErrorKind::Cancelled,
            Self::Io { error, .. } => WireError::from_io("", error).kind,
        };
        match self {
            Self::Io { error, .. } => WireError {
                kind,
                message: format!("{self}: {error}"),
                errno: error.raw_os_error(),
            },
            _ => WireError::new(kind, self.to_string()),
        }
    }
}

/// The path in `bytes`, which must be absolute.
pub fn absolute_path(bytes: &[u8]) -> Result<PathBuf, FileError> {
    let path = Path::new(OsStr::from_bytes(bytes));
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Err(FileError::NotAbsolute {
            path: display(path),
        })
    }
}

/// What a file that is not a regular file or a directory is, for messages.
pub fn special_kind(file_type: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// A file read to its end must still have the size and modification time it had
/// when opened, and the bytes sent must add up to that size: otherwise it was
/// rewritten or truncated meanwhile and the copy may be torn.
pub(crate) fn check_unchanged(
    path: &std::path::Path,
    before: &std::fs::Metadata,
    after: &std::fs::Metadata,
    sent: u64,
) -> Result<(), FileError> {
    use std::os::unix::fs::MetadataExt;
    let what = if after.len() != before.len() {
        format!(
            "its size went from {} to {} bytes",
            before.len(),
            after.len()
        )
    } else if (after.mtime(), after.mtime_nsec()) != (before.mtime(), before.mtime_nsec()) {
        String::from("it was modified")
    } else if sent < before.len() && !is_pseudo_file(before) {
        // A file cut short and regrown within one mtime tick; pseudo-files in /proc
        // and /sys announce sizes (0, 4096) that have nothing to do with their content.
        format!("{sent} bytes were read of {}", before.len())
    } else {
        return Ok(());
    };
    Err(FileError::Changed {
        path: display(path),
        what,
    })
}

/// True for files of the kernel's pseudo-filesystems (procfs, sysfs), whose
/// announced sizes do not describe their content. They live on devices with major
/// number 0 (anonymous), as every virtual filesystem does; so do tmpfs files, whose
/// sizes are real, which is why only a short read is checked this way.
fn is_pseudo_file(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    libc::major(meta.dev()) == 0 && meta.blocks() == 0
}

/// A path for messages (lossy for non-UTF-8 names).
pub fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_refused() {
        assert!(absolute_path(b"/etc/hostname").is_ok());
        assert!(matches!(
            absolute_path(b"etc/hostname"),
            Err(FileError::NotAbsolute { .. })
        ));
        assert!(matches!(
            absolute_path(b""),
            Err(FileError::NotAbsolute { .. })
        ));
    }

    #[test]
    fn a_file_that_changed_while_read_is_caught_and_pseudo_files_pass() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let before = std::fs::metadata(&path).unwrap();
        check_unchanged(&path, &before, &before, 10).unwrap();
        // Read short of the announced size.
        assert!(matches!(
            check_unchanged(&path, &before, &before, 4),
            Err(FileError::Changed { .. })
        ));
        // Grown meanwhile.
        std::fs::write(&path, b"0123456789abc").unwrap();
        let after = std::fs::metadata(&path).unwrap();
        let error = check_unchanged(&path, &before, &after, 10).unwrap_err();
        assert!(error.to_string().contains("from 10 to 13"), "{error}");
        assert_eq!(error.to_wire().kind, sandbox_protocol::ErrorKind::Conflict);
        // /proc files say 0 bytes and /sys files 4096, whatever their content.
        for pseudo in [
            "/proc/self/status",
            "/sys/kernel/mm/transparent_hugepage/enabled",
        ] {
            let pseudo = std::path::Path::new(pseudo);
            if let Ok(meta) = std::fs::metadata(pseudo) {
                check_unchanged(pseudo, &meta, &meta, 20).unwrap();
            }
        }
    }
}
