//! Host files: copying between the host and a sandbox, only under the directories
//! the operator allows with `--host-dir` (none by default, and then the tools are
//! not offered at all).
//!
//! The client names host paths; the sandbox and the model behind the client are
//! untrusted, so every host path is resolved by the kernel beneath one allowed
//! directory: `openat2` with `RESOLVE_BENEATH` from a descriptor of that directory,
//! opened once at start-up. A `..` or a symbolic link (absolute, or relative) that
//! would leave it fails the resolution (`EXDEV`) instead of being followed, and a
//! swap of a link or directory during the copy cannot redirect it: each copy works
//! on descriptors, never on a path looked up twice.
//!
//! - A source is opened as `O_PATH` (which has no side effects, even on a device),
//!   checked to be a regular file, then reopened for reading through that very
//!   descriptor, and sent through the agent client's streamed `put` (bounded
//!   windows, never whole in memory) up to the size it had when opened.
//! - A destination is a new temporary file in the destination's directory (opened
//!   beneath the allowed one), filled by the client's streamed `get` under a size
//!   cap (`--host-max-bytes`: a sandbox can make a file grow, or look huge), given
//!   the guest file's permission bits without setuid/setgid/sticky, and renamed over
//!   the final name at the end (`RENAME_NOREPLACE` unless `overwrite`). A rename
//!   replaces a name, never writes through a link, FIFO or device found there; only
//!   an existing regular file is replaced. A failed copy removes its temporary file.
//!
//! # Layout
//! - this file: [`HostDirs`] (the allowed directories) and [`HostError`].
//! - [`fs`]: the resolution beneath a directory, sources, destinations and listing.
//! - [`tools`]: the `copy_from_host`, `copy_to_host` and `list_host_dir` tools.
//! - [`tree`]: their `recursive: true`, for directory trees.

pub mod fs;
pub mod tools;
pub mod tree;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

/// Default of `--host-max-bytes`: the most one copy from a sandbox writes on the
/// host (4 GiB).
pub const DEFAULT_HOST_MAX_BYTES: u64 = 4 << 30;

/// The directories the operator allows host copies under, each opened once.
#[derive(Debug, Default)]
pub struct HostDirs {
    roots: Vec<Root>,
    max_bytes: u64,
}

/// One allowed directory.
#[derive(Debug)]
struct Root {
    /// As the operator wrote it (absolute).
    given: PathBuf,
    /// With its symbolic links resolved, at start-up.
    canonical: PathBuf,
    /// The directory (`O_PATH`): every path under it is resolved from here.
    fd: OwnedFd,
}

/// A host path that cannot be used, or a host file operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A `--host-dir` that is no usable directory.
    #[error("--host-dir {path:?} cannot be used")]
    Dir {
        /// The flag's value.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A relative host path.
    #[error("host_path {0:?} is relative")]
    Relative(String),
    /// A path under none of the allowed directories.
    #[error("host_path {0:?} is not under an allowed host directory")]
    Outside(String),
    /// The resolution would leave the allowed directory.
    #[error(
        "host_path {0:?} leads outside its allowed directory (through '..' or a symbolic link)"
    )]
    Escapes(String),
    /// Nothing at the path (or a parent is missing or no directory).
    #[error("no such file or directory on the host: {0:?}")]
    NotFound(String),
    /// A directory where a file was expected.
    #[error("{0:?} is a directory on the host")]
    IsDirectory(String),
    /// No regular file (a FIFO, device, socket or symbolic link).
    #[error("{path:?} on the host is {kind}, not a regular file")]
    NotRegular {
        /// The path.
        path: String,
        /// What it is ("a FIFO", ...).
        kind: &'static str,
    },
    /// A directory where a file name was expected.
    #[error("no directory on the host to list at {0:?}")]
    NotDirectory(String),
    /// The destination exists and `overwrite` was not given.
    #[error("{0:?} already exists on the host")]
    Exists(String),
    /// The file is over `--host-max-bytes`.
    #[error(
        "the file is {size} bytes, over the server's limit of {max} bytes per copy to the host"
    )]
    TooLarge {
        /// Its size (or what arrived before the copy was stopped).
        size: u64,
        /// `--host-max-bytes`.
        max: u64,
    },
    /// A tree with more entries than a copy takes.
    #[error("the tree {path:?} has more than {max} entries")]
    TooManyEntries {
        /// Its top.
        path: String,
        /// The limit.
        max: usize,
    },
    /// A name that cannot be a file name (empty, `.`, `..`).
    #[error("{0:?} is no file name")]
    BadName(String),
    /// The kernel has no `openat2` (Linux before 5.6).
    #[error("this host's kernel has no openat2 (Linux 5.6 or later is needed), so host paths cannot be resolved safely")]
    Unsupported,
    /// Any other failure of a host file operation.
    #[error("cannot {op} {path:?} on the host: {errno}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: String,
        /// The error.
        errno: Errno,
    },
}

