//! Configuration in two stages: the command line ([`Args`], parsed by clap with
//! environment fallbacks) and the validated [`Config`] the server runs on.
//!
//! | flag | variable | default |
//! | --- | --- | --- |
//! | `--template NAME` | `SANDBOX_TEMPLATE` | `default` |
//! | `--pool N` | `SANDBOX_POOL` | `1` |
//! | `--max-sandboxes N` | `SANDBOX_MAX` | `8` |
//! | `--agent URL` | `SANDBOX_AGENT` | none (launch microVMs) |
//! | `--token TOKEN` | `SANDBOX_TOKEN` | none |
//! | `--sandbox-home DIR` | `SANDBOX_HOME` | `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox` |
//! | `--boot-timeout SECS` | `SANDBOX_BOOT_TIMEOUT` | `60` |
//! | `--max-fork-count N` | `SANDBOX_MAX_FORK_COUNT` | `16` |
//! | `--profile NAME` | `SANDBOX_MCP_PROFILE` | `default` |
//! | `--egress-allow ENTRY` (repeatable) | `SANDBOX_EGRESS_ALLOW` (comma-separated) | none: `net: egress` is refused |
//! | `--host-dir PATH` (repeatable) | none | none: no host file tools |
//! | `--host-max-bytes N` | none | 4 GiB |
//!
//! The launcher's own variables (`SANDBOX_RUN_DIR`, `SANDBOX_ACCEL`, `SANDBOX_QEMU`,
//! `SANDBOX_QEMU_IMG`, `SANDBOX_VHOST_VSOCK`) are read through the environment lookup
//! handed to [`Config::from_args`], never from deep inside the crate.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use sandbox_vmm::client::UrlError;
use sandbox_vmm::launcher::snapshot::MAX_BRANCH;
use sandbox_vmm::launcher::{self, LauncherConfig, TemplateRef};

use crate::host::{HostDirs, HostError, DEFAULT_HOST_MAX_BYTES};

pub use sandbox_engine::config::{
    AttachConfig, LaunchConfig, Mode, ATTACHED_ID, DEFAULT_BOOT_TIMEOUT_SECS,
    DEFAULT_MAX_FORK_COUNT, MAX_SANDBOXES_LIMIT,
};

/// The tool set the server offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// This project's tools (`create_sandbox`, `exec`, `fork`, ...).
    #[default]
    Default,
    /// sandstorm-mcp's tools, names and arguments (`spawn_sandboxes`,
    /// `exec_command`, ... with per-sandbox `sandbox_token`s), on the same engine.
    Sandstorm,
}

/// MCP server over stdio that exposes microVM sandboxes as tools.
#[derive(Debug, Parser)]
#[command(name = "sandbox-mcp", version, about)]
pub struct Args {
    /// Template booted when `create_sandbox` names none (a name under
    /// SANDBOX_HOME/templates, or a path).
    #[arg(
        long,
        env = "SANDBOX_TEMPLATE",
        default_value = "default",
        value_name = "NAME"
    )]
    pub template: String,
    /// Booted VMs of the default template and size kept ready, so claims take
    /// milliseconds (0 disables the pool).
    #[arg(long, env = "SANDBOX_POOL", default_value_t = 1, value_name = "N")]
    pub pool: usize,
    /// Most VMs this server runs at once, warm ones included.
    #[arg(
        long = "max-sandboxes",
        env = "SANDBOX_MAX",
        default_value_t = 8,
        value_name = "N"
    )]
    pub max_sandboxes: usize,
    /// Attach mode: expose this already-running agent as the one sandbox "attached"
    /// instead of booting VMs (unix://PATH, vsock://CID:PORT or hvsock://PATH:PORT).
    #[arg(long, env = "SANDBOX_AGENT", value_name = "URL")]
    pub agent: Option<String>,
    /// Shared secret the attached agent requires.
    #[arg(
        long,
        env = "SANDBOX_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Root of templates and run folders.
    #[arg(long = "sandbox-home", env = "SANDBOX_HOME", value_name = "DIR")]
    pub sandbox_home: Option<PathBuf>,
    /// Seconds one VM boot may take before it fails.
    #[arg(
        long = "boot-timeout",
        env = "SANDBOX_BOOT_TIMEOUT",
        default_value_t = DEFAULT_BOOT_TIMEOUT_SECS,
        value_name = "SECS"
    )]
    pub boot_timeout_secs: u64,
    /// Most children one `fork` call may make (each also needs room within
    /// --max-sandboxes).
    #[arg(
        long = "max-fork-count",
        env = "SANDBOX_MAX_FORK_COUNT",
        default_value_t = DEFAULT_MAX_FORK_COUNT,
        value_name = "N"
    )]
    pub max_fork_count: usize,
    /// The tool set: "default", or "sandstorm" for sandstorm-mcp's tool names,
    /// arguments and per-sandbox tokens (needs launch mode).
    #[arg(
        long,
        env = "SANDBOX_MCP_PROFILE",
        value_enum,
        default_value_t = Profile::Default,
        value_name = "NAME"
    )]
    pub profile: Profile,
    /// An egress allowlist entry (repeatable): the most any sandbox created with
    /// `net: egress` may reach; its own `allow` can only narrow it. `pypi.org:443`,
    /// `*.github.com`, `*`, `10.0.0.0/8`, `[::1]:8080`. None: egress is refused.
    #[arg(
        long = "egress-allow",
        env = "SANDBOX_EGRESS_ALLOW",
        value_delimiter = ',',
        value_name = "ENTRY"
    )]
    pub egress_allow: Vec<String>,
    /// A host directory that copy_from_host may read under and copy_to_host write
    /// under (repeat the flag for more). None by default: then the host file tools
    /// are not offered. Links leading out of it are never followed.
    #[arg(long = "host-dir", value_name = "PATH")]
    pub host_dirs: Vec<PathBuf>,
    /// The most bytes one copy_to_host writes on the host.
    #[arg(
        long = "host-max-bytes",
        default_value_t = DEFAULT_HOST_MAX_BYTES,
        value_name = "N"
    )]
    pub host_max_bytes: u64,
}

