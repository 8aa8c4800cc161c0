//! Configuration in two stages: the command line ([`Args`], parsed by clap with
//! environment fallbacks) and the validated [`Config`] the server runs on.
//!
//! | flag | variable | default |
//! | --- | --- | --- |
//! | `--addr HOST:PORT` (`-addr`) | `SANDBOXD_ADDR`; `SANDSTORM_URL` (sandstorm) | none: the engine runs in-process; with a token only, `127.0.0.1:7777` (`http://127.0.0.1:8889` for sandstorm) |
//! | `--token TOKEN` (`-token`) | `SANDBOXD_TOKEN`; `SANDSTORM_TOKEN` (sandstorm); `SANDBOX_TOKEN` (with `--agent`) | none |
//! | `--template NAME` (`-template`) | `SANDBOX_TEMPLATE`; `SANDBOXD_TEMPLATE` (node) | `default`; the node's own default |
//! | `--http-timeout SECS` | `SANDSTORM_HTTP_TIMEOUT` (sandstorm) | `60` |
//! | `--pool N` | `SANDBOX_POOL` | `1` |
//! | `--max-sandboxes N` | `SANDBOX_MAX` | `8` |
//! | `--agent URL` | `SANDBOX_AGENT` | none (launch microVMs) |
//! | `--sandbox-home DIR` | `SANDBOX_HOME` | `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox` |
//! | `--boot-timeout SECS` | `SANDBOX_BOOT_TIMEOUT` | `60` |
//! | `--max-fork-count N` | `SANDBOX_MAX_FORK_COUNT` | `16` |
//! | `--profile NAME` | `SANDBOX_MCP_PROFILE` | `sandstorm` when a `SANDSTORM_*` variable is set, else `default` |
//! | `--egress-allow ENTRY` (repeatable) | `SANDBOX_EGRESS_ALLOW` (comma-separated) | none: `net: egress` is refused |
//! | `--host-dir PATH` (repeatable) | none | none: no host file tools |
//! | `--host-max-bytes N` | none | 4 GiB |
//!
//! The node's variables, seed 000's and seed 001's, are resolved in [`node`]; the
//! flags the seeds spell with one dash are rewritten by [`node::normalize_argv`]
//! before clap sees them ([`Args::parse_normalized`]).
//!
//! The launcher's own variables (`SANDBOX_RUN_DIR`, `SANDBOX_ACCEL`, `SANDBOX_QEMU`,
//! `SANDBOX_QEMU_IMG`, `SANDBOX_VHOST_VSOCK`) are read through the environment lookup
//! handed to [`Config::from_args`], never from deep inside the crate.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use sandbox_vmm::client::UrlError;
use sandbox_vmm::launcher::snapshot::MAX_BRANCH;
use sandbox_vmm::launcher::{self, LauncherConfig, TemplateRef};

use crate::host::{HostDirs, HostError, DEFAULT_HOST_MAX_BYTES};

pub mod node;

pub use node::NodeConfig;

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
    /// The node daemon (sandboxd) to drive instead of running the engine in this
    /// process: HOST:PORT or http(s)://HOST:PORT. Falls back to SANDBOXD_ADDR
    /// (SANDSTORM_URL under --profile sandstorm). Without an address and without a
    /// token the sandboxes run here (no daemon needed); with a token only, the
    /// address is 127.0.0.1:7777 (http://127.0.0.1:8889 for sandstorm). Seed 000's
    /// spellings -addr, -token, -template work too.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// Template used when `create_sandbox` names none (a name under
    /// SANDBOX_HOME/templates, or a path) [env: SANDBOX_TEMPLATE; with a node:
    /// SANDBOXD_TEMPLATE] [default: "default"; with a node: the node's default].
    /// A node refuses a template it does not hold.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
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
    /// The node's operator token (Authorization: Bearer) [env: SANDBOXD_TOKEN;
    /// sandstorm: SANDSTORM_TOKEN]; with --agent, the shared secret the attached
    /// agent requires [env: SANDBOX_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Seconds one control-plane request to the node may take [env:
    /// SANDSTORM_HTTP_TIMEOUT under --profile sandstorm] [default: 60].
    #[arg(long = "http-timeout", value_name = "SECS")]
    pub http_timeout_secs: Option<u64>,
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
    /// arguments and per-sandbox tokens (not with --agent). Unset: "sandstorm" when
    /// a SANDSTORM_* variable is set, else "default"; SANDBOXD_* and SANDSTORM_*
    /// variables together are refused.
    #[arg(long, env = "SANDBOX_MCP_PROFILE", value_enum, value_name = "NAME")]
    pub profile: Option<Profile>,
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
    /// Claims by image reference (`--allow-registry`, ...), for the sandboxes run
    /// here; a node has its own.
    #[command(flatten)]
    pub registry: sandbox_engine::image_build::RegistryArgs,
}

