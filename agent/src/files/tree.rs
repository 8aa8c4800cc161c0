//! Directories and metadata: `list_dir`, `stat`, `mkdir`, `remove`, `rename`.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use sandbox_protocol::limits::MAX_FRAME_BYTES;
use sandbox_protocol::{DirEntry, FileKind, FileStat, MkdirRequest, RemoveRequest, RenameRequest};

use super::{absolute_path, display, FileError};

/// Mode of a new directory when the request names none.
pub const DEFAULT_DIR_MODE: u32 = 0o755;

fn kind_of(file_type: std::fs::FileType) -> FileKind {
    if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Wire bytes of one listed entry besides its name (kind, size, length prefixes).
const LIST_ENTRY_OVERHEAD_BYTES: usize = 16;

/// One level of a directory, sorted by name; names keep their raw bytes.
pub fn list_dir(path: &[u8]) -> Result<Vec<DirEntry>, FileError> {
    let path = absolute_path(path)?;
    let meta = std::fs::metadata(&path).map_err(|error| FileError::io("list", &path, error))?;
    if !meta.is_dir() {
        return Err(FileError::NotDirectory {
            path: display(&path),
        });
    }
    let entries = std::fs::read_dir(&path).map_err(|error| FileError::io("list", &path, error))?;
    let mut out = Vec::new();
    // What the reply will take on the wire, roughly: a listing that cannot fit one
    // frame is refused as soon as that is clear, not after building all of it (a
    // directory of millions of names must not cost the agent their whole list).
    let mut reply_bytes = 0usize;
    for entry in entries {
        let entry = entry.map_err(|error| FileError::io("list", &path, error))?;
        // An entry removed while listing is simply skipped.
        let Ok(meta) = entry.metadata() else { continue };
        reply_bytes += entry.file_name().len() + LIST_ENTRY_OVERHEAD_BYTES;
        if reply_bytes > MAX_FRAME_BYTES {
            return Err(FileError::ListingTooLarge {
                path: display(&path),
                entries: out.len(),
            });
        }
        out.push(DirEntry {
            name: entry.file_name().as_bytes().to_vec(),
            kind: kind_of(meta.file_type()),
            size: meta.len(),
        });
    }
    // Names in one directory are unique: an unstable sort, smaller code.
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Metadata of a path, not following a final symlink.
pub fn stat(path: &[u8]) -> Result<FileStat, FileError> {
    let path = absolute_path(path)?;
    let meta =
        std::fs::symlink_metadata(&path).map_err(|error| FileError::io("stat", &path, error))?;
    let kind = kind_of(meta.file_type());
    let symlink_target = match kind {
        FileKind::Symlink => std::fs::read_link(&path)
            .ok()
            .map(|t| t.as_os_str().as_bytes().to_vec()),
        _ => None,
    };
    Ok(FileStat {
        kind,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        modified_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
        symlink_target,
    })
}

/// Creates a directory (with `parents`, also its parents, and an existing one is fine).
pub fn mkdir(request: &MkdirRequest) -> Result<(), FileError> {
    let path = absolute_path(&request.path)?;
    let result = std::fs::DirBuilder::new()
        .recursive(request.parents)
        .mode(request.mode.unwrap_or(DEFAULT_DIR_MODE))
        .create(&path);
    match result {
        Ok(()) => Ok(()),
        Err(error) if request.parents && error.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(FileError::NotDirectory {
                path: display(&path),
            })
        }
        Err(error) => Err(FileError::io("create directory", &path, error)),
    }
}

/// Removes a file, symlink or empty directory; with `recursive`, any directory.
pub fn remove(request: &RemoveRequest) -> Result<(), FileError> {
    let path = absolute_path(&request.path)?;
    if path.parent().is_none() {
        return Err(FileError::RemoveRoot);
    }
    let meta =
        std::fs::symlink_metadata(&path).map_err(|error| FileError::io("remove", &path, error))?;
    let result = match (meta.is_dir(), request.recursive) {
        (true, true) => std::fs::remove_dir_all(&path),
        (true, false) => std::fs::remove_dir(&path),
        (false, _) => std::fs::remove_file(&path),
    };
    result.map_err(|error| FileError::io("remove", &path, error))
}

/// Renames `from` to `to`, replacing `to` as `rename(2)` does.
pub fn rename(request: &RenameRequest) -> Result<(), FileError> {
    let from = absolute_path(&request.from)?;
    let to = absolute_path(&request.to)?;
    std::fs::rename(&from, &to).map_err(|error| FileError::io("rename", Path::new(&from), error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn bytes(path: &Path) -> Vec<u8> {
        path.as_os_str().as_bytes().to_vec()
    }

    #[test]
    fn non_utf8_names_survive_listing() {
        let dir = tempfile::tempdir().unwrap();
        let name = OsStr::from_bytes(b"caf\xe9");
        std::fs::write(dir.path().join(name), b"abc").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("link")).unwrap();
        let entries = list_dir(&bytes(dir.path())).unwrap();
        let summary: Vec<_> = entries
            .iter()
            .map(|e| (e.name.clone(), e.kind, e.size))
            .collect();
        assert_eq!(summary[0], (b"caf\xe9".to_vec(), FileKind::File, 3));
        assert_eq!(summary[1].0, b"link");
        assert_eq!(summary[1].1, FileKind::Symlink);
        assert_eq!(summary[2].1, FileKind::Dir);
    }

    #[test]
    fn mkdir_remove_rename_and_stat() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        mkdir(&MkdirRequest {
            path: bytes(&deep),
            parents: true,
            mode: Some(0o700),
        })
        .unwrap();
        mkdir(&MkdirRequest {
            path: bytes(&deep),
            parents: true,
            mode: None,
        })
        .unwrap();
        let again = mkdir(&MkdirRequest {
            path: bytes(&deep),
            parents: false,
            mode: None,
        })
        .unwrap_err();
        assert_eq!(
            again.to_wire().kind,
            sandbox_protocol::ErrorKind::AlreadyExists
        );
        let st = stat(&bytes(&deep)).unwrap();
        assert_eq!((st.kind, st.mode), (FileKind::Dir, 0o700));

        let top = dir.path().join("a");
        let not_empty = remove(&RemoveRequest {
            path: bytes(&top),
            recursive: false,
        })
        .unwrap_err();
        assert!(matches!(not_empty, FileError::Io { .. }));
        rename(&RenameRequest {
            from: bytes(&top),
            to: bytes(&dir.path().join("z")),
        })
        .unwrap();
        remove(&RemoveRequest {
            path: bytes(&dir.path().join("z")),
            recursive: true,
        })
        .unwrap();
        assert!(list_dir(&bytes(dir.path())).unwrap().is_empty());
        assert!(matches!(
            remove(&RemoveRequest {
                path: b"/".to_vec(),
                recursive: true
            }),
            Err(FileError::RemoveRoot)
        ));
        let missing = stat(&bytes(&dir.path().join("nope"))).unwrap_err();
        assert_eq!(
            missing.to_wire().kind,
            sandbox_protocol::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_directory_too_big_for_one_reply_is_refused_early() {
        let dir = tempfile::tempdir().unwrap();
        // Long names, so a few thousand entries pass the frame limit.
        let name_len = 250;
        let count = MAX_FRAME_BYTES / (name_len + LIST_ENTRY_OVERHEAD_BYTES) + 10;
        for n in 0..count {
            let name = format!("{n:0>width$}", width = name_len);
            std::fs::File::create(dir.path().join(name)).unwrap();
        }
        let error = list_dir(dir.path().as_os_str().as_bytes()).unwrap_err();
        assert!(
            matches!(error, FileError::ListingTooLarge { .. }),
            "{error}"
        );
        assert_eq!(error.to_wire().kind, sandbox_protocol::ErrorKind::TooLarge);
    }
}
