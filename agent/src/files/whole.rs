//! Whole files in one frame: `write_file` and `read_file`.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use sandbox_protocol::limits::READ_FILE_CAP_BYTES;
use sandbox_protocol::WriteFileRequest;

use super::atomic::AtomicFile;
use super::{absolute_path, display, FileError};

/// Replaces the file atomically with the request's data.
pub fn write_file(request: &WriteFileRequest) -> Result<(), FileError> {
    let path = absolute_path(&request.path)?;
    let mut file = AtomicFile::create(&path, request.mode)?;
    file.write(&request.data)?;
    file.commit().map(drop)
}

/// The bytes [`read_file`] of `path` will hold, at most the cap (0 when the path
/// cannot be read: the read reports why), so they can be charged before it runs.
pub fn bytes_to_read(path: &[u8]) -> usize {
    let Ok(path) = absolute_path(path) else {
        return 0;
    };
    std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map_or(0, |meta| {
            usize::try_from(meta.len().min(READ_FILE_CAP_BYTES + 1)).unwrap_or(0)
        })
}

/// Reads a regular file of at most [`READ_FILE_CAP_BYTES`].
pub fn read_file(path: &[u8]) -> Result<Vec<u8>, FileError> {
    let path = absolute_path(path)?;
    // Check the kind before opening: opening a FIFO would block.
    let meta = std::fs::metadata(&path).map_err(|error| FileError::io("read", &path, error))?;
    check_readable(&path, &meta)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(&path)
        .map_err(|error| FileError::io("open", &path, error))?;
    // The path may have been swapped between the two calls; trust what was opened.
    let meta = file
        .metadata()
        .map_err(|error| FileError::io("stat", &path, error))?;
    check_readable(&path, &meta)?;
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // Read one byte past the cap to notice a file that grew meanwhile.
    (&file)
        .take(READ_FILE_CAP_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|error| FileError::io("read", &path, error))?;
    if data.len() as u64 > READ_FILE_CAP_BYTES {
        return Err(too_large(&path, data.len() as u64));
    }
    let after = file
        .metadata()
        .map_err(|error| FileError::io("stat", &path, error))?;
    super::check_unchanged(&path, &meta, &after, data.len() as u64)?;
    Ok(data)
}

fn check_readable(path: &Path, meta: &std::fs::Metadata) -> Result<(), FileError> {
    if meta.is_dir() {
        Err(FileError::IsDirectory {
            path: display(path),
        })
    } else if !meta.is_file() {
        Err(FileError::NotRegular {
            path: display(path),
        })
    } else if meta.len() > READ_FILE_CAP_BYTES {
        Err(too_large(path, meta.len()))
    } else {
        Ok(())
    }
}

fn too_large(path: &Path, size: u64) -> FileError {
    FileError::TooLarge {
        path: display(path),
        size,
        limit: READ_FILE_CAP_BYTES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    fn bytes(path: &Path) -> Vec<u8> {
        path.as_os_str().as_bytes().to_vec()
    }

    fn write(path: &Path, data: &[u8], mode: Option<u32>) -> Result<(), FileError> {
        write_file(&WriteFileRequest {
            path: bytes(path),
            data: data.to_vec(),
            mode,
        })
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn write_then_read_round_trips_and_keeps_the_old_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write(&path, b"one", Some(0o600)).unwrap();
        write(&path, b"two", None).unwrap();
        assert_eq!(read_file(&bytes(&path)).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn failed_writes_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert!(matches!(
            write(&dir.path().join("d"), b"x", None),
            Err(FileError::IsDirectory { .. })
        ));
        assert!(matches!(
            write(&dir.path().join("no/f"), b"x", None),
            Err(FileError::NoParent { .. })
        ));
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn read_file_names_every_reason_it_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(
            &big,
            vec![0u8; usize::try_from(READ_FILE_CAP_BYTES + 1).unwrap()],
        )
        .unwrap();
        let exact = dir.path().join("exact");
        std::fs::write(
            &exact,
            vec![1u8; usize::try_from(READ_FILE_CAP_BYTES).unwrap()],
        )
        .unwrap();
        assert_eq!(
            read_file(&bytes(&exact)).unwrap().len() as u64,
            READ_FILE_CAP_BYTES
        );
        let err = read_file(&bytes(&big)).unwrap_err();
        assert!(matches!(err, FileError::TooLarge { .. }));
        assert!(err.to_string().contains("1048576"), "{err}");
        assert!(matches!(
            read_file(&bytes(dir.path())),
            Err(FileError::IsDirectory { .. })
        ));
        assert!(matches!(
            read_file(b"/dev/null"),
            Err(FileError::NotRegular { .. })
        ));
        let missing = read_file(&bytes(&dir.path().join("missing"))).unwrap_err();
        assert_eq!(
            missing.to_wire().kind,
            sandbox_protocol::ErrorKind::NotFound
        );
        assert!(matches!(
            read_file(b"relative"),
            Err(FileError::NotAbsolute { .. })
        ));
    }

    #[test]
    fn read_file_does_not_block_on_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            read_file(&bytes(&fifo)),
            Err(FileError::NotRegular { .. })
        ));
    }
}
