//! The host end of `net: egress` (the guest end and the wire are described in
//! `sandbox_protocol::link::egress`).
//!
//! # Why a proxy over the link, not a NIC
//! The agent already has one stream to the host that survives checkpoints: the link
//! of a serial-transport VM, owned by its `sandbox-relay`. Egress rides it as
//! agent-opened channels, so it needs no virtio-net device (none in the snapshot's
//! device state, nothing to re-plumb after a fork), no tap, bridge or root on the
//! host, and each restored or forked VM gets egress from its own relay, with its own
//! policy and log. The host sees every destination *by name* and dials it itself, so
//! the allowlist can be written in names and wildcards and still be checked against
//! the address actually dialled ([`allowlist`]). QEMU's user networking (slirp) would
//! be transparent for all TCP, but can filter by address only (`hostfwd`/`restrict`
//! know nothing of names), and adds a device to every snapshot. The cost of the proxy
//! is that only programs that honour the proxy variables use it (curl, wget, pip,
//! git, apt, Python's urllib, Node with them set...); a program that opens raw
//! sockets finds no route at all, which fails closed.
//!
//! # Layout
//! - [`allowlist`]: entries, the two-step check, narrowing ([`Policy`]).
//! - [`log`]: the per-VM egress log (`egress.log`, JSON lines) and its reader.
//! - [`dial`]: resolving, checking and connecting one destination.
//!
//! # Why channels of the link, not a vsock port per connection
//! A snapshot-capable VM has no vsock device at all (vhost-user-vsock blocks QEMU's
//! migration), so a guest-initiated vsock connection per proxied connection would
//! exist only for VMs that cannot be forked or hibernated. The link already gives
//! each channel credit-based flow control (a program that stops reading stalls only
//! its own connection), bounds per-session channel counts, and ends every channel of
//! an old session when a restored VM's new relay attaches. Measured under TCG on a
//! 2-core host (`tests/tests/microvm_egress.rs`, throughput): a 100 MiB download
//! through the proxy ran at 7.5-11.3 MiB/s, and a `put` of the same size over the
//! same link without the proxy was 0.8-1.9x as fast: the link and the emulated guest
//! set the rate; the proxy's share is the guest's loopback TCP and the program.
//!
//! The relay ([`crate::relay`]) ties them together for each `Dial` the agent sends.

pub mod allowlist;
pub mod dial;
pub mod log;

use std::path::{Path, PathBuf};

pub use allowlist::{Allowlist, EntryError, Host, Policy, PolicyFile};
pub use log::{EgressLog, EgressRecord, Verdict};

/// A VM's policy, in its run folder: present means `net: egress`.
pub const POLICY_FILE: &str = "egress.json";

/// A VM's egress log, in its run folder.
pub const LOG_FILE: &str = "egress.log";

/// A VM's network: none at all, or egress under a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Net {
    /// No route out: the default.
    #[default]
    None,
    /// Egress through the host, to what the policy allows.
    Egress(Policy),
}

impl Net {
    /// The policy, with egress.
    pub fn policy(&self) -> Option<&Policy> {
        match self {
            Self::None => None,
            Self::Egress(policy) => Some(policy),
        }
    }
}

/// What a relay needs to give its VM egress.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Who may be reached.
    pub policy: Policy,
    /// Where each connection is recorded.
    pub log: PathBuf,
}

/// Why a stored policy could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file could not be read or written.
    #[error("Cannot access the egress policy {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// It is not a policy.
    #[error("The egress policy {} is not valid JSON of a policy", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: serde_json::Error,
    },
    /// An entry does not parse.
    #[error(transparent)]
    Entry(#[from] EntryError),
}

/// Reads a stored policy; `Ok(None)` when there is none (`net: none`).
pub fn read_policy(path: &Path) -> Result<Option<Policy>, PolicyFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(PolicyFileError::Io {
                path: path.to_owned(),
                error,
            })
        }
    };
    let file: PolicyFile = serde_json::from_str(&text).map_err(|error| PolicyFileError::Json {
        path: path.to_owned(),
        error,
    })?;
    Ok(Some(Policy::from_file(&file)?))
}

/// Stores `policy` (owner-only, like everything in a run folder).
pub fn write_policy(path: &Path, policy: &Policy) -> Result<(), PolicyFileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |error| PolicyFileError::Io {
        path: path.to_owned(),
        error,
    };
    let text =
        serde_json::to_vec_pretty(&policy.to_file()).map_err(|error| PolicyFileError::Json {
            path: path.to_owned(),
            error,
        })?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(&text).map_err(io)
}
