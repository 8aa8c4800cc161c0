//! What a node runs on, validated by its front end: where sandboxes come from
//! ([`Mode`]), and the limits of each.

use std::time::Duration;

use sandbox_vmm::client::AgentUrl;
use sandbox_vmm::launcher::{self, LauncherConfig, TemplateRef};

pub use crate::record::OwnerKind;

/// Most live sandboxes a node may be configured for.
pub const MAX_SANDBOXES_LIMIT: usize = 256;

/// Default bound on one VM boot, from QEMU's start to the agent's `Ready`.
pub const DEFAULT_BOOT_TIMEOUT_SECS: u64 = launcher::DEFAULT_READY_TIMEOUT_SECS;

/// Default of the fork limit: the most children one `fork` makes.
pub const DEFAULT_MAX_FORK_COUNT: usize = 16;

/// The id the attached agent gets in attach mode.
pub const ATTACHED_ID: &str = "attached";

/// The TTL `ttl_seconds: 0` means.
pub const DEFAULT_TTL_SECS: u64 = 60 * 60;

/// The longest TTL a claim may ask for.
pub const MAX_TTL_SECS: u64 = 24 * 60 * 60;

/// Where sandboxes come from.
// Built once per node: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mode {
    /// One already-running agent, exposed as the pre-claimed sandbox [`ATTACHED_ID`].
    Attach(AttachConfig),
    /// MicroVMs booted by this node.
    Launch(LaunchConfig),
}

/// Attach mode.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    /// The agent.
    pub url: AgentUrl,
    /// Its shared secret.
    pub token: Option<String>,
}

/// Launch mode.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// How VMs are booted.
    pub launcher: LauncherConfig,
    /// The template used when a claim names none.
    pub template: TemplateRef,
    /// Warm VMs to keep booted.
    pub pool: usize,
    /// Most VMs at once (claimed, warm and booting).
    pub max_sandboxes: usize,
    /// Bound on one boot.
    pub boot_timeout: Duration,
    /// Most children one fork makes.
    pub max_fork_count: usize,
    /// The operator's egress allowlist: what any sandbox with `net: egress` may reach
    /// at most (a sandbox's `allow` narrows it). Empty: egress is refused.
    pub egress_allow: sandbox_vmm::egress::Allowlist,
    /// Who holds the VMs: [`OwnerKind::Node`] (a daemon) boots them detached, so they
    /// outlive the process and its next start re-adopts the claimed ones;
    /// [`OwnerKind::Embedded`] VMs end with the process.
    pub owner: OwnerKind,
    /// Claims by image reference: which registries a claim may build a template
    /// from, and with which builder.
    pub registry: crate::image_build::RegistryPolicy,
}
