//! Where the sandboxes live: in this process (the embedded engine) or on a node
//! daemon (`sandboxd`), and the spellings of the two seeds' configurations.
//!
//! Seed 000 (cocoon) starts its MCP server as `sandbox-mcp -addr HOST:PORT -token T
//! -template NAME`, Go's flag spellings, falling back to `SANDBOXD_ADDR`,
//! `SANDBOXD_TOKEN`, `SANDBOXD_TEMPLATE`, then `127.0.0.1:7777`. Seed 001
//! (sandstorm) reads `SANDSTORM_URL` (default `http://127.0.0.1:8889`), the bearer
//! `SANDSTORM_TOKEN` and `SANDSTORM_HTTP_TIMEOUT` (seconds, default 60). Both run
//! here unchanged; what differs from the seeds is the case of no configuration at
//! all: with neither an address nor a token the server runs the engine in-process
//! (one machine needs no daemon); a token without an address means the seed's
//! default address.

use std::ffi::OsString;
use std::time::Duration;

use sandbox_vmm::node_api::node_base;

use super::{ConfigError, Profile};

/// Seed 000's address when a token is given without one.
pub const DEFAULT_NODE_ADDR: &str = "127.0.0.1:7777";

/// Seed 001's controller URL when a token is given without one.
pub const DEFAULT_SANDSTORM_URL: &str = "http://127.0.0.1:8889";

/// Seed 001's per-request timeout, in seconds.
pub const DEFAULT_HTTP_TIMEOUT_SECS: u64 = 60;

/// The flags that seed 000 spells with one dash (Go's `flag` package): `-addr X`,
/// `-addr=X`, and the same for the others.
const GO_FLAGS: [&str; 3] = ["addr", "token", "template"];

/// A node daemon to drive, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// `http(s)://HOST:PORT`, no trailing slash (and `?ca=PEM` for a CA to trust).
    pub base: String,
    /// The operator's bearer token.
    pub token: Option<String>,
    /// The template claims use when a tool names none; `None` for the node's default.
    pub template: Option<String>,
    /// Bound on one control-plane request (the data plane's calls have their own).
    pub http_timeout: Duration,
}

/// Rewrites seed 000's single-dash long flags (`-addr`, `-token`, `-template`, also
/// with `=VALUE`) into clap's double-dash ones; everything else, values included,
/// passes as it is. A value that happens to look like such a flag (`--token
/// -addr`) stays a value: the argument after a flag that takes one is skipped.
pub fn normalize_argv(
    argv: impl IntoIterator<Item = OsString>,
    takes_value: impl Fn(&str) -> bool,
) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut value_next = false;
    let mut rest = false;
    for arg in argv {
        if rest || value_next || out.is_empty() {
            value_next = false;
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            rest = true;
            out.push(arg);
            continue;
        }
        let rewritten = match text.strip_prefix('-') {
            Some(flag) if !flag.starts_with('-') => {
                let name = flag.split_once('=').map_or(flag, |(name, _)| name);
                GO_FLAGS.contains(&name).then(|| format!("-{text}"))
            }
            _ => None,
        };
        let long = rewritten.as_deref().unwrap_or(text);
        if let Some(flag) = long.strip_prefix("--") {
            value_next = !flag.contains('=') && takes_value(flag);
        }
        out.push(rewritten.map_or(arg, OsString::from));
    }
    out
}

/// What the command line and the environment say about a node, before checking.
#[derive(Debug, Default)]
pub(super) struct NodeInputs {
    /// `--addr`.
    pub addr: Option<String>,
    /// `--token`.
    pub token: Option<String>,
    /// `--template`.
    pub template: Option<String>,
    /// `--http-timeout`.
    pub http_timeout_secs: Option<u64>,
    /// `--profile` (or `SANDBOX_MCP_PROFILE`), when given.
    pub profile: Option<Profile>,
    /// Whether `--agent` (or `SANDBOX_AGENT`) was given.
    pub attach: bool,
}

/// The profile, and the node to drive if there is one.
#[derive(Debug)]
pub(super) struct Resolved {
    pub profile: Profile,
    pub node: Option<NodeConfig>,
    /// The token for attach mode (`--token`, else `SANDBOX_TOKEN`).
    pub attach_token: Option<String>,
    /// The template for the embedded engine (`--template`, else `SANDBOX_TEMPLATE`).
    pub embedded_template: Option<String>,
}