/// What the server runs on, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where sandboxes come from.
    pub mode: Mode,
    /// The tool set.
    pub profile: Profile,
    /// The host directories the host file tools may use (opened once).
    pub host: Arc<HostDirs>,
}

/// The command line does not make a valid configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--agent` is not an agent URL.
    #[error("Invalid --agent URL")]
    AgentUrl(#[source] UrlError),
    /// The launcher's environment is unusable.
    #[error("Invalid launcher environment")]
    Launcher(#[source] launcher::ConfigError),
    /// `--sandbox-home` is relative.
    #[error("--sandbox-home must be an absolute path, not {0:?}")]
    RelativeHome(PathBuf),
    /// `--max-sandboxes` is out of range.
    #[error("--max-sandboxes must be between 1 and {MAX_SANDBOXES_LIMIT}, not {0}")]
    MaxSandboxes(usize),
    /// The pool is larger than the VM limit.
    #[error("--pool ({pool}) cannot exceed --max-sandboxes ({max})")]
    PoolOverMax {
        /// `--pool`.
        pool: usize,
        /// `--max-sandboxes`.
        max: usize,
    },
    /// `--boot-timeout 0`.
    #[error("--boot-timeout must be at least 1 second")]
    BootTimeout,
    /// An empty `--template`.
    #[error("--template must not be empty")]
    EmptyTemplate,
    /// `--max-fork-count` is out of range.
    #[error("--max-fork-count must be between 1 and {MAX_BRANCH}, not {0}")]
    MaxForkCount(usize),
    /// `--profile sandstorm` with `--agent`.
    #[error(
        "--profile sandstorm spawns and branches sandboxes, which an attached agent \
         (--agent) cannot do: leave out one of them"
    )]
    SandstormAttached,
    /// An `--egress-allow` entry does not parse.
    #[error("Invalid --egress-allow")]
    EgressAllow(#[source] sandbox_vmm::egress::EntryError),
    /// A `--host-dir` that cannot be opened.
    #[error("Invalid --host-dir")]
    HostDir(#[source] HostError),
    /// `--host-dir` with `--profile sandstorm`, whose tool set has no host tools.
    #[error(
        "--host-dir adds the host file tools, which --profile sandstorm (seed 001's exact \
         tool set) does not offer: leave out one of them"
    )]
    SandstormHostDir,
    /// `--host-max-bytes 0`.
    #[error("--host-max-bytes must be at least 1")]
    HostMaxBytes,
}

