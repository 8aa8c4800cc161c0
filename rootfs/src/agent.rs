//! The static agent binary that becomes `/init`.
//!
//! Given with `--agent`, or found at
//! `<target dir>/x86_64-unknown-linux-musl/agent/sandbox-agent` (the workspace's `agent`
//! profile: release, stripped, whole-program optimised) of the Cargo
//! workspace around the current folder (or around this builder's own executable),
//! after `cargo build` brought it up to date. It must be statically linked:
//! the initramfs has no dynamic loader, and a dynamic `/init` fails with a kernel panic.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::{info, warn};

use crate::cmd::{self, CmdError};

/// The target triple of the guest agent.
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-musl";

/// The agent's package and binary name.
pub const AGENT_PACKAGE: &str = "sandbox-agent";

/// The Cargo profile templates get the agent from (see the workspace's `Cargo.toml`).
pub const AGENT_PROFILE: &str = "agent";

/// Finding or building the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No `--agent` and no Cargo workspace to build it in.
    #[error("No agent binary: pass --agent PATH, or run from the project's Cargo workspace")]
    NoWorkspace,
    /// Building it failed.
    #[error("Cannot build the agent")]
    Build(#[source] CmdError),
    /// The file could not be read.
    #[error("Cannot read the agent {}", path.display())]
    Read {
        /// The binary.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The file is not a static x86-64 ELF executable.
    #[error("The agent {} is not usable as /init: {reason}", path.display())]
    NotStatic {
        /// The binary.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Where to look for a workspace: the current folder and the builder's executable.
#[derive(Debug, Clone, Default)]
pub struct AgentSearch {
    /// Folders whose ancestors may hold the workspace root, tried in order.
    pub start_dirs: Vec<PathBuf>,
    /// `CARGO_TARGET_DIR`, when set.
    pub target_dir: Option<PathBuf>,
}

/// The agent to bake in: `explicit`, or the workspace's [`AGENT_PROFILE`] build
/// (brought up to date first). Checked to be a static x86-64 executable.
pub fn locate(explicit: Option<&Path>, search: &AgentSearch) -> Result<PathBuf, AgentError> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None => {
            let workspace = search
                .start_dirs
                .iter()
                .find_map(|dir| find_workspace_root(dir))
                .ok_or(AgentError::NoWorkspace)?;
            let target_dir = search
                .target_dir
                .clone()
                .unwrap_or_else(|| workspace.join("target"));
            let binary = target_dir
                .join(AGENT_TARGET)
                .join(AGENT_PROFILE)
                .join(AGENT_PACKAGE);
            // Always ask cargo: it is a no-op when the build is fresh, and it keeps a
            // stale agent from being baked into a new template.
            info!(workspace = %workspace.display(), "building the static agent");
            let built = cmd::run_visible(
                Command::new("cargo")
                    .args(["build", "--profile", AGENT_PROFILE, "-p", AGENT_PACKAGE])
                    .args(["--target", AGENT_TARGET])
                    .current_dir(&workspace),
            );
            match built {
                Ok(()) => {}
                Err(error @ CmdError::Spawn { .. }) if binary.is_file() => {
                    warn!(%error, "cargo unavailable; using the existing agent build");
                }
                Err(error) => return Err(AgentError::Build(error)),
            }
            binary
        }
    };
    check_static(&path)?;
    Ok(path)
}

/// The nearest ancestor of `start` (itself included) whose `Cargo.toml` has a
/// `[workspace]` section.
pub fn find_workspace_root(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        manifest
            .lines()
            .any(|line| line.trim() == "[workspace]")
            .then(|| dir.to_owned())
    })
}

/// ELF program header type of the dynamic loader request.
const PT_INTERP: u32 = 3;

/// Fails unless `path` is an x86-64 ELF executable without a dynamic loader.
pub fn check_static(path: &Path) -> Result<(), AgentError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|file| file.take(1 << 20).read_to_end(&mut bytes))
        .map_err(|error| AgentError::Read {
            path: path.to_owned(),
            error,
        })?;
    elf_static_reason(&bytes).map_or(Ok(()), |reason| {
        Err(AgentError::NotStatic {
            path: path.to_owned(),
            reason,
        })
    })
}

/// Why `elf` (the first bytes of a file) cannot run as `/init`, if it cannot.
fn elf_static_reason(elf: &[u8]) -> Option<&'static str> {
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Some("not a 64-bit little-endian ELF file");
    }
    if u16_at(0x12) != Some(62) {
        return Some("not built for x86-64");
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return Some("truncated ELF header");
    };
    for i in 0..u64::from(phnum) {
        let Some(at) = phoff
            .checked_add(i * u64::from(phentsize))
            .and_then(|at| usize::try_from(at).ok())
        else {
            return Some("program headers out of range");
        };
        match u32_at(at) {
            Some(PT_INTERP) => {
                return Some("dynamically linked (build it for x86_64-unknown-linux-musl)")
            }
            Some(_) => {}
            None => return Some("program headers out of range"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_binary_itself_is_judged() {
        // Test binaries are dynamically linked against glibc on the usual host target.
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(exe).unwrap();
        let reason = elf_static_reason(&bytes);
        if cfg!(target_env = "gnu") {
            assert!(reason.is_some_and(|r| r.starts_with("dynamically linked")));
        }
    }

    #[test]
    fn non_elf_files_are_rejected() {
        assert_eq!(
            elf_static_reason(b"#!/bin/sh\n"),
            Some("not a 64-bit little-endian ELF file")
        );
    }

    #[test]
    fn workspace_root_is_found_from_a_member() {
        let root = find_workspace_root(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(root.join("rootfs").is_dir());
    }
}
