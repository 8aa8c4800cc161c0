//! Host file operations beneath an allowed directory: every path is resolved by
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the directory's
//! descriptor, and everything after that works on descriptors. Blocking calls: run
//! them on tokio's blocking pool.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::{HostDirs, HostError, Root};

/// How often a resolution that the kernel asks to retry (`EAGAIN`: a rename
/// elsewhere raced it) is tried before it fails.
const RESOLVE_TRIES: usize = 16;

/// Permission bits a copy to the host keeps: never setuid, setgid or sticky from a
/// sandbox.
const HOST_MODE_BITS: u32 = 0o777;

/// Tells temporary files of concurrent copies apart.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An allowed directory, opened `O_PATH` at start-up.
pub(super) fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.into())
}

/// A regular file on the host, open for reading.
#[derive(Debug)]
pub struct Source {
    /// The file.
    pub file: File,
    /// Its size when it was opened: what a copy sends.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// The path the client named.
    pub path: String,
}

/// A file being written on the host: a temporary file in the destination's
/// directory until [`Destination::commit`] renames it over the final name. Dropped
/// uncommitted, it removes the temporary file.
#[derive(Debug)]
pub struct Destination {
    dir: OwnedFd,
    temp: OsString,
    name: OsString,
    overwrite: bool,
    file: Option<File>,
    /// The final path, for results and messages.
    pub path: String,
}

/// One entry of a host directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// Its name.
    pub name: String,
    /// "file", "dir", "symlink" or "other".
    pub kind: &'static str,
    /// Its size in bytes (of the link itself for a symlink).
    pub size: u64,
}

/// One entry of a tree to copy: a directory or a regular file, by its path
/// relative to the tree's top (`/`-separated, UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Its path below the top.
    pub rel: String,
    /// Whether it is a directory (else a regular file).
    pub dir: bool,
}

/// A host tree: its entries, parents before children, and how many were left out
/// (symbolic links, which a tree copy does not follow, FIFOs, devices, sockets,
/// names that are not UTF-8).
#[derive(Debug, Default)]
pub struct HostTree {
    /// Directories and regular files.
    pub entries: Vec<TreeEntry>,
    /// What was left out.
    pub skipped: u64,
}

impl HostDirs {
    /// The tree under the directory `path`: at most `max` entries. Walked through
    /// descriptors, never following a link (`O_NOFOLLOW` on every directory).
    pub fn walk(&self, path: &str, max: usize) -> Result<HostTree, HostError> {
        let top = self.open_dir(path)?;
        let mut tree = HostTree::default();
        walk_dir(top, "", path, max, &mut tree)?;
        Ok(tree)
    }

    /// The directory `path`, open for listing.
    fn open_dir(&self, path: &str) -> Result<OwnedFd, HostError> {
        let (root, rest) = self.locate(path)?;
        beneath(root, &rest, OFlag::O_RDONLY | OFlag::O_DIRECTORY, path).map_err(
            |error| match error {
                HostError::Io {
                    errno: Errno::ENOTDIR,
                    ..
                } => HostError::NotDirectory(path.to_owned()),
                other => other,
            },
        )
    }

    /// Whether `path` is a directory beneath its allowed one.
    pub fn is_dir(&self, path: &str) -> bool {
        self.locate(path).is_ok_and(|(root, rest)| {
            beneath(root, &rest, OFlag::O_PATH | OFlag::O_DIRECTORY, path).is_ok()
        })
    }

