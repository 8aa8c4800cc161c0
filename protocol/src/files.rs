//! Requests and replies about files. Requests about the whole machine (`info`,
//! `resumed`, `shutdown`) live in [`crate::machine`].
//!
//! Paths are raw bytes (Linux paths need not be UTF-8) and must be absolute. Whole
//! files up to [`crate::limits::READ_FILE_CAP_BYTES`] move in one frame
//! (`write_file`, `read_file`); files of any size stream with `put` and `get`.
//!
//! # Streaming a file
//! - `get`: the agent sends [`crate::Event::Data`] chunks, then
//!   [`crate::Reply::Transferred`] with the total size and the file's mode.
//! - `put`: after the request, the client sends [`crate::ClientMsg::Data`] frames
//!   under the same id and a final [`crate::ClientMsg::DataEnd`]. The agent answers
//!   with [`crate::Event::Acked`] as bytes reach the file; a client keeps at most
//!   [`crate::limits::PUT_WINDOW_BYTES`] unacknowledged, so neither side buffers
//!   without bound and other requests on the connection are never held up. The file
//!   appears atomically (temp file, fsync, rename) only after `DataEnd`.

use serde::{Deserialize, Serialize};

/// Replace a file atomically with `data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileRequest {
    /// Absolute path; its parent directory must exist.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// The whole new content.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Permission bits; `None` keeps the old file's, or 0644 for a new file.
    pub mode: Option<u32>,
}

/// A path, for requests that need nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRequest {
    /// Absolute path.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
}

/// Create a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirRequest {
    /// Absolute path.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// Create missing parents too, and accept an existing directory (`mkdir -p`).
    pub parents: bool,
    /// Permission bits; `None` means 0755.
    pub mode: Option<u32>,
}

/// Remove a file, symlink or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// Absolute path.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// Remove a directory with everything in it.
    pub recursive: bool,
}

/// Rename (move) within the guest; replaces `to` as `rename(2)` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameRequest {
    /// Absolute source path.
    #[serde(with = "serde_bytes")]
    pub from: Vec<u8>,
    /// Absolute destination path.
    #[serde(with = "serde_bytes")]
    pub to: Vec<u8>,
}

/// Stream a file into the guest; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRequest {
    /// Absolute path; its parent directory must exist.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    /// Permission bits; `None` keeps the old file's, or 0644 for a new file.
    pub mode: Option<u32>,
}

/// What a directory entry or path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

impl FileKind {
    /// The lowercase name used in human and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Dir => "dir",
            Self::Symlink => "symlink",
            Self::Other => "other",
        }
    }
}

/// One entry of `list_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The name, as raw bytes (not necessarily UTF-8).
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// What it is (symlinks are not followed).
    pub kind: FileKind,
    /// Size in bytes (of the link itself for symlinks).
    pub size: u64,
}

/// What `stat` reports (symlinks are not followed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (including setuid, setgid, sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub modified_ms: i64,
    /// Where a symlink points.
    #[serde(with = "serde_bytes")]
    pub symlink_target: Option<Vec<u8>>,
}
