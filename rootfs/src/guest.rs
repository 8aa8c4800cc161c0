//! What the builder adds to a guest tree on top of the base: the folders and account
//! files every guest needs, the agent, and the kernel modules with their load list.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tracing::info;

use crate::cmd::{self, CmdError};
use crate::modules::{ModuleError, ModuleIndex};
use crate::tree::{ensure_guest_dir, guest_path, install_file, write_file, TreeError};

/// Where the agent reads its module list (must match the agent's `init::modules`).
pub const MODULE_LIST: &str = "etc/sandbox/modules";

/// Where module files go in the guest (`/lib` is often a symlink to `usr/lib`).
pub const GUEST_MODULES_DIR: &str = "usr/lib/modules";

/// Folders every guest has, with their modes.
const ESSENTIAL_DIRS: [(&str, u32); 10] = [
    ("dev", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("run", 0o755),
    ("tmp", 0o1777),
    ("root", 0o700),
    ("etc", 0o755),
    ("etc/sandbox", 0o755),
    ("usr", 0o755),
    ("usr/lib", 0o755),
];

/// Adding files to the guest tree failed.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A file operation failed.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// A module could not be resolved.
    #[error(transparent)]
    Module(#[from] ModuleError),
    /// A compressed module could not be decompressed.
    #[error("Cannot decompress module {}", path.display())]
    Decompress {
        /// The module file.
        path: PathBuf,
        /// Why.
        #[source]
        error: CmdError,
    },
}

/// Creates the essential folders and, when the base has none, `/etc/passwd` and
/// `/etc/group` with root (home `/root`).
pub fn add_essentials(root: &Path) -> Result<(), GuestError> {
    for (dir, mode) in ESSENTIAL_DIRS {
        ensure_guest_dir(root, dir, mode)?;
    }
    for (file, text) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
    ] {
        let path = guest_path(root, file)?;
        if fs::symlink_metadata(&path).is_err() {
            write_file(&path, text.as_bytes(), 0o644)?;
        }
    }
    Ok(())
}

/// Installs the agent at `rel` (e.g. `init`) in the guest tree.
pub fn add_agent(root: &Path, agent: &Path, rel: &str) -> Result<(), GuestError> {
    install_file(agent, &guest_path(root, rel)?, 0o755)?;
    Ok(())
}

/// Copies the modules for `wanted` (in load order, dependencies first) from
/// `modules_dir` into the guest under [`GUEST_MODULES_DIR`]`/<kernel_version>/`,
/// decompressing `.ko.xz`/`.ko.zst`/`.ko.gz`, and writes [`MODULE_LIST`].
/// Returns the guest paths in load order.
pub fn add_modules(
    root: &Path,
    modules_dir: &Path,
    kernel_version: &str,
    wanted: &[&str],
) -> Result<Vec<String>, GuestError> {
    let index = ModuleIndex::load(modules_dir)?;
    let order = index.load_order(wanted)?;
    let mut guest_paths = Vec::with_capacity(order.len());
    for rel in &order {
        let source = modules_dir.join(rel);
        let (plain, tool) = strip_compression(rel);
        let guest_rel = format!("{GUEST_MODULES_DIR}/{kernel_version}/{plain}");
        let dest = guest_path(root, &guest_rel)?;
        match tool {
            None => install_file(&source, &dest, 0o644)?,
            Some(tool) => decompress(tool, &source, &dest)?,
        }
        guest_paths.push(format!("/{guest_rel}"));
    }
    let mut list = String::from("# Kernel modules for the sandbox agent, in load order.\n");
    for path in &guest_paths {
        list.push_str(path);
        list.push('\n');
    }
    write_file(&guest_path(root, MODULE_LIST)?, list.as_bytes(), 0o644)?;
    info!(modules = guest_paths.len(), "kernel modules added");
    Ok(guest_paths)
}

/// `a.ko.xz` → (`a.ko`, Some("xz")).
fn strip_compression(rel: &str) -> (&str, Option<&'static str>) {
    for (suffix, tool) in [(".xz", "xz"), (".zst", "zstd"), (".gz", "gzip")] {
        if let Some(plain) = rel.strip_suffix(suffix) {
            return (plain, Some(tool));
        }
    }
    (rel, None)
}

fn decompress(tool: &'static str, source: &Path, dest: &Path) -> Result<(), GuestError> {
    let fail = |error| GuestError::Decompress {
        path: source.to_owned(),
        error,
    };
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).map_err(|error| TreeError {
            op: "create",
            path: parent.to_owned(),
            error,
        })?;
    }
    let out = fs::File::create(dest).map_err(|error| TreeError {
        op: "create",
        path: dest.to_owned(),
        error,
    })?;
    cmd::run(
        Command::new(tool)
            .arg("-dc")
            .arg(source)
            .stdout(Stdio::from(out)),
    )
    .map(drop)
    .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essentials_keep_the_base_accounts() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("etc")).unwrap();
        fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/bash\n",
        )
        .unwrap();
        add_essentials(root.path()).unwrap();
        let passwd = fs::read_to_string(root.path().join("etc/passwd")).unwrap();
        assert!(passwd.ends_with("/bin/bash\n"));
        let group = fs::read_to_string(root.path().join("etc/group")).unwrap();
        assert_eq!(group, "root:x:0:\n");
        assert!(root.path().join("tmp").is_dir());
    }

    #[test]
    fn modules_are_copied_in_order_with_a_list() {
        let kdir = tempfile::tempdir().unwrap();
        fs::create_dir_all(kdir.path().join("kernel/a")).unwrap();
        fs::write(kdir.path().join("kernel/a/base.ko"), b"base").unwrap();
        fs::write(kdir.path().join("kernel/a/top.ko"), b"top").unwrap();
        fs::write(
            kdir.path().join("modules.dep"),
            "kernel/a/base.ko:\nkernel/a/top.ko: kernel/a/base.ko\n",
        )
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        let paths = add_modules(root.path(), kdir.path(), "9.9", &["top"]).unwrap();
        assert_eq!(
            paths,
            [
                "/usr/lib/modules/9.9/kernel/a/base.ko",
                "/usr/lib/modules/9.9/kernel/a/top.ko"
            ]
        );
        let list = fs::read_to_string(root.path().join(MODULE_LIST)).unwrap();
        assert!(list.ends_with("base.ko\n/usr/lib/modules/9.9/kernel/a/top.ko\n"));
        assert_eq!(
            fs::read(root.path().join("usr/lib/modules/9.9/kernel/a/top.ko")).unwrap(),
            b"top"
        );
    }
}
