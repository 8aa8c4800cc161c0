//! Replacing a file atomically: write a temp file in the same directory, fsync it,
//! give it its mode, rename it over the target, fsync the directory. A reader sees
//! the old file or the new one, never a torn one; on any error (or if the writer is
//! dropped unfinished) the temp file is removed. Only regular files are replaced: a
//! device, FIFO or socket at the target is refused, since renaming a file over it
//! would destroy it (whoever writes to `/dev/null` would then fill a file).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{display, FileError};

/// Mode of a new file when the request names none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// An unfinished atomic replacement of `target`.
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    file: Option<File>,
    mode: u32,
    owner: Option<(u32, u32)>,
    written: u64,
}

impl AtomicFile {
    /// Starts replacing `target`; `mode` `None` keeps the old file's mode and owner.
    pub fn create(target: &Path, mode: Option<u32>) -> Result<Self, FileError> {
        let parent = target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("/"));
        let name = target.file_name().ok_or_else(|| FileError::IsDirectory {
            path: display(target),
        })?;
        match std::fs::metadata(parent) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(FileError::NotDirectory {
                    path: display(parent),
                })
            }
            Err(_) => {
                return Err(FileError::NoParent {
                    path: display(target),
                })
            }
        }
        let old = std::fs::metadata(target).ok();
        match &old {
            Some(meta) if meta.is_dir() => {
                return Err(FileError::IsDirectory {
                    path: display(target),
                })
            }
            // Renaming over a device, FIFO or socket would destroy it: refuse.
            Some(meta) if !meta.is_file() => {
                return Err(FileError::NotReplaceable {
                    path: display(target),
                    kind: super::special_kind(meta.file_type()),
                })
            }
            _ => {}
        }
        let mode = mode
            .or_else(|| old.as_ref().map(|m| m.permissions().mode() & 0o7777))
            .unwrap_or(DEFAULT_FILE_MODE);
        let owner = old.as_ref().map(|m| (m.uid(), m.gid()));

        let suffix = crate::sys::random_hex(6);
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{suffix}.tmp"));
        let temp = parent.join(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&temp)
            .map_err(|error| FileError::io("create a temp file for", target, error))?;
        Ok(Self {
            target: target.to_path_buf(),
            temp,
            file: Some(file),
            mode,
            owner,
            written: 0,
        })
    }

    /// Appends `data`.
    pub fn write(&mut self, data: &[u8]) -> Result<(), FileError> {
        let file = self.file.as_mut().ok_or_else(|| {
            FileError::io("write", &self.target, std::io::ErrorKind::BrokenPipe.into())
        })?;
        file.write_all(data)
            .map_err(|error| FileError::io("write", &self.target, error))?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Makes the new content durable and visible under the target name.
    pub fn commit(mut self) -> Result<(u64, u32), FileError> {
        let target = self.target.clone();
        let file = self.file.take().ok_or_else(|| {
            FileError::io("write", &target, std::io::ErrorKind::BrokenPipe.into())
        })?;
        if let Some((uid, gid)) = self.owner {
            // Best effort: only root may give a file away, and keeping it is fine too.
            let _ = std::os::unix::fs::fchown(&file, Some(uid), Some(gid));
        }
        file.set_permissions(std::fs::Permissions::from_mode(self.mode))
            .map_err(|error| FileError::io("set the mode of", &target, error))?;
        file.sync_all()
            .map_err(|error| FileError::io("fsync", &target, error))?;
        drop(file);
        std::fs::rename(&self.temp, &target)
            .map_err(|error| FileError::io("rename into place", &target, error))?;
        // The rename is durable once the directory is.
        if let Some(parent) = target.parent() {
            if let Ok(dir) = File::open(parent) {
                let _ = dir.sync_all();
            }
        }
        self.temp = PathBuf::new();
        Ok((self.written, self.mode))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_device_at_the_target_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for target in [fifo.as_path(), Path::new("/dev/null")] {
            let error = AtomicFile::create(target, None).unwrap_err();
            assert!(
                matches!(error, FileError::NotReplaceable { .. }),
                "{target:?}: {error}"
            );
        }
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        // Nothing was left beside them.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_regular_file_is_replaced_keeping_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        std::fs::write(&target, b"old").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        let mut file = AtomicFile::create(&target, None).unwrap();
        file.write(b"new").unwrap();
        assert_eq!(file.commit().unwrap(), (3, 0o640));
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }
}
