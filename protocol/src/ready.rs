//! The readiness message a guest agent sends to the host once it listens.
//!
//! The agent connects to the host (CID 2) on [`crate::limits::READY_VSOCK_PORT`] and
//! writes one frame holding a [`Ready`], then closes. Hosts wait for it instead of
//! polling the agent's port during boot.

use serde::{Deserialize, Serialize};

/// "The agent is listening."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// Must be [`crate::MAGIC`].
    pub magic: [u8; 4],
    /// The agent's protocol version.
    pub version: u32,
    /// The agent's crate version.
    pub agent_version: String,
    /// Random per boot of the agent.
    pub boot_id: String,
    /// Milliseconds since the guest kernel booted (`CLOCK_BOOTTIME`).
    pub uptime_ms: u64,
}