impl HostDirs {
    /// Opens the allowed directories (each must exist and be a directory); copies
    /// from a sandbox write at most `max_bytes` each.
    pub fn open(dirs: &[PathBuf], max_bytes: u64) -> Result<Self, HostError> {
        let mut roots = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let dir_error = |error| HostError::Dir {
                path: dir.clone(),
                error,
            };
            let canonical = std::fs::canonicalize(dir).map_err(dir_error)?;
            let given = if dir.is_absolute() {
                dir.clone()
            } else {
                canonical.clone()
            };
            let fd = fs::open_dir(&canonical).map_err(dir_error)?;
            roots.push(Root {
                given,
                canonical,
                fd,
            });
        }
        Ok(Self { roots, max_bytes })
    }

    /// Whether any directory is allowed (the host tools are offered only then).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The allowed directories, as the operator named them.
    pub fn allowed(&self) -> Vec<String> {
        self.roots
            .iter()
            .map(|root| root.given.display().to_string())
            .collect()
    }

    /// The most one copy to the host writes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The allowed directory `path` lies under (the deepest one when they nest) and
    /// the rest of `path` below it, as written: the kernel resolves that part.
    fn locate(&self, path: &str) -> Result<(&Root, PathBuf), HostError> {
        let full = Path::new(path);
        if !full.is_absolute() {
            return Err(HostError::Relative(path.to_owned()));
        }
        self.roots
            .iter()
            .flat_map(|root| {
                [&root.given, &root.canonical]
                    .into_iter()
                    .filter_map(move |base| {
                        let rest = full.strip_prefix(base).ok()?;
                        Some((base.components().count(), root, rest.to_path_buf()))
                    })
            })
            .max_by_key(|(depth, _, _)| *depth)
            .map(|(_, root, rest)| (root, rest))
            .ok_or_else(|| HostError::Outside(path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_located_under_the_deepest_allowed_directory() {
        let top = std::env::temp_dir().join(format!("hostdirs-{}", std::process::id()));
        let inner = top.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        let dirs = HostDirs::open(&[top.clone(), inner.clone()], 10).unwrap();
        let (root, rest) = dirs.locate(&format!("{}/a/b", inner.display())).unwrap();
        assert_eq!(root.given, inner);
        assert_eq!(rest, PathBuf::from("a/b"));
        let (root, rest) = dirs.locate(&format!("{}/x", top.display())).unwrap();
        assert_eq!(
            (root.given.clone(), rest),
            (top.clone(), PathBuf::from("x"))
        );
        // Components, not string prefixes: "inner2" is not under "inner".
        let (root, _) = dirs.locate(&format!("{}2/x", inner.display())).unwrap();
        assert_eq!(root.given, top);
        assert!(matches!(
            dirs.locate("/etc/passwd"),
            Err(HostError::Outside(_))
        ));
        assert!(matches!(dirs.locate("rel/x"), Err(HostError::Relative(_))));
        std::fs::remove_dir_all(&top).unwrap();
    }

    #[test]
    fn a_missing_or_non_directory_host_dir_is_refused() {
        let missing = PathBuf::from("/nonexistent/host-dir");
        assert!(matches!(
            HostDirs::open(&[missing], 1),
            Err(HostError::Dir { .. })
        ));
        let file = std::env::temp_dir().join(format!("hostdirs-file-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            HostDirs::open(std::slice::from_ref(&file), 1),
            Err(HostError::Dir { .. })
        ));
        std::fs::remove_file(&file).unwrap();
    }
}
