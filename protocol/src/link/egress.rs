//! Egress over the link: the guest's way out, opened from the guest side.
//!
//! A sandbox with `net: egress` has no network device. The agent serves an HTTP proxy
//! on the guest's loopback ([`EGRESS_PROXY_PORT`]); every connection a program makes
//! through it becomes one *agent-opened* channel of the link:
//!
//! 1. After `Attached`, a host that gives the VM egress sends
//!    [`LinkFrame::Network`](super::LinkFrame::Network) `{ egress: true }`; only then
//!    does the agent listen and point programs at the proxy. (A host with `net: none`
//!    sends nothing, so an older agent never meets a frame it cannot decode.)
//! 2. For a `CONNECT host:port` or an absolute-URI request, the agent opens a channel
//!    in its own id space ([`EGRESS_CHANNEL_BIT`] set) and sends
//!    [`LinkFrame::Dial`](super::LinkFrame::Dial) with the name and port *as the
//!    program gave them*. The guest never resolves a name: the host does.
//! 3. The host checks its allowlist against the name and then against every address
//!    it resolved (so a name that rebinds to an internal address is refused), dials,
//!    and answers [`LinkFrame::Dialed`](super::LinkFrame::Dialed). On success the
//!    channel carries the TCP stream's bytes with the usual credit; on a refusal the
//!    agent drops its half of the channel and tells the program why.
//!
//! Nothing here lives in device state: a restored VM has egress again as soon as its
//! new relay attaches and sends `Network` (connections that were open drop, like any
//! channel of the old session).

use serde::{Deserialize, Serialize};

/// The guest port of the agent's HTTP proxy (on 127.0.0.1): the usual squid port.
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// Set in the id of every channel the agent opens, so the two sides never pick the
/// same number: the host numbers its channels below it.
pub const EGRESS_CHANNEL_BIT: u32 = 0x8000_0000;

/// Egress connections one VM may have open (or being dialled) at once; each side
/// refuses more. Counted within [`super::MAX_CHANNELS`].
pub const MAX_EGRESS_CONNECTIONS: usize = 64;

/// Longest destination name a `Dial` may carry (a DNS name is at most 253 bytes).
pub const DIAL_HOST_MAX_BYTES: usize = 253;

/// A DNS name the host dials: at most [`DIAL_HOST_MAX_BYTES`], of dot-separated
/// labels of ASCII letters, digits, `-` and `_`, 1-63 bytes each, none starting
/// with `-`. The guest's proxy refuses other names itself (a clearer error for the
/// program), and the host checks the same rule.
pub fn is_valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= DIAL_HOST_MAX_BYTES
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Longest note of a `ProxyRefused`.
pub const PROXY_NOTE_MAX_BYTES: usize = 512;

/// How a dial ended, as the host answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DialOutcome {
    /// Connected: the channel now carries the stream.
    Connected {
        /// The address actually dialled (`ip:port`).
        address: String,
    },
    /// Not connected; the channel is gone on the host side.
    Refused {
        /// Why, as a kind.
        kind: DialRefusal,
        /// Why, for a person (also in the host's egress log).
        message: String,
    },
}

/// Why a dial was refused. Append, never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DialRefusal {
    /// The allowlist does not allow the name, the port or the address dialled.
    Denied,
    /// The name did not resolve.
    Resolve,
    /// Every allowed address refused or timed out.
    Connect,
    /// The VM has no egress (`net: none`).
    EgressOff,
    /// [`MAX_EGRESS_CONNECTIONS`] are open, or the request was malformed.
    Invalid,
}

impl DialRefusal {
    /// The HTTP status the proxy answers a program with.
    pub fn http_status(self) -> (u16, &'static str) {
        match self {
            Self::Denied | Self::EgressOff => (403, "Forbidden"),
            Self::Resolve | Self::Connect => (502, "Bad Gateway"),
            Self::Invalid => (503, "Service Unavailable"),
        }
    }
}
