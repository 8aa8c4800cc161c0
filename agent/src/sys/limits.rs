//! Resource limits of the agent's own process.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors the agent wants: every connection, transfer and child's pipes cost
/// some, and the kernel gives init 1024. Running out would stop `accept` for
/// everyone (a hostile client with many stalled transfers could do it).
const WANTED_OPEN_FILES: u64 = 65_536;

/// Raises the open-file limit: the soft limit to the hard one, and, where the agent
/// may (root, as init), both to [`WANTED_OPEN_FILES`]. Returns the soft limit in force.
pub fn raise_open_file_limit() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let wanted = WANTED_OPEN_FILES.max(soft);
    if hard < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return wanted;
    }
    let soft_target = hard.min(wanted);
    if soft < soft_target && setrlimit(Resource::RLIMIT_NOFILE, soft_target, hard).is_ok() {
        return soft_target;
    }
    soft
}
