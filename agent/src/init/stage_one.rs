//! Stage one: from the initramfs into a root disk.
//!
//! Large templates keep their root filesystem on an ext4 disk (`sandbox.root=/dev/vda`)
//! and the initramfs holds only the agent and the modules. The agent in the initramfs
//! then does what `switch_root` does and re-executes the agent found on the disk,
//! which runs [`super::prepare`] again as stage two:
//!
//! 1. wait for the device node (the disk driver probes asynchronously),
//! 2. mount it at [`NEW_ROOT`],
//! 3. move `/dev`, `/proc`, `/sys` and `/run` into it (submounts move along) and
//!    detach the initramfs `/tmp`,
//! 4. delete the initramfs contents to give their RAM back (never crossing into
//!    another filesystem),
//! 5. `chdir` to the new root, move it over `/`, `chroot .`,
//! 6. `execv` the agent at [`AGENT_PATHS`] with the same arguments.
//!
//! Stage two recognizes itself by its root: not an initramfs (`rootfs`, `ramfs` or
//! `tmpfs` at `/`) any more.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, chroot, execv};
use tracing::{debug, info, warn};

use super::mounts::root_fstype;
use super::InitError;

/// Where the root disk is mounted before it becomes `/`.
pub const NEW_ROOT: &str = "/newroot";

/// Filesystem type of the root disk.
pub const ROOT_FSTYPE: &str = "ext4";

/// The agent inside the new root, tried in order (the image builder writes `/init`).
pub const AGENT_PATHS: [&str; 2] = ["/init", "/sbin/sandbox-agent"];

/// Mounts carried into the new root.
const MOVED_MOUNTS: [&str; 4] = ["/dev", "/proc", "/sys", "/run"];

/// How long to wait for the disk's device node.
pub const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// True when `/` is an initramfs, i.e. this is stage one.
pub fn running_from_initramfs() -> bool {
    matches!(root_fstype().as_deref(), Some("rootfs" | "ramfs" | "tmpfs"))
}

/// Switches into the root filesystem on `device` and executes the agent there.
/// Returns only on failure; what failed before the point of no return (step 4)
/// leaves the initramfs as it was, apart from the moved mounts.
pub fn switch_root(device: &Path) -> Result<Infallible, InitError> {
    wait_for_device(device, DEVICE_WAIT)?;
    let new_root = Path::new(NEW_ROOT);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(new_root)
        .map_err(|error| InitError::CreateDir {
            path: new_root.to_owned(),
            error,
        })?;
    mount(
        Some(device),
        new_root,
        Some(ROOT_FSTYPE),
        MsFlags::MS_NOATIME,
        None::<&str>,
    )
    .map_err(|errno| InitError::Mount {
        target: new_root.to_owned(),
        fstype: ROOT_FSTYPE,
        error: errno.into(),
    })?;
    info!(device = %device.display(), "root disk mounted");

    let agent = AGENT_PATHS
        .iter()
        .map(|path| (path, new_root.join(path.trim_start_matches('/'))))
        .find(|(_, inside)| inside.is_file())
        .map(|(path, _)| PathBuf::from(path))
        .ok_or_else(|| InitError::NoAgentInRoot {
            root: new_root.to_owned(),
        })?;
    let args = current_args()?;

    for old in MOVED_MOUNTS {
        move_mount(Path::new(old), &new_root.join(old.trim_start_matches('/')))?;
    }
    if let Err(errno) = umount2("/tmp", MntFlags::MNT_DETACH) {
        debug!(%errno, "initramfs /tmp not unmounted");
    }

    free_initramfs(new_root);

    chdir(new_root).map_err(|errno| switch_error("chdir", errno))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|errno| switch_error("move new root", errno))?;
    chroot(".").map_err(|errno| switch_error("chroot", errno))?;
    chdir("/").map_err(|errno| switch_error("chdir", errno))?;

    info!(agent = %agent.display(), "executing the agent in the new root");
    let program = CString::new(agent.as_os_str().as_bytes()).map_err(|_| InitError::Exec {
        path: agent.clone(),
        error: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let Err(errno) = execv(&program, &args);
    Err(InitError::Exec {
        path: agent,
        error: errno.into(),
    })
}

fn switch_error(step: &'static str, errno: nix::Error) -> InitError {
    InitError::SwitchRoot {
        step,
        error: errno.into(),
    }
}

/// Polls for `device` to appear (devtmpfs creates it once the driver probes).
fn wait_for_device(device: &Path, limit: Duration) -> Result<(), InitError> {
    let deadline = Instant::now() + limit;
    while !device.exists() {
        if Instant::now() >= deadline {
            return Err(InitError::DeviceMissing {
                device: device.to_owned(),
                waited: limit,
            });
        }
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn move_mount(from: &Path, to: &Path) -> Result<(), InitError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(to)
        .map_err(|error| InitError::CreateDir {
            path: to.to_owned(),
            error,
        })?;
    mount(Some(from), to, None::<&str>, MsFlags::MS_MOVE, None::<&str>).map_err(|errno| {
        InitError::MoveMount {
            from: from.to_owned(),
            to: to.to_owned(),
            error: errno.into(),
        }
    })
}

/// This process's arguments as C strings, for `execv`.
fn current_args() -> Result<Vec<CString>, InitError> {
    std::env::args_os()
        .map(|arg| {
            CString::new(arg.as_bytes()).map_err(|_| InitError::Exec {
                path: PathBuf::from(arg),
                error: io::Error::from(io::ErrorKind::InvalidInput),
            })
        })
        .collect()
}

/// Deletes the initramfs's files: the kernel never frees rootfs memory otherwise.
/// Stays on the root's device, so neither the new root nor any mount is touched.
/// Failures are logged: they only cost memory.
fn free_initramfs(keep: &Path) {
    let root_dev = match fs::symlink_metadata("/") {
        Ok(meta) => meta.dev(),
        Err(error) => {
            warn!(%error, "initramfs not freed");
            return;
        }
    };
    let mut freed_files = 0u64;
    delete_children(Path::new("/"), root_dev, keep, &mut freed_files);
    debug!(freed_files, "initramfs freed");
}

fn delete_children(dir: &Path, root_dev: u64, keep: &Path, freed: &mut u64) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            debug!(dir = %dir.display(), %error, "cannot list");
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == keep {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.dev() != root_dev {
            // A mount point (or something on another filesystem): leave it.
            continue;
        }
        let removed = if meta.is_dir() {
            delete_children(&path, root_dev, keep, freed);
            fs::remove_dir(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => *freed += 1,
            Err(error) => debug!(path = %path.display(), %error, "not deleted"),
        }
    }
}
