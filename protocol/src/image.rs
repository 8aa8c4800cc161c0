//! What a template tells the agent inside it, in a JSON file of the image
//! ([`IMAGE_CONFIG_PATH`]): the defaults of an OCI image's config (`Env`,
//! `WorkingDir`, `User`) for every process the agent starts, and the interpreter
//! sessions to start at boot.

use serde::{Deserialize, Serialize};

use crate::eval::WarmSession;

/// Where the image builder writes [`ImageConfig`] and where an agent that is the
/// guest's init reads it (a missing file means every default).
pub const IMAGE_CONFIG_PATH: &str = "/etc/sandbox/image.json";

/// Defaults baked into a template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// Variables every exec, spawn, pty and session starts with, after the agent's
    /// own defaults and before the request's (which win). `NAME=value` pairs, in order.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// The working directory of a process whose request names none.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Who a process runs as when its request names no one: a user name or a
    /// number, optionally `:group` as in an OCI config.
    #[serde(default)]
    pub user: Option<String>,
    /// Sessions started at boot.
    #[serde(default)]
    pub sessions: Vec<WarmSession>,
}
