//! The binaries under test, built once per test process with the same cargo, profile
//! and target directory as the tests themselves, so a test never runs a stale build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The packages whose binaries the end-to-end tests drive: the agent, the
/// `sandboxctl` front end, the host relay (`sandbox-vmm`'s `sandbox-relay`) and the
/// node daemon (the suite's `upgrade` transport). The one place that names them.
pub const BINARY_PACKAGES: &[&str] = &["sandbox-agent", "sandboxctl", "sandbox-vmm", "sandboxd"];

/// The image builder, built only by the tests that make templates.
pub const ROOTFS_PACKAGE: &str = "sandbox-rootfs";

/// Paths of the binaries under test.
#[derive(Debug)]
pub struct Binaries {
    /// `sandbox-agent`
    pub agent: PathBuf,
    /// `sandboxctl`
    pub sandboxctl: PathBuf,
    /// `sandbox-relay`
    pub relay: PathBuf,
    /// `sandboxd`
    pub sandboxd: PathBuf,
}

/// Builds [`BINARY_PACKAGES`] once per test process and returns the binaries' paths.
///
/// Panics with cargo's output when the build fails.
pub fn binaries() -> &'static Binaries {
    static BINARIES: OnceLock<Binaries> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let dir = build(BINARY_PACKAGES);
        Binaries {
            agent: existing(dir.join("sandbox-agent")),
            sandboxctl: existing(dir.join("sandboxctl")),
            relay: existing(dir.join("sandbox-relay")),
            sandboxd: existing(dir.join("sandboxd")),
        }
    })
}

/// `sandbox-rootfs`, built once per test process.
pub fn rootfs_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| existing(build(&[ROOTFS_PACKAGE]).join("sandbox-rootfs")))
}

/// A scratch directory under the tests' target directory (cargo's
/// `CARGO_TARGET_TMPDIR`, which the library cannot see): roomier than a small `/tmp`.
pub fn target_tmp_dir() -> PathBuf {
    let dir = profile_dir()
        .parent()
        .expect("profile directory has no parent")
        .join("tmp");
    std::fs::create_dir_all(&dir).expect("cannot create target/tmp");
    dir
}

/// The directory of the test executable's profile (`target/<profile>`).
fn profile_dir() -> PathBuf {
    // A test executable is target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("cannot find the test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable is not in target/<profile>/deps")
        .to_path_buf()
}

/// `cargo build -p … --bins` into the tests' own target directory and profile;
/// returns the profile directory the binaries land in.
fn build(packages: &[&str]) -> PathBuf {
    let profile_dir = profile_dir();
    let target_dir = profile_dir
        .parent()
        .expect("profile directory has no parent")
        .to_path_buf();
    let cargo = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO").map(PathBuf::from))
        .expect("CARGO is not set: run the tests with `cargo test`");
    let mut command = Command::new(&cargo);
    command.arg("build");
    for package in packages {
        command.args(["-p", package]);
    }
    command
        .arg("--bins")
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.display()));
    assert!(
        output.status.success(),
        "building {packages:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    profile_dir
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} is missing after a successful build",
        path.display()
    );
    path
}
