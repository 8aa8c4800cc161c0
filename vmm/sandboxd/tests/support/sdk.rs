//! Seed 000's Python SDK (`cocoonstack-sandbox` from PyPI), the reference client
//! of the node's API, in the venv `scripts/setup.sh` makes at `target/silkd-python`.

use std::path::PathBuf;

/// The SDK release the tests drive.
pub const SDK: &str = "cocoonstack-sandbox==0.1.19";

/// `target/silkd-python`, the venv `scripts/setup.sh` makes.
pub fn venv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/silkd-python")
}

/// The venv's Python with the SDK importable, made (python3 -m venv, pip install)
/// when it is not; panics with what failed.
pub fn python_with_sdk() -> PathBuf {
    let python = venv().join("bin/python");
    let importable = |python: &PathBuf| {
        std::process::Command::new(python)
            .args(["-c", "import cocoonsandbox"])
            .output()
            .is_ok_and(|out| out.status.success())
    };
    if importable(&python) {
        return python;
    }
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(venv())
        .status();
    assert!(
        made.as_ref().is_ok_and(|status| status.success()),
        "cannot make the SDK venv with python3 -m venv ({made:?}); run scripts/setup.sh"
    );
    let installed = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            SDK,
        ])
        .status();
    assert!(
        installed.as_ref().is_ok_and(|status| status.success()) && importable(&python),
        "cannot pip install {SDK} into {} ({installed:?}): PyPI must be reachable, or run \
         scripts/setup.sh where it is",
        venv().display()
    );
    python
}