/// A variable's value; empty counts as unset, as a shell's `VAR=` means.
fn var(env: &impl Fn(&str) -> Option<OsString>, name: &str) -> Option<String> {
    env(name)
        .map(|value| value.to_string_lossy().trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// Picks the profile and the node: the variables of one seed choose its profile when
/// `--profile` is not given; both seeds' variables at once are refused, naming which
/// to drop.
pub(super) fn resolve(
    inputs: NodeInputs,
    env: &impl Fn(&str) -> Option<OsString>,
) -> Result<Resolved, ConfigError> {
    let cocoon: Vec<&str> = ["SANDBOXD_ADDR", "SANDBOXD_TOKEN", "SANDBOXD_TEMPLATE"]
        .into_iter()
        .filter(|name| var(env, name).is_some())
        .collect();
    let sandstorm: Vec<&str> = ["SANDSTORM_URL", "SANDSTORM_TOKEN", "SANDSTORM_HTTP_TIMEOUT"]
        .into_iter()
        .filter(|name| var(env, name).is_some())
        .collect();
    if !cocoon.is_empty() && !sandstorm.is_empty() {
        return Err(ConfigError::BothSeeds {
            cocoon: cocoon.join(", "),
            sandstorm: sandstorm.join(", "),
        });
    }
    let profile = match inputs.profile {
        Some(Profile::Default) if !sandstorm.is_empty() => {
            return Err(ConfigError::SandstormVarsWithDefault(sandstorm.join(", ")))
        }
        Some(Profile::Sandstorm) if !cocoon.is_empty() => {
            return Err(ConfigError::CocoonVarsWithSandstorm(cocoon.join(", ")))
        }
        Some(profile) => profile,
        None if !sandstorm.is_empty() => Profile::Sandstorm,
        None => Profile::Default,
    };
    let env_token = |name| var(env, name);
    let (addr, token, template, timeout, default_addr) = match profile {
        Profile::Default => (
            inputs.addr.clone().or_else(|| var(env, "SANDBOXD_ADDR")),
            inputs.token.clone().or_else(|| env_token("SANDBOXD_TOKEN")),
            inputs
                .template
                .clone()
                .or_else(|| var(env, "SANDBOXD_TEMPLATE")),
            inputs.http_timeout_secs,
            DEFAULT_NODE_ADDR,
        ),
        Profile::Sandstorm => {
            let timeout = match (inputs.http_timeout_secs, var(env, "SANDSTORM_HTTP_TIMEOUT")) {
                (Some(secs), _) => Some(secs),
                (None, Some(text)) => Some(
                    text.parse::<u64>()
                        .map_err(|_| ConfigError::HttpTimeout(text.clone()))?,
                ),
                (None, None) => None,
            };
            (
                inputs.addr.clone().or_else(|| var(env, "SANDSTORM_URL")),
                inputs
                    .token
                    .clone()
                    .or_else(|| env_token("SANDSTORM_TOKEN")),
                inputs.template.clone(),
                timeout,
                DEFAULT_SANDSTORM_URL,
            )
        }
    };
    let token = token.filter(|token| !token.is_empty());
    let embedded_template = inputs
        .template
        .clone()
        .or_else(|| var(env, "SANDBOX_TEMPLATE"));
    let attach_token = inputs
        .token
        .clone()
        .or_else(|| var(env, "SANDBOX_TOKEN"))
        .filter(|token| !token.is_empty());
    if inputs.attach {
        if inputs.addr.is_some() {
            return Err(ConfigError::AgentAndNode);
        }
        return Ok(Resolved {
            profile,
            node: None,
            attach_token,
            embedded_template,
        });
    }
    // No address and no token: this process runs the engine.
    let addr = match (addr, &token) {
        (Some(addr), _) => addr,
        (None, Some(_)) => default_addr.to_owned(),
        (None, None) => {
            return Ok(Resolved {
                profile,
                node: None,
                attach_token,
                embedded_template,
            })
        }
    };
    let secs = timeout.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    if secs == 0 {
        return Err(ConfigError::HttpTimeout("0".to_owned()));
    }
    let template = template
        .map(|template| template.trim().to_owned())
        .filter(|template| !template.is_empty());
    Ok(Resolved {
        profile,
        node: Some(NodeConfig {
            base: base_url(&addr)?,
            token,
            template,
            http_timeout: Duration::from_secs(secs),
        }),
        attach_token,
        embedded_template,
    })
}

/// `HOST:PORT` (seed 000) or `http(s)://HOST[:PORT][?ca=PEM]` (seed 001) as the
/// base URL of the node's API, checked by the client's own rule
/// ([`sandbox_vmm::node_api::node_base`]).
pub fn base_url(addr: &str) -> Result<String, ConfigError> {
    let (base, ca) = node_base(addr).map_err(|error| ConfigError::NodeAddr {
        addr: addr.trim().to_owned(),
        error,
    })?;
    Ok(match ca {
        Some(ca) => format!("{base}?ca={}", ca.display()),
        None => base,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        let full = std::iter::once("sandbox-mcp")
            .chain(args.iter().copied())
            .map(OsString::from);
        normalize_argv(full, |flag| {
            matches!(flag, "addr" | "token" | "template" | "pool")
        })
        .into_iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
    }

    #[test]
    fn seed_000s_go_spellings_become_long_flags() {
        assert_eq!(
            argv(&["-addr", "10.0.0.5:7777", "-token", "t", "-template=rt"]),
            [
                "sandbox-mcp",
                "--addr",
                "10.0.0.5:7777",
                "--token",
                "t",
                "--template=rt"
            ]
        );
        assert_eq!(argv(&["-addr=h:1"]), ["sandbox-mcp", "--addr=h:1"]);
    }

    #[test]
    fn values_and_other_flags_are_left_alone() {
        // A token that looks like a flag is the value of the flag before it.
        assert_eq!(
            argv(&["-token", "-addr", "--pool", "-template"]),
            ["sandbox-mcp", "--token", "-addr", "--pool", "-template"]
        );
        assert_eq!(argv(&["-h"]), ["sandbox-mcp", "-h"]);
        assert_eq!(argv(&["-addresses"]), ["sandbox-mcp", "-addresses"]);
        assert_eq!(argv(&["--", "-addr"]), ["sandbox-mcp", "--", "-addr"]);
    }

    #[test]
    fn addresses_become_base_urls() {
        assert_eq!(base_url("10.0.0.5:7777").unwrap(), "http://10.0.0.5:7777");
        assert_eq!(base_url("http://h:1/").unwrap(), "http://h:1");
        assert_eq!(base_url("https://[::1]:9").unwrap(), "https://[::1]:9");
        assert!(base_url("ftp://x").is_err());
        assert!(base_url("user@h:1").is_err());
    }
}