    /// Creates the directory `path` (its parent must exist; it must not).
    pub fn mkdir(&self, path: &str) -> Result<(), HostError> {
        let (root, rest) = self.locate(path)?;
        let Some(Component::Normal(name)) = rest.components().next_back() else {
            return Err(HostError::BadName(path.to_owned()));
        };
        let parent = rest.parent().unwrap_or(Path::new(""));
        let dir = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY, path)?;
        match nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755))
        {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST) => Err(HostError::Exists(path.to_owned())),
            Err(errno) => Err(io("create the directory", path, errno)),
        }
    }

    /// Opens the regular file at `path` for reading.
    pub fn open_source(&self, path: &str) -> Result<Source, HostError> {
        let (root, rest) = self.locate(path)?;
        // O_PATH first: opening a FIFO or a device for reading can block or act;
        // an O_PATH descriptor does neither, and says what the path is.
        let fd = beneath(root, &rest, OFlag::O_PATH, path)?;
        let stat = fstat(fd.as_raw_fd()).map_err(|errno| io("stat", path, errno))?;
        match kind(&stat) {
            SFlag::S_IFREG => {}
            SFlag::S_IFDIR => return Err(HostError::IsDirectory(path.to_owned())),
            other => {
                return Err(HostError::NotRegular {
                    path: path.to_owned(),
                    kind: kind_name(other),
                })
            }
        }
        // Reopened through the descriptor itself, so the file read is the one
        // checked, whatever happens to the path meanwhile.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|error| io("open", path, errno_of(&error)))?;
        Ok(Source {
            file,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            mode: stat.st_mode & HOST_MODE_BITS,
            path: path.to_owned(),
        })
    }

    /// Starts a file at `path`, or named `name` inside `path` when that is an
    /// existing directory. Refuses a destination that exists, unless `overwrite`
    /// and it is a regular file.
    pub fn create_destination(
        &self,
        path: &str,
        name: &str,
        overwrite: bool,
    ) -> Result<Destination, HostError> {
        let (root, rest) = self.locate(path)?;
        let into_dir = match beneath(root, &rest, OFlag::O_PATH | OFlag::O_DIRECTORY, path) {
            Ok(dir) => Some(dir),
            Err(HostError::NotFound(_) | HostError::Io { .. }) if !rest.as_os_str().is_empty() => {
                None
            }
            Err(error) => return Err(error),
        };
        let (dir, name, full) = match into_dir {
            Some(dir) => {
                let name = file_name(name)?;
                let full = Path::new(path).join(&name).display().to_string();
                (dir, name, full)
            }
            None => {
                let name = match rest.components().next_back() {
                    Some(Component::Normal(name)) => name.to_owned(),
                    _ => return Err(HostError::BadName(path.to_owned())),
                };
                let parent = rest.parent().unwrap_or(Path::new(""));
                let dir = beneath(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY, path)?;
                (dir, name, path.to_owned())
            }
        };
        match fstatat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Err(Errno::ENOENT) => {}
            Ok(stat) => match kind(&stat) {
                SFlag::S_IFREG if overwrite => {}
                SFlag::S_IFREG => return Err(HostError::Exists(full)),
                SFlag::S_IFDIR => return Err(HostError::IsDirectory(full)),
                other => {
                    return Err(HostError::NotRegular {
                        path: full,
                        kind: kind_name(other),
                    })
                }
            },
            Err(errno) => return Err(io("stat", &full, errno)),
        }
        let temp = OsString::from(format!(
            ".sandbox-mcp-{}-{}.part",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let raw = openat(
            Some(dir.as_raw_fd()),
            temp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|errno| io("create a file in the directory of", &full, errno))?;
        // SAFETY: `openat` just returned this descriptor, and nothing else owns it.
        let file = unsafe { File::from_raw_fd(raw) };
        Ok(Destination {
            dir,
            temp,
            name,
            overwrite,
            file: Some(file),
            path: full,
        })
    }

    /// One level of the directory at `path`, sorted by name; `max` entries at most
    /// (the second value says whether there were more).
    pub fn list(&self, path: &str, max: usize) -> Result<(Vec<HostEntry>, bool), HostError> {
        let fd = self.open_dir(path)?;
        // `Dir` owns the descriptor from here (and closes it on failure too).
        let dir_fd = fd.into_raw_fd();
        let mut dir = nix::dir::Dir::from_fd(dir_fd).map_err(|errno| io("list", path, errno))?;
        let mut entries = Vec::new();
        let mut more = false;
        for entry in dir.iter() {
            let entry = entry.map_err(|errno| io("list", path, errno))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if entries.len() == max {
                more = true;
                break;
            }
            let stat = fstatat(
                Some(dir_fd),
                entry.file_name(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            let (kind, size) = match stat {
                Ok(stat) => (
                    match kind(&stat) {
                        SFlag::S_IFREG => "file",
                        SFlag::S_IFDIR => "dir",
                        SFlag::S_IFLNK => "symlink",
                        _ => "other",
                    },
                    u64::try_from(stat.st_size).unwrap_or(0),
                ),
                // Removed since it was listed.
                Err(_) => continue,
            };
            entries.push(HostEntry {
                name: String::from_utf8_lossy(name).into_owned(),
                kind,
                size,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((entries, more))
    }
}

impl Destination {
    /// The temporary file to write the data into.
    pub fn take_file(&mut self) -> Option<File> {
        self.file.take()
    }

    /// Gives the file `mode` (less setuid, setgid and sticky) and puts it in place.
    pub fn commit(self, file: File, mode: u32) -> Result<u32, HostError> {
        let mode = mode & HOST_MODE_BITS;
        fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode))
            .map_err(|errno| io("set the mode of", &self.path, errno))?;
        file.sync_all()
            .map_err(|error| io("write", &self.path, errno_of(&error)))?;
        drop(file);
        let flags = if self.overwrite {
            RenameFlags::empty()
        } else {
            RenameFlags::RENAME_NOREPLACE
        };
        let dir = Some(self.dir.as_raw_fd());
        match nix::fcntl::renameat2(
            dir,
            self.temp.as_os_str(),
            dir,
            self.name.as_os_str(),
            flags,
        ) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Err(HostError::Exists(self.path.clone())),
            Err(Errno::EISDIR) => return Err(HostError::IsDirectory(self.path.clone())),
            Err(errno) => return Err(io("rename into", &self.path, errno)),
        }
        // Renamed: nothing is left to remove.
        let mut this = self;
        this.temp.clear();
        Ok(mode)
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        if !self.temp.is_empty() {
            let _ = unlinkat(
                Some(self.dir.as_raw_fd()),
                self.temp.as_os_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// Adds the entries of the directory `fd` (at `prefix` below the top) to `tree`,
/// depth first, parents before children.
fn walk_dir(
    fd: OwnedFd,
    prefix: &str,
    path: &str,
    max: usize,
    tree: &mut HostTree,
) -> Result<(), HostError> {
    // `Dir` owns the descriptor from here.
    let dir_fd = fd.into_raw_fd();
    let mut dir = nix::dir::Dir::from_fd(dir_fd).map_err(|errno| io("list", path, errno))?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|errno| io("list", path, errno))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    names.sort();
    for name in names {
        let Ok(text) = name.to_str() else {
            tree.skipped += 1;
            continue;
        };
        let rel = if prefix.is_empty() {
            text.to_owned()
        } else {
            format!("{prefix}/{text}")
        };
        let Ok(stat) = fstatat(
            Some(dir_fd),
            name.as_c_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            // Removed since it was listed.
            continue;
        };
        let is_dir = match kind(&stat) {
            SFlag::S_IFDIR => true,
            SFlag::S_IFREG => false,
            _ => {
                tree.skipped += 1;
                continue;
            }
        };
        if tree.entries.len() == max {
            return Err(HostError::TooManyEntries {
                path: path.to_owned(),
                max,
            });
        }
        tree.entries.push(TreeEntry {
            rel: rel.clone(),
            dir: is_dir,
        });
        if is_dir {
            let raw = openat(
                Some(dir_fd),
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| io("open", &format!("{path}/{rel}"), errno))?;
            // SAFETY: `openat` just returned this descriptor, and nothing else owns it.
            let child = unsafe { OwnedFd::from_raw_fd(raw) };
            walk_dir(child, &rel, path, max, tree)?;
        }
    }
    Ok(())
}

/// Opens `rest` beneath `root` with `flags`; `path` is the client's, for messages.
fn beneath(root: &Root, rest: &Path, flags: OFlag, path: &str) -> Result<OwnedFd, HostError> {
    let rest: &Path = if rest.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rest
    };
    // openat2 refuses O_PATH with anything but O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW.
    let extra = if flags.contains(OFlag::O_PATH) {
        OFlag::O_CLOEXEC
    } else {
        OFlag::O_CLOEXEC | OFlag::O_NOCTTY
    };
    let how = OpenHow::new()
        .flags(flags | extra)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let mut tries = 0;
    loop {
        match openat2(root.fd.as_raw_fd(), rest, how) {
            // SAFETY: `openat2` just returned this descriptor, and nothing else owns it.
            Ok(raw) => return Ok(unsafe { OwnedFd::from_raw_fd(raw) }),
            Err(Errno::EAGAIN) if tries < RESOLVE_TRIES => tries += 1,
            Err(Errno::EXDEV | Errno::ELOOP) => return Err(HostError::Escapes(path.to_owned())),
            Err(Errno::ENOENT) => return Err(HostError::NotFound(path.to_owned())),
            Err(Errno::ENOSYS) => return Err(HostError::Unsupported),
            Err(errno) => return Err(io("open", path, errno)),
        }
    }
}

/// A plain file name: one component, not `.` or `..`.
fn file_name(name: &str) -> Result<OsString, HostError> {
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(one)), None) if !one.as_bytes().contains(&b'/') => {
            Ok(one.to_owned())
        }
        _ => Err(HostError::BadName(name.to_owned())),
    }
}

/// The last component of a sandbox path, the name a copy gets inside a directory.
pub fn base_name(path: &str) -> Option<&str> {
    path.rsplit('/')
        .find(|part| !part.is_empty() && *part != "." && *part != "..")
}

fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

fn kind_name(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFDIR => "a directory",
        _ => "no regular file",
    }
}

