//! The agent's own passwd entry, read again only when `/etc/passwd` changes.
//!
//! Every exec or spawn without a user needs the agent's own entry (its home, name
//! and shell for the child's environment). Reading it through musl's
//! `getpwuid_r` (open, read, parse, close, and a 16 KiB buffer) took 0.5-0.65 ms
//! of a 7.7 ms exec of `true` in a TCG guest, measured with timestamps in the
//! agent; one `stat` of the file tells whether the entry read before still stands.
//! The workload is root and may edit the file or replace it: any change of its
//! inode, size, modification or status-change time reads it again. File times
//! move in clock ticks, so two edits in one tick look the same: a file changed
//! within [`SETTLE`] is read every time, as git treats a "racily clean" file.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use nix::unistd::{Uid, User as PasswdUser};

/// Where the entry comes from.
const PASSWD_PATH: &str = "/etc/passwd";

/// A file changed this recently may change again within the same time stamp.
const SETTLE: Duration = Duration::from_secs(1);

static OWN_ENTRY: FileKeyed<Option<PasswdUser>> = FileKeyed::new();

/// The passwd entry of the user the agent runs as, `None` when it has none.
pub fn own_entry() -> Option<PasswdUser> {
    OWN_ENTRY.get(Path::new(PASSWD_PATH), || {
        PasswdUser::from_uid(Uid::current()).ok().flatten()
    })
}

/// What identifies one version of a file: a write changes the times, a
/// replacement the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Version {
    /// The file's version now; `None` when it is missing or changed too recently
    /// to tell its versions apart.
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        let settled = |time: std::io::Result<SystemTime>| {
            time.ok()
                .and_then(|time| time.elapsed().ok())
                .is_some_and(|age| age >= SETTLE)
        };
        if !settled(meta.modified()) {
            return None;
        }
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// A value derived from a file, kept while the file is the same version.
#[derive(Debug)]
struct FileKeyed<T>(Mutex<Option<(Version, T)>>);

impl<T: Clone> FileKeyed<T> {
    const fn new() -> Self {
        Self(Mutex::new(None))
    }

    /// The value `read` gave for this version of `path`, else `read`'s answer now
    /// (kept for the next call when the file exists and has settled).
    fn get(&self, path: &Path, read: impl FnOnce() -> T) -> T {
        let version = Version::of(path);
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let (Some(version), Some((was, value))) = (version, kept.as_ref()) {
            if *was == version {
                return value.clone();
            }
        }
        let value = read();
        *kept = version.map(|version| (version, value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn the_value_is_read_again_only_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        let write = |path: &Path, text: &str, age_secs: u64| {
            std::fs::write(path, text).unwrap();
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(SystemTime::now() - Duration::from_secs(age_secs))
                .unwrap();
        };
        write(&path, "root:x:0:0:root:/root:/bin/sh\n", 60);
        let cache = FileKeyed::new();
        let reads = Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            reads.get()
        };
        assert_eq!(cache.get(&path, read), 1);
        assert_eq!(cache.get(&path, read), 1, "unchanged: kept");

        // An edit in place (same size, so only the times tell).
        write(&path, "root:x:0:0:root:/home:/bin/sh\n", 30);
        assert_eq!(cache.get(&path, read), 2);
        assert_eq!(cache.get(&path, read), 2);
        // A replacement by rename.
        let other = dir.path().join("passwd.new");
        write(&other, "root:x:0:0:root:/root:/bin/sh\n", 30);
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(cache.get(&path, read), 3);
        assert_eq!(cache.get(&path, read), 3);

        // Changed just now: a second edit could keep the same times, so it is read
        // every time until it settles.
        write(&path, "root:x:0:0:root:/tmp:/bin/sh\n", 0);
        assert_eq!(cache.get(&path, read), 4);
        assert_eq!(cache.get(&path, read), 5);

        // No file: read every time, nothing kept.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(cache.get(&path, read), 6);
        assert_eq!(cache.get(&path, read), 7);
    }

    #[test]
    fn the_own_entry_matches_a_fresh_lookup() {
        let fresh = PasswdUser::from_uid(Uid::current()).ok().flatten();
        assert_eq!(own_entry(), fresh);
        assert_eq!(own_entry(), fresh);
    }
}