impl Config {
    /// Validates `args`; `env` looks up the launcher's environment variables (pass
    /// `std::env::var_os` from `main`).
    pub fn from_args(
        args: Args,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        if !args.host_dirs.is_empty() && args.profile == Profile::Sandstorm {
            return Err(ConfigError::SandstormHostDir);
        }
        if args.host_max_bytes == 0 {
            return Err(ConfigError::HostMaxBytes);
        }
        let host = Arc::new(
            HostDirs::open(&args.host_dirs, args.host_max_bytes).map_err(ConfigError::HostDir)?,
        );
        if let Some(url) = &args.agent {
            let url = url.parse().map_err(ConfigError::AgentUrl)?;
            if args.profile == Profile::Sandstorm {
                return Err(ConfigError::SandstormAttached);
            }
            return Ok(Self {
                mode: Mode::Attach(AttachConfig {
                    url,
                    token: args.token.filter(|t| !t.is_empty()),
                }),
                profile: args.profile,
                host,
            });
        }
        if !(1..=MAX_SANDBOXES_LIMIT).contains(&args.max_sandboxes) {
            return Err(ConfigError::MaxSandboxes(args.max_sandboxes));
        }
        if args.pool > args.max_sandboxes {
            return Err(ConfigError::PoolOverMax {
                pool: args.pool,
                max: args.max_sandboxes,
            });
        }
        if args.boot_timeout_secs == 0 {
            return Err(ConfigError::BootTimeout);
        }
        if args.template.trim().is_empty() {
            return Err(ConfigError::EmptyTemplate);
        }
        if !(1..=MAX_BRANCH).contains(&args.max_fork_count) {
            return Err(ConfigError::MaxForkCount(args.max_fork_count));
        }
        let egress_allow = sandbox_vmm::egress::Allowlist::parse(&args.egress_allow)
            .map_err(ConfigError::EgressAllow)?;
        let home = args.sandbox_home.clone();
        if let Some(home) = &home {
            if !home.is_absolute() {
                return Err(ConfigError::RelativeHome(home.clone()));
            }
        }
        // The flag (or its SANDBOX_HOME fallback, which clap already applied) wins
        // over whatever the launcher would derive from XDG_DATA_HOME or HOME.
        let launcher = LauncherConfig::from_vars(|name| match (name, &home) {
            ("SANDBOX_HOME", Some(home)) => Some(home.clone().into_os_string()),
            _ => env(name),
        })
        .map_err(ConfigError::Launcher)?;
        Ok(Self {
            mode: Mode::Launch(LaunchConfig {
                launcher,
                template: TemplateRef::parse(args.template.trim()),
                pool: args.pool,
                max_sandboxes: args.max_sandboxes,
                boot_timeout: Duration::from_secs(args.boot_timeout_secs),
                max_fork_count: args.max_fork_count,
                egress_allow,
                owner: sandbox_engine::config::OwnerKind::Embedded,
            }),
            profile: args.profile,
            host,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_vmm::client::AgentUrl;

    fn parse(argv: &[&str]) -> Args {
        let mut full = vec!["sandbox-mcp"];
        full.extend_from_slice(argv);
        Args::try_parse_from(full).unwrap()
    }

    fn env(name: &str) -> Option<OsString> {
        (name == "HOME").then(|| "/home/u".into())
    }

    #[test]
    fn defaults_launch_the_default_template_with_a_pool_of_one() {
        let config = Config::from_args(parse(&["--sandbox-home", "/s"]), env).unwrap();
        let Mode::Launch(launch) = &config.mode else {
            panic!("expected launch mode");
        };
        assert_eq!(launch.template, TemplateRef::Name("default".into()));
        assert_eq!(launch.pool, 1);
        assert_eq!(launch.max_sandboxes, 8);
        assert_eq!(launch.max_fork_count, 16);
        assert_eq!(config.profile, Profile::Default);
        assert_eq!(launch.launcher.home.root(), PathBuf::from("/s"));
        assert_eq!(launch.launcher.run_root, PathBuf::from("/s/run"));
    }

    #[test]
    fn an_agent_url_selects_attach_mode() {
        let config = Config::from_args(
            parse(&["--agent", "unix:///tmp/a.sock", "--token", "s3"]),
            env,
        )
        .unwrap();
        let Mode::Attach(attach) = config.mode else {
            panic!("expected attach mode");
        };
        assert_eq!(attach.url, AgentUrl::Unix("/tmp/a.sock".into()));
        assert_eq!(attach.token.as_deref(), Some("s3"));
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let bad = |argv: &[&str]| Config::from_args(parse(argv), env).unwrap_err().to_string();
        assert!(bad(&["--agent", "tcp://x"]).contains("--agent"));
        assert!(bad(&["--max-sandboxes", "0"]).contains("--max-sandboxes"));
        assert!(bad(&["--pool", "5", "--max-sandboxes", "4"]).contains("--pool"));
        assert!(bad(&["--sandbox-home", "rel"]).contains("absolute"));
        assert!(bad(&["--boot-timeout", "0"]).contains("--boot-timeout"));
        assert!(bad(&["--template", " "]).contains("--template"));
        assert!(bad(&["--max-fork-count", "0"]).contains("--max-fork-count"));
        assert!(bad(&["--max-fork-count", "65"]).contains("--max-fork-count"));
        assert!(bad(&["--profile", "sandstorm", "--agent", "unix:///a"]).contains("--agent"));
        assert!(bad(&["--host-dir", "/nonexistent/x"]).contains("--host-dir"));
        assert!(bad(&["--profile", "sandstorm", "--host-dir", "/"]).contains("--host-dir"));
        assert!(bad(&["--host-max-bytes", "0"]).contains("--host-max-bytes"));
    }

    #[test]
    fn the_sandstorm_profile_is_chosen_by_flag_or_variable() {
        let config = Config::from_args(
            parse(&["--profile", "sandstorm", "--sandbox-home", "/s"]),
            env,
        )
        .unwrap();
        assert_eq!(config.profile, Profile::Sandstorm);
        assert!(Args::try_parse_from(["sandbox-mcp", "--profile", "forkd"]).is_err());
    }
}