fn io(op: &'static str, path: &str, errno: Errno) -> HostError {
    HostError::Io {
        op,
        path: path.to_owned(),
        errno,
    }
}

fn errno_of(error: &std::io::Error) -> Errno {
    error.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// The path a sandbox file is written to: `path` itself, or `path/NAME` when the
/// sandbox reported `path` to be a directory.
pub fn into_dir(path: &str, name: &str) -> String {
    let mut joined = PathBuf::from(path);
    joined.push(name);
    joined.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fresh allowed directory and a secret beside it, outside.
    struct Setup {
        top: PathBuf,
        allowed: PathBuf,
        dirs: HostDirs,
    }

    impl Setup {
        fn new(tag: &str) -> Self {
            let top = std::env::temp_dir().join(format!("hostfs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&top);
            let allowed = top.join("allowed");
            std::fs::create_dir_all(allowed.join("sub")).unwrap();
            std::fs::write(top.join("secret"), b"secret").unwrap();
            std::fs::write(allowed.join("sub/ok.txt"), b"ok").unwrap();
            let dirs = HostDirs::open(std::slice::from_ref(&allowed), 1 << 20).unwrap();
            Self { top, allowed, dirs }
        }

        fn path(&self, rest: &str) -> String {
            format!("{}/{rest}", self.allowed.display())
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.top);
        }
    }

    #[test]
    fn links_and_dotdot_out_of_the_allowed_directory_are_refused() {
        let s = Setup::new("escape");
        symlink(s.top.join("secret"), s.allowed.join("abs")).unwrap();
        symlink("../secret", s.allowed.join("rel")).unwrap();
        symlink("/", s.allowed.join("root")).unwrap();
        for name in [
            "abs",
            "rel",
            "root/etc/passwd",
            "../secret",
            "sub/../../secret",
        ] {
            let error = s.dirs.open_source(&s.path(name)).unwrap_err();
            assert!(matches!(error, HostError::Escapes(_)), "{name}: {error}");
        }
        // A link that stays inside is followed.
        symlink("sub/ok.txt", s.allowed.join("inside")).unwrap();
        let source = s.dirs.open_source(&s.path("inside")).unwrap();
        assert_eq!(source.size, 2);
        // Writing through a link dir out of it is refused too.
        let error = s
            .dirs
            .create_destination(&s.path("root/tmp/x"), "x", false)
            .unwrap_err();
        assert!(matches!(error, HostError::Escapes(_)), "{error}");
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let s = Setup::new("fifo");
        nix::unistd::mkfifo(&s.allowed.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        // A FIFO nobody writes to: a blocking open would hang here.
        let error = s.dirs.open_source(&s.path("fifo")).unwrap_err();
        assert!(
            matches!(error, HostError::NotRegular { kind: "a FIFO", .. }),
            "{error}"
        );
        // A destination that is a FIFO is not written through, even with overwrite.
        let error = s
            .dirs
            .create_destination(&s.path("fifo"), "x", true)
            .unwrap_err();
        assert!(matches!(error, HostError::NotRegular { .. }), "{error}");
        assert!(matches!(
            s.dirs.open_source(&s.path("sub")).unwrap_err(),
            HostError::IsDirectory(_)
        ));
    }

    #[test]
    fn a_destination_appears_whole_at_commit_and_never_replaces_by_default() {
        let s = Setup::new("dest");
        let mut dest = s
            .dirs
            .create_destination(&s.path("sub"), "new.bin", false)
            .unwrap();
        assert_eq!(dest.path, s.path("sub/new.bin"));
        let mut file = dest.take_file().unwrap();
        std::io::Write::write_all(&mut file, b"data").unwrap();
        assert!(!s.allowed.join("sub/new.bin").exists());
        assert_eq!(dest.commit(file, 0o4755).unwrap(), 0o755);
        assert_eq!(
            std::fs::read(s.allowed.join("sub/new.bin")).unwrap(),
            b"data"
        );
        let error = s
            .dirs
            .create_destination(&s.path("sub/new.bin"), "x", false)
            .unwrap_err();
        assert!(matches!(error, HostError::Exists(_)), "{error}");
        // Dropped uncommitted: no temporary file is left.
        let dest = s
            .dirs
            .create_destination(&s.path("sub/new.bin"), "x", true)
            .unwrap();
        drop(dest);
        let (entries, more) = s.dirs.list(&s.path("sub"), 100).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!((names, more), (vec!["new.bin", "ok.txt"], false));
        let error = s
            .dirs
            .create_destination(&s.path("missing/x"), "x", false)
            .unwrap_err();
        assert!(matches!(error, HostError::NotFound(_)), "{error}");
    }

    #[test]
    fn names_inside_a_directory_must_be_plain() {
        assert!(file_name("ok.txt").is_ok());
        for bad in ["", ".", "..", "a/b", "/abs"] {
            assert!(file_name(bad).is_err(), "{bad}");
        }
        assert_eq!(base_name("/root/out/report.csv"), Some("report.csv"));
        assert_eq!(base_name("/root/dir/"), Some("dir"));
        assert_eq!(base_name("/"), None);
    }
}