/// What the server runs on, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where sandboxes come from: this process's engine, or a node daemon.
    pub backing: Backing,
    /// The tool set.
    pub profile: Profile,
    /// The host directories the host file tools may use (opened once).
    pub host: Arc<HostDirs>,
    /// The sandbox home on this machine (`--sandbox-home`, `SANDBOX_HOME`, else the
    /// XDG default), where the ids of ended sessions are kept; `None` when it cannot
    /// be found (no `HOME`), which only costs that record.
    pub home: Option<PathBuf>,
}

/// Where sandboxes come from.
#[derive(Debug, Clone)]
pub enum Backing {
    /// The engine in this process: microVMs launched here, or an attached agent.
    /// Boxed: the launcher's configuration is large, and this is built once.
    Embedded(Box<Mode>),
    /// A node daemon (`sandboxd`) over HTTP.
    Node(NodeConfig),
}

impl Config {
    /// The embedded engine's mode, if this configuration runs one.
    pub fn mode(&self) -> Option<&Mode> {
        match &self.backing {
            Backing::Embedded(mode) => Some(mode.as_ref()),
            Backing::Node(_) => None,
        }
    }
}

impl Args {
    /// The process's arguments with seed 000's single-dash flags rewritten (see
    /// [`node::normalize_argv`]), parsed; exits with clap's message when they are
    /// wrong, as `Args::parse` does.
    pub fn parse_normalized() -> Self {
        Self::parse_from(node::normalize_argv(std::env::args_os(), takes_value))
    }

    /// [`Args::parse_normalized`] over `argv` (the program name first), for tests.
    pub fn try_parse_normalized<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        Self::try_parse_from(node::normalize_argv(
            argv.into_iter().map(Into::into),
            takes_value,
        ))
    }
}

/// Whether the long flag `name` takes a value.
fn takes_value(name: &str) -> bool {
    Args::command()
        .get_arguments()
        .find(|arg| arg.get_long() == Some(name))
        .is_some_and(|arg| arg.get_action().takes_values())
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
    /// An `--allow-registry` or `--insecure-registry` is no registry.
    #[error(transparent)]
    Registry(#[from] sandbox_engine::image_build::args::RegistryArgError),
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
    /// `--addr` (or a node variable's address) is no address.
    #[error("Invalid node address {addr:?}: use HOST:PORT or http(s)://HOST:PORT")]
    NodeAddr {
        /// As given.
        addr: String,
        /// Why it does not parse.
        #[source]
        error: UrlError,
    },
    /// `--http-timeout` or `SANDSTORM_HTTP_TIMEOUT` is not a positive number.
    #[error("The HTTP timeout must be a whole number of seconds, at least 1, not {0:?}")]
    HttpTimeout(String),
    /// `--agent` with `--addr`.
    #[error("--agent attaches one agent and --addr drives a node daemon: leave out one of them")]
    AgentAndNode,
    /// Seed 000's and seed 001's variables at once.
    #[error(
        "Both seeds' variables are set: {cocoon} (sandbox-mcp's node, the default tool set) \
         and {sandstorm} (sandstorm's controller and tool set). Unset {sandstorm} to drive \
         the node with the default tools, or unset {cocoon} for the sandstorm tools"
    )]
    BothSeeds {
        /// The `SANDBOXD_*` variables set.
        cocoon: String,
        /// The `SANDSTORM_*` variables set.
        sandstorm: String,
    },
    /// `--profile default` with `SANDSTORM_*` variables.
    #[error(
        "{0} is set, which selects sandstorm's tool set, but --profile (or \
         SANDBOX_MCP_PROFILE) asks for the default one: unset {0}, or pass --profile \
         sandstorm"
    )]
    SandstormVarsWithDefault(String),
    /// `--profile sandstorm` with `SANDBOXD_*` variables.
    #[error(
        "{0} is set, which configures the default tool set's node, but --profile \
         sandstorm reads SANDSTORM_URL and SANDSTORM_TOKEN instead: unset {0} (and set \
         the SANDSTORM_* ones), or leave out --profile sandstorm"
    )]
    CocoonVarsWithSandstorm(String),
}

