//! Running the host tools the builder relies on (`apt-get`, `dpkg-deb`, `depmod`,
//! `lz4`, `mkfs.ext4`, `cargo`, `busybox`, `mmdebstrap`), with errors that say which
//! tool failed, how, and what to install.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A host tool that could not be run or failed.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// The program could not be started (usually: not installed).
    #[error("Cannot run {program} (is it installed? {hint})")]
    Spawn {
        /// The program.
        program: String,
        /// What provides it.
        hint: &'static str,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// The program exited unsuccessfully.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        program: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its standard error.
        stderr: String,
    },
}

/// Which Debian package provides `program`, for error messages.
fn install_hint(program: &str) -> &'static str {
    match program {
        "apt-get" | "apt-cache" => "Debian's apt",
        "dpkg-deb" => "the dpkg package",
        "depmod" => "the kmod package",
        "lz4" => "the lz4 package",
        "gzip" => "the gzip package",
        "xz" => "the xz-utils package",
        "zstd" => "the zstd package",
        "mkfs.ext4" => "the e2fsprogs package",
        "busybox" => "the busybox-static package",
        "mmdebstrap" => "the mmdebstrap package",
        "cargo" => "a Rust toolchain with the x86_64-unknown-linux-musl target",
        _ => "see the README",
    }
}

/// Runs `command` to completion, capturing its output; fails on a non-zero exit.
pub fn run(command: &mut Command) -> Result<Output, CmdError> {
    let program = describe(command);
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| spawn_error(command, error))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(CmdError::Failed {
            program,
            status: output.status,
            stderr: tail(&output.stderr),
        })
    }
}

/// Runs `command` with its stderr passed through (for long steps whose progress the
/// user should see), failing on a non-zero exit.
pub fn run_visible(command: &mut Command) -> Result<(), CmdError> {
    let program = describe(command);
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|error| spawn_error(command, error))?;
    if status.success() {
        Ok(())
    } else {
        Err(CmdError::Failed {
            program,
            status,
            stderr: "see the output above".to_owned(),
        })
    }
}

/// Like [`run`], with the command's stdout as text.
pub fn stdout_of(command: &mut Command) -> Result<String, CmdError> {
    run(command).map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
}

pub(crate) fn spawn_error(command: &Command, error: std::io::Error) -> CmdError {
    let program = command.get_program().to_string_lossy().into_owned();
    let name = Path::new(&program)
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    CmdError::Spawn {
        hint: install_hint(&name),
        program,
        error,
    }
}

fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// The last few lines of a tool's stderr.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(5);
    lines[start..].join(" | ")
}
