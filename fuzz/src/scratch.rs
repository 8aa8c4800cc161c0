//! Confines the `agent_dispatch` target's file requests to a scratch directory.
//!
//! Every path a request carries is rewritten: its components are kept except empty
//! ones, `.` and `..`, and what is left is joined under the scratch directory. So
//! `/etc/passwd` becomes `SCRATCH/etc/passwd` and `../../x` becomes `SCRATCH/x`.
//! No request the target runs can create a symlink (there is no such request, and
//! the directory starts empty each run), so nothing can lead out of it either.
//! Requests that would run programs, power off or touch the clock are never run.

use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use sandbox_protocol::wait::WAIT_MAX_TIMEOUT_MS;
use sandbox_protocol::{Request, WaitTarget};

/// `path` made to name something inside `root`, as raw bytes.
pub fn confine(root: &Path, path: &[u8]) -> Vec<u8> {
    let mut out = PathBuf::from(root);
    for component in path.split(|&b| b == b'/') {
        if matches!(component, b"" | b"." | b"..") {
            continue;
        }
        out.push(OsStr::from_bytes(component));
    }
    out.into_os_string().into_vec()
}

/// `request` with every path confined to `root`, or `None` when it is not safe to
/// run in a fuzzer's process at all (exec, spawn, pty and eval run programs; shutdown
/// powers off; resumed sets the clock; a port forward dials the fuzzing machine's own
/// loopback ports). `reidentify` runs: the fuzzer's agent is not
/// init, so it never sets the hostname. A `wait_for_text` waits at most
/// [`WAIT_FUZZ_MS`], so an input cannot make a run wait minutes.
pub fn confine_request(root: &Path, request: Request) -> Option<Request> {
    let fix = |path: &mut Vec<u8>| *path = confine(root, path);
    let mut request = request;
    match &mut request {
        Request::Exec(_)
        | Request::Spawn(_)
        | Request::PtyOpen(_)
        | Request::Resumed(_)
        | Request::Eval(_)
        | Request::PortForward(_)
        | Request::Shutdown(_) => return None,
        // These look a pid up in the process table, which stays empty because nothing
        // is ever started: they can only fail, and must do so with a typed error.
        Request::Logs(_)
        | Request::Kill(_)
        | Request::PtyInput(_)
        | Request::PtyResize(_)
        | Request::Ps
        | Request::PsDetail
        | Request::Confinement
        | Request::CloseSession(_)
        | Request::Info => {}
        // The fuzzer's agent is not init: a hostname is refused (after the checks
        // this target exercises), and a token only changes that agent's memory.
        Request::Reidentify(_) => {}
        Request::WriteFile(request) => fix(&mut request.path),
        Request::ReadFile(request)
        | Request::ListDir(request)
        | Request::Stat(request)
        | Request::Get(request) => fix(&mut request.path),
        Request::Mkdir(request) => fix(&mut request.path),
        Request::Remove(request) => fix(&mut request.path),
        Request::Rename(request) => {
            fix(&mut request.from);
            fix(&mut request.to);
        }
        Request::Put(request) => fix(&mut request.path),
        Request::WaitForText(request) => {
            if let WaitTarget::File(path) = &mut request.target {
                fix(path);
            }
            // Out-of-range deadlines are refused before any wait: keep them.
            if let Some(ms) = &mut request.timeout_ms {
                if *ms <= WAIT_MAX_TIMEOUT_MS {
                    *ms = (*ms).min(WAIT_FUZZ_MS);
                }
            } else {
                request.timeout_ms = Some(WAIT_FUZZ_MS);
            }
        }
    }
    Some(request)
}

/// The longest a fuzzed `wait_for_text` waits.
pub const WAIT_FUZZ_MS: u64 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_ends_up_under_the_root() {
        let root = Path::new("/scratch/run");
        for (path, expected) in [
            (&b"/etc/passwd"[..], "/scratch/run/etc/passwd"),
            (b"../../../etc", "/scratch/run/etc"),
            (b"/a/./b/../c", "/scratch/run/a/b/c"),
            (b"", "/scratch/run"),
            (b"//..//", "/scratch/run"),
        ] {
            assert_eq!(confine(root, path), expected.as_bytes(), "{path:?}");
        }
    }
}