impl Config {
    /// Validates `args`; `env` looks up the node's and the launcher's environment
    /// variables (pass `std::env::var_os` from `main`).
    pub fn from_args(
        args: Args,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let resolved = node::resolve(
            node::NodeInputs {
                addr: args.addr.clone(),
                token: args.token.clone(),
                template: args.template.clone(),
                http_timeout_secs: args.http_timeout_secs,
                profile: args.profile,
                attach: args.agent.is_some(),
            },
            &env,
        )?;
        let profile = resolved.profile;
        if !args.host_dirs.is_empty() && profile == Profile::Sandstorm {
            return Err(ConfigError::SandstormHostDir);
        }
        if args.host_max_bytes == 0 {
            return Err(ConfigError::HostMaxBytes);
        }
        if args.http_timeout_secs == Some(0) {
            return Err(ConfigError::HttpTimeout("0".to_owned()));
        }
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
        });
        let home_root = launcher
            .as_ref()
            .ok()
            .map(|launcher| launcher.home.root().to_path_buf());
        let host = Arc::new(
            HostDirs::open(&args.host_dirs, args.host_max_bytes).map_err(ConfigError::HostDir)?,
        );
        if let Some(node) = resolved.node {
            return Ok(Self {
                backing: Backing::Node(node),
                profile,
                host,
                home: home_root,
            });
        }
        if let Some(url) = &args.agent {
            let url = url.parse().map_err(ConfigError::AgentUrl)?;
            if profile == Profile::Sandstorm {
                return Err(ConfigError::SandstormAttached);
            }
            return Ok(Self {
                backing: Backing::Embedded(Box::new(Mode::Attach(AttachConfig {
                    url,
                    token: resolved.attach_token,
                }))),
                profile,
                host,
                home: home_root,
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
        let template = resolved
            .embedded_template
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
        if template.trim().is_empty() {
            return Err(ConfigError::EmptyTemplate);
        }
        if !(1..=MAX_BRANCH).contains(&args.max_fork_count) {
            return Err(ConfigError::MaxForkCount(args.max_fork_count));
        }
        let egress_allow = sandbox_vmm::egress::Allowlist::parse(&args.egress_allow)
            .map_err(ConfigError::EgressAllow)?;
        let registry = args.registry.policy()?;
        let launcher = launcher.map_err(ConfigError::Launcher)?;
        Ok(Self {
            backing: Backing::Embedded(Box::new(Mode::Launch(LaunchConfig {
                launcher,
                template: TemplateRef::parse(template.trim()),
                pool: args.pool,
                max_sandboxes: args.max_sandboxes,
                boot_timeout: Duration::from_secs(args.boot_timeout_secs),
                max_fork_count: args.max_fork_count,
                egress_allow,
                owner: sandbox_engine::config::OwnerKind::Embedded,
                registry,
            }))),
            profile,
            host,
            home: home_root,
        })
    }
}

/// The template of an embedded engine that is told none.
pub const DEFAULT_TEMPLATE: &str = "default";

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_vmm::client::AgentUrl;

    fn parse(argv: &[&str]) -> Args {
        let mut full = vec!["sandbox-mcp"];
        full.extend_from_slice(argv);
        Args::try_parse_normalized(full).unwrap()
    }

    fn env(name: &str) -> Option<OsString> {
        (name == "HOME").then(|| "/home/u".into())
    }

    #[test]
    fn defaults_launch_the_default_template_with_a_pool_of_one() {
        let config = Config::from_args(parse(&["--sandbox-home", "/s"]), env).unwrap();
        let Some(Mode::Launch(launch)) = config.mode() else {
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
        let Some(Mode::Attach(attach)) = config.mode() else {
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

    fn with_vars(
        vars: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<OsString> {
        move |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(*value))
                .or_else(|| env(name))
        }
    }

    fn node_of(config: &Config) -> &NodeConfig {
        match &config.backing {
            Backing::Node(node) => node,
            Backing::Embedded(_) => panic!("expected a node"),
        }
    }

    #[test]
    fn seed_000s_arguments_as_written_drive_a_node() {
        let config = Config::from_args(
            parse(&["-addr", "10.0.0.5:7777", "-token", "t0k", "-template", "rt"]),
            env,
        )
        .unwrap();
        assert_eq!(config.profile, Profile::Default);
        let node = node_of(&config);
        assert_eq!(node.base, "http://10.0.0.5:7777");
        assert_eq!(node.token.as_deref(), Some("t0k"));
        assert_eq!(node.template.as_deref(), Some("rt"));
        assert_eq!(node.http_timeout, Duration::from_secs(60));
    }

    #[test]
    fn seed_000s_variables_and_fallback_address() {
        let vars = with_vars(&[("SANDBOXD_ADDR", "h:1"), ("SANDBOXD_TOKEN", "v")]);
        let config = Config::from_args(parse(&[]), vars).unwrap();
        assert_eq!(node_of(&config).base, "http://h:1");
        assert_eq!(node_of(&config).token.as_deref(), Some("v"));
        assert_eq!(node_of(&config).template, None, "the node's default");
        // A token without an address: the seed's 127.0.0.1:7777.
        let config = Config::from_args(parse(&["--token", "x"]), env).unwrap();
        assert_eq!(node_of(&config).base, "http://127.0.0.1:7777");
        let vars = with_vars(&[("SANDBOXD_TOKEN", "x"), ("SANDBOXD_TEMPLATE", "py")]);
        let config = Config::from_args(parse(&[]), vars).unwrap();
        assert_eq!(node_of(&config).base, "http://127.0.0.1:7777");
        assert_eq!(node_of(&config).template.as_deref(), Some("py"));
        // The flag wins over the variable.
        let vars = with_vars(&[("SANDBOXD_ADDR", "h:1")]);
        let config = Config::from_args(parse(&["--addr", "g:2"]), vars).unwrap();
        assert_eq!(node_of(&config).base, "http://g:2");
    }

    #[test]
    fn no_address_and_no_token_run_the_engine_here() {
        let config = Config::from_args(parse(&[]), env).unwrap();
        assert!(matches!(config.mode(), Some(Mode::Launch(_))));
        // SANDBOX_TOKEN is the attached agent's secret, not a node's.
        let vars = with_vars(&[("SANDBOX_TOKEN", "a")]);
        let config = Config::from_args(parse(&[]), vars).unwrap();
        assert!(matches!(config.mode(), Some(Mode::Launch(_))));
        let vars = with_vars(&[("SANDBOX_TEMPLATE", "python")]);
        let config = Config::from_args(parse(&[]), vars).unwrap();
        let Some(Mode::Launch(launch)) = config.mode() else {
            panic!("expected launch mode");
        };
        assert_eq!(launch.template, TemplateRef::Name("python".into()));
    }

    #[test]
    fn sandstorms_variables_choose_its_profile_and_controller() {
        let vars = with_vars(&[
            ("SANDSTORM_URL", "http://127.0.0.1:9999"),
            ("SANDSTORM_TOKEN", "s"),
            ("SANDSTORM_HTTP_TIMEOUT", "5"),
        ]);
        let config = Config::from_args(parse(&[]), vars).unwrap();
        assert_eq!(config.profile, Profile::Sandstorm);
        let node = node_of(&config);
        assert_eq!(node.base, "http://127.0.0.1:9999");
        assert_eq!(node.token.as_deref(), Some("s"));
        assert_eq!(node.http_timeout, Duration::from_secs(5));
        // Seed 001's smoke test: only the token, the default URL.
        let vars = with_vars(&[("SANDSTORM_TOKEN", "s")]);
        let config = Config::from_args(parse(&["--profile", "sandstorm"]), vars).unwrap();
        assert_eq!(node_of(&config).base, "http://127.0.0.1:8889");
        // --profile sandstorm alone still runs the engine here.
        let config = Config::from_args(parse(&["--profile", "sandstorm"]), env).unwrap();
        assert!(matches!(config.backing, Backing::Embedded(_)));
    }

    #[test]
    fn mixed_or_contradicting_configuration_is_refused_saying_what_to_drop() {
        let both = with_vars(&[("SANDBOXD_ADDR", "h:1"), ("SANDSTORM_URL", "http://h:2")]);
        let error = Config::from_args(parse(&[]), both).unwrap_err().to_string();
        assert!(
            error.contains("Unset SANDSTORM_URL") && error.contains("unset SANDBOXD_ADDR"),
            "{error}"
        );
        let sandstorm = with_vars(&[("SANDSTORM_URL", "http://h:2")]);
        let error = Config::from_args(parse(&["--profile", "default"]), sandstorm)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unset SANDSTORM_URL"), "{error}");
        let cocoon = with_vars(&[("SANDBOXD_TOKEN", "t")]);
        let error = Config::from_args(parse(&["--profile", "sandstorm"]), cocoon)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unset SANDBOXD_TOKEN"), "{error}");
        let bad = |argv: &[&str]| Config::from_args(parse(argv), env).unwrap_err().to_string();
        assert!(bad(&["--addr", "h:1", "--agent", "unix:///a"]).contains("--agent"));
        assert!(bad(&["--addr", "ftp://x"]).contains("Invalid node address"));
        assert!(bad(&["--addr", "h:1", "--http-timeout", "0"]).contains("timeout"));
        let slow = with_vars(&[
            ("SANDSTORM_URL", "http://h:2"),
            ("SANDSTORM_HTTP_TIMEOUT", "soon"),
        ]);
        let error = Config::from_args(parse(&[]), slow).unwrap_err().to_string();
        assert!(error.contains("\"soon\""), "{error}");
    }
}
