//! File tree helpers for the staging folder: copying, measuring, removing.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A tree operation failed.
#[derive(Debug, thiserror::Error)]
#[error("Cannot {op} {}", path.display())]
pub struct TreeError {
    /// What was being done.
    pub op: &'static str,
    /// The path.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub error: io::Error,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TreeError + 'a {
    move |error| TreeError {
        op,
        path: path.to_owned(),
        error,
    }
}

/// Copies the contents of `src` into `dst` (created if missing): files with their
/// permission bits, symlinks as symlinks, directories recursively. Device nodes,
/// sockets and FIFOs are skipped (the guest's `/dev` is a devtmpfs anyway).
pub fn copy_tree(src: &Path, dst: &Path) -> Result<(), TreeError> {
    fs::create_dir_all(dst).map_err(err("create", dst))?;
    for entry in fs::read_dir(src).map_err(err("list", src))? {
        let entry = entry.map_err(err("list", src))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let meta = fs::symlink_metadata(&from).map_err(err("stat", &from))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            copy_tree(&from, &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(err("chmod", &to))?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&from).map_err(err("read link", &from))?;
            remove_path(&to)?;
            symlink(&target, &to).map_err(err("create link", &to))?;
        } else if kind.is_file() {
            remove_path(&to)?;
            fs::copy(&from, &to).map_err(err("copy", &from))?;
        }
    }
    Ok(())
}

/// Removes whatever is at `path` (file, link or whole directory); missing is fine.
pub fn remove_path(path: &Path) -> Result<(), TreeError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(err("stat", path)(error)),
    };
    if meta.is_dir() {
        fs::remove_dir_all(path).map_err(err("remove", path))
    } else {
        fs::remove_file(path).map_err(err("remove", path))
    }
}

/// Bytes the tree's regular files and symlinks take (apparent size), hard links
/// counted once.
pub fn tree_bytes(root: &Path) -> Result<u64, TreeError> {
    let mut seen = std::collections::HashSet::new();
    tree_bytes_inner(root, &mut seen)
}

fn tree_bytes_inner(
    dir: &Path,
    seen: &mut std::collections::HashSet<(u64, u64)>,
) -> Result<u64, TreeError> {
    let mut total = 0;
    for entry in fs::read_dir(dir).map_err(err("list", dir))? {
        let entry = entry.map_err(err("list", dir))?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(err("stat", &path))?;
        if meta.is_dir() {
            total += tree_bytes_inner(&path, seen)?;
        } else if seen.insert((meta.dev(), meta.ino())) {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Writes `data` to `path`, creating parent folders, with permission bits `mode`.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), TreeError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(err("create", parent))?;
    }
    remove_path(path)?;
    fs::write(path, data).map_err(err("write", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(err("chmod", path))
}

/// Copies one file to `dst`, creating parent folders, with permission bits `mode`.
pub fn install_file(src: &Path, dst: &Path, mode: u32) -> Result<(), TreeError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(err("create", parent))?;
    }
    remove_path(dst)?;
    fs::copy(src, dst).map_err(err("copy", src))?;
    fs::set_permissions(dst, fs::Permissions::from_mode(mode)).map_err(err("chmod", dst))
}

/// Creates a directory (and parents) with permission bits `mode` on the last one.
pub fn make_dir(path: &Path, mode: u32) -> Result<(), TreeError> {
    fs::create_dir_all(path).map_err(err("create", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(err("chmod", path))
}

/// `root/rel` for writing into a guest tree: fails when a folder on the way is a
/// symlink, which could point out of `root` (`/lib -> /usr/lib` resolves on the host).
pub fn guest_path(root: &Path, rel: &str) -> Result<PathBuf, TreeError> {
    let mut path = root.to_owned();
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        if *part == ".." || *part == "." {
            return Err(TreeError {
                op: "resolve",
                path: root.join(rel),
                error: io::Error::new(io::ErrorKind::InvalidInput, "relative component"),
            });
        }
        path.push(part);
        let is_last = i + 1 == parts.len();
        if !is_last {
            if let Ok(meta) = fs::symlink_metadata(&path) {
                if meta.file_type().is_symlink() {
                    return Err(TreeError {
                        op: "write below the symlink",
                        path,
                        error: io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "the guest tree has a symlink where a folder is needed",
                        ),
                    });
                }
            }
        }
    }
    Ok(path)
}

/// Creates folder `rel` in a guest tree with `mode`, unless something is there.
pub fn ensure_guest_dir(root: &Path, rel: &str, mode: u32) -> Result<(), TreeError> {
    let path = guest_path(root, rel)?;
    if fs::symlink_metadata(&path).is_err() {
        make_dir(&path, mode)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_keeps_links_and_modes_and_size_counts_files() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        fs::create_dir(src.path().join("d")).unwrap();
        write_file(&src.path().join("d/f"), b"hello", 0o750).unwrap();
        symlink("d/f", src.path().join("link")).unwrap();
        copy_tree(src.path(), dst.path()).unwrap();
        let meta = fs::metadata(dst.path().join("d/f")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o750);
        assert_eq!(
            fs::read_link(dst.path().join("link")).unwrap(),
            Path::new("d/f")
        );
        assert_eq!(tree_bytes(dst.path()).unwrap(), 5 + 3);
    }

    #[test]
    fn guest_paths_refuse_symlinked_folders() {
        let root = tempfile::tempdir().unwrap();
        symlink("/usr/lib", root.path().join("lib")).unwrap();
        assert!(guest_path(root.path(), "lib/modules/x.ko").is_err());
        assert!(guest_path(root.path(), "lib").is_ok());
        assert!(guest_path(root.path(), "etc/../x").is_err());
        assert_eq!(
            guest_path(root.path(), "/etc/passwd").unwrap(),
            root.path().join("etc/passwd")
        );
    }
}
