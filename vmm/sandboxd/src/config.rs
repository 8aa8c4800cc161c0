//! Configuration in two stages: the command line ([`Args`], parsed by clap with
//! environment fallbacks) and the validated [`Config`] the daemon runs on.
//!
//! | flag | variable | default |
//! | --- | --- | --- |
//! | `--listen ADDR` | `SANDBOXD_LISTEN` | `127.0.0.1:7777` |
//! | `--token-file FILE` | `SANDBOXD_TOKEN_FILE` | `$SANDBOX_HOME/sandboxd/token`, made at first start |
//! | `--advertise ADDR` | `SANDBOXD_ADVERTISE` | the listen address |
//! | `--tls-cert FILE`, `--tls-key FILE` | `SANDBOXD_TLS_CERT`, `SANDBOXD_TLS_KEY` | none: plain HTTP |
//! | `--insecure-listen` | none | off: a non-loopback address without TLS is refused |
//! | `--attach URL`, `--attach-token-file FILE` | none | off: boot microVMs |
//! | `--template NAME` | `SANDBOX_TEMPLATE` | `default` |
//! | `--pool N` | `SANDBOX_POOL` | `1` |
//! | `--max-sandboxes N` | `SANDBOX_MAX` | `8` |
//! | `--sandbox-home DIR` | `SANDBOX_HOME` | `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox` |
//! | `--boot-timeout SECS` | `SANDBOX_BOOT_TIMEOUT` | `60` |
//! | `--max-fork-count N` | `SANDBOX_MAX_FORK_COUNT` | `16` |
//! | `--egress-allow ENTRY` (repeatable) | `SANDBOX_EGRESS_ALLOW` (comma-separated) | none |
//! | `--allow-registry HOST[:PORT]` (repeatable) | `SANDBOX_ALLOW_REGISTRY` (comma-separated) | none: claims by image reference are not built |
//! | `--insecure-registry HOST:PORT` (repeatable) | none | none: registries over HTTPS only |
//! | `--rootfs-builder PROGRAM` | `SANDBOX_ROOTFS_BUILDER` | `sandbox-rootfs` beside sandboxd, else on `PATH` |
//! | `--etcd URL[,URL...]` | `SANDBOXD_ETCD` | none: a single node, no fleet |
//! | `--etcd-prefix PREFIX` | `SANDBOXD_ETCD_PREFIX` | `/sandbox` |
//! | `--node-id ID` | `SANDBOXD_NODE_ID` | a random id kept in `$SANDBOX_HOME/sandboxd/node-id` |
//! | `--lease-ttl SECS` | `SANDBOXD_LEASE_TTL` | `5` |
//! | `--store s3://BUCKET/PREFIX` | `SANDBOXD_STORE` | none: checkpoints stay on this node |
//! | `--store-endpoint URL` | `AWS_ENDPOINT_URL` | AWS's endpoint for the region |
//! | `--store-region REGION` | `AWS_REGION`, else `AWS_DEFAULT_REGION` | `us-east-1` |
//! | `--store-path-style BOOL` | `SANDBOXD_STORE_PATH_STYLE` | `true`: `ENDPOINT/BUCKET/KEY` (`false`: virtual-hosted) |
//! | `--store-allow-http` | `SANDBOXD_STORE_ALLOW_HTTP` | off: HTTPS only, unless the endpoint is `http://` on loopback |
//! | `--store-access-key-id ID` | `AWS_ACCESS_KEY_ID` | none: the AWS provider chain (instance metadata, ...) |
//! | `--store-secret-access-key KEY` | `AWS_SECRET_ACCESS_KEY` | none (needed with an access key id) |
//! | `--store-session-token TOKEN` | `AWS_SESSION_TOKEN` | none |
//!
//! The launcher's own variables (`SANDBOX_RUN_DIR`, `SANDBOX_ACCEL`, ...) are read
//! through the environment lookup handed to [`Config::from_args`].

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sandbox_engine::config::{
    AttachConfig, LaunchConfig, Mode, DEFAULT_BOOT_TIMEOUT_SECS, DEFAULT_MAX_FORK_COUNT,
    MAX_SANDBOXES_LIMIT,
};
use sandbox_fleet::store::{Credentials, StoreConfig};
use sandbox_vmm::launcher::snapshot::MAX_BRANCH;
use sandbox_vmm::launcher::{self, LauncherConfig, TemplateRef};

/// The address sandboxd listens on by default (seed 000's port).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7777";

/// The node daemon: microVM sandboxes behind an HTTP API.
///
/// Claimed sandboxes belong to the node, not to the daemon's process: a daemon
/// stopped with SIGTERM stops its warm VMs and leaves claimed sandboxes running (or
/// hibernated); one killed outright leaves both. The next start on the same
/// SANDBOX_HOME re-adopts the claimed ones (same ids, tokens, deadlines, processes
/// and files) and stops the warm ones. `sandboxd stop-all` stops everything.
#[derive(Debug, Parser)]
#[command(name = "sandboxd", version, about, long_about)]
pub struct Args {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address to listen on. A non-loopback address needs TLS (--tls-cert and
    /// --tls-key) or, behind a TLS proxy of your own, --insecure-listen: the API
    /// carries tokens.
    #[arg(long, env = "SANDBOXD_LISTEN", default_value = DEFAULT_LISTEN, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// File holding the operator token (mode 0600 or stricter). Default:
    /// $SANDBOX_HOME/sandboxd/token, made with a random token at first start.
    #[arg(long = "token-file", env = "SANDBOXD_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The address clients are told to reach this node at (`owner_addr`).
    #[arg(long, env = "SANDBOXD_ADVERTISE", value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(
        long = "tls-cert",
        env = "SANDBOXD_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); needs --tls-cert.
    #[arg(
        long = "tls-key",
        env = "SANDBOXD_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Listen on a non-loopback address without TLS.
    #[arg(long = "insecure-listen")]
    pub insecure_listen: bool,
    /// Serve one already-running agent (unix://PATH, vsock://CID:PORT or
    /// hvsock://PATH:PORT) as the one sandbox "attached" instead of booting VMs:
    /// for an agent on this host outside any VM, and for tests.
    #[arg(long, value_name = "URL")]
    pub attach: Option<String>,
    /// File holding the attached agent's token (its first line).
    #[arg(long = "attach-token-file", value_name = "FILE", requires = "attach")]
    pub attach_token_file: Option<PathBuf>,
    /// Template claimed when a claim names none.
    #[arg(
        long,
        env = "SANDBOX_TEMPLATE",
        default_value = "default",
        value_name = "NAME"
    )]
    pub template: String,
    /// Booted VMs of the default template kept ready (0 disables the pool).
    #[arg(long, env = "SANDBOX_POOL", default_value_t = 1, value_name = "N")]
    pub pool: usize,
    /// Most VMs this node runs at once, warm ones included.
    #[arg(
        long = "max-sandboxes",
        env = "SANDBOX_MAX",
        default_value_t = 8,
        value_name = "N"
    )]
    pub max_sandboxes: usize,
    /// Root of templates, checkpoints and run folders.
    #[arg(long = "sandbox-home", env = "SANDBOX_HOME", value_name = "DIR")]
    pub sandbox_home: Option<PathBuf>,
    /// Seconds one VM boot may take.
    #[arg(long = "boot-timeout", env = "SANDBOX_BOOT_TIMEOUT", default_value_t = DEFAULT_BOOT_TIMEOUT_SECS, value_name = "SECS")]
    pub boot_timeout_secs: u64,
    /// Most children one fork may make.
    #[arg(long = "max-fork-count", env = "SANDBOX_MAX_FORK_COUNT", default_value_t = DEFAULT_MAX_FORK_COUNT, value_name = "N")]
    pub max_fork_count: usize,
    /// An egress allowlist entry (repeatable): the most a sandbox claimed with
    /// `net: egress` may reach. None: egress is refused.
    #[arg(
        long = "egress-allow",
        env = "SANDBOX_EGRESS_ALLOW",
        value_delimiter = ',',
        value_name = "ENTRY"
    )]
    pub egress_allow: Vec<String>,
    /// Claims by image reference (`--allow-registry`, ...).
    #[command(flatten)]
    pub registry: sandbox_engine::image_build::RegistryArgs,
    /// Fleet membership on etcd (`--etcd`, ...).
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Checkpoints in an object store (`--store`, ...).
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Checkpoints in an S3-compatible object store: uploaded after capture, downloaded
/// by a claim of one this node does not hold.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Keep checkpoints in this bucket, under this key prefix.
    #[arg(long, env = "SANDBOXD_STORE", value_name = "s3://BUCKET/PREFIX")]
    pub store: Option<String>,
    /// The endpoint of a store other than AWS S3 (MinIO, SeaweedFS, Ceph, R2, ...).
    #[arg(long = "store-endpoint", env = "AWS_ENDPOINT_URL", value_name = "URL")]
    pub store_endpoint: Option<String>,
    /// The store's region (else AWS_DEFAULT_REGION, else us-east-1).
    #[arg(long = "store-region", env = "AWS_REGION", value_name = "REGION")]
    pub store_region: Option<String>,
    /// Path-style requests (ENDPOINT/BUCKET/KEY); false for virtual-hosted ones.
    #[arg(
        long = "store-path-style",
        env = "SANDBOXD_STORE_PATH_STYLE",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub store_path_style: bool,
    /// Allow plain HTTP to the store (an http:// endpoint on loopback is allowed
    /// without it).
    #[arg(long = "store-allow-http", env = "SANDBOXD_STORE_ALLOW_HTTP")]
    pub store_allow_http: bool,
    /// The access key id (with --store-secret-access-key).
    #[arg(
        long = "store-access-key-id",
        env = "AWS_ACCESS_KEY_ID",
        value_name = "ID"
    )]
    pub store_access_key_id: Option<String>,
    /// The secret access key.
    #[arg(
        long = "store-secret-access-key",
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub store_secret_access_key: Option<String>,
    /// A session token, for temporary credentials.
    #[arg(
        long = "store-session-token",
        env = "AWS_SESSION_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub store_session_token: Option<String>,
}

/// Fleet membership: the node registers in etcd under a lease it keeps alive.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// etcd client URLs (comma-separated): join the fleet there.
    #[arg(long, env = "SANDBOXD_ETCD", value_delimiter = ',', value_name = "URL")]
    pub etcd: Vec<String>,
    /// The key prefix the fleet's records live under.
    #[arg(
        long = "etcd-prefix",
        env = "SANDBOXD_ETCD_PREFIX",
        default_value = "/sandbox",
        value_name = "PREFIX"
    )]
    pub etcd_prefix: String,
    /// This node's id in the fleet. Default: a random id made at first start and
    /// kept in $SANDBOX_HOME/sandboxd/node-id.
    #[arg(long = "node-id", env = "SANDBOXD_NODE_ID", value_name = "ID")]
    pub node_id: Option<String>,
    /// Seconds the node's records outlive it when it dies without leaving.
    #[arg(
        long = "lease-ttl",
        env = "SANDBOXD_LEASE_TTL",
        default_value_t = 5,
        value_name = "SECS"
    )]
    pub lease_ttl_secs: u64,
}

/// Fleet membership, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// The key prefix.
    pub prefix: String,
    /// The given node id (`None`: the one kept in the home).
    pub node_id: Option<String>,
    /// The lease's time to live.
    pub ttl: Duration,
    /// Where the default node id is kept.
    pub node_id_file: PathBuf,
}

/// A one-off action on the node's home instead of serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Subcommand)]
pub enum Command {
    /// Stop everything the node runs on this SANDBOX_HOME: asks a running daemon to
    /// stop (SIGTERM) and waits for it, then stops every sandbox it left (running or
    /// hibernated) and any warm VM, and removes their run folders.
    StopAll,
}

/// What the daemon runs on, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it listens.
    pub listen: SocketAddr,
    /// What claims report as `owner_addr`.
    pub advertise: String,
    /// The operator token's file; made when it is the default and missing.
    pub token_file: PathBuf,
    /// Whether `token_file` may be created.
    pub token_file_is_default: bool,
    /// HTTPS, when given a certificate.
    pub tls: Option<TlsFiles>,
    /// The engine's configuration.
    pub mode: Mode,
    /// Serve (`None`) or run a one-off command.
    pub command: Option<Command>,
    /// Fleet membership, when `--etcd` is given.
    pub fleet: Option<FleetConfig>,
    /// The object store, when `--store` is given.
    pub store: Option<StoreConfig>,
}

/// The certificate chain and key HTTPS is served with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the node's first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The command line does not make a valid configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A non-loopback address without TLS or `--insecure-listen`.
    #[error(
        "--listen {0} is not a loopback address and the API carries tokens: serve TLS \
         (--tls-cert FILE --tls-key FILE), or put a TLS proxy in front and pass \
         --insecure-listen, or listen on 127.0.0.1"
    )]
    NotLoopback(SocketAddr),
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
    /// `--attach` is not an agent URL.
    #[error("Invalid --attach URL")]
    AttachUrl(#[source] sandbox_vmm::client::UrlError),
    /// `--attach-token-file` cannot be read.
    #[error("Cannot read --attach-token-file {}", .0.display())]
    AttachToken(PathBuf, #[source] std::io::Error),
    /// An `--egress-allow` entry does not parse.
    #[error("Invalid --egress-allow")]
    EgressAllow(#[source] sandbox_vmm::egress::EntryError),
    /// An `--allow-registry` or `--insecure-registry` is no registry.
    #[error(transparent)]
    Registry(#[from] sandbox_engine::image_build::args::RegistryArgError),
    /// A fleet flag is out of range.
    #[error("{0}")]
    Fleet(&'static str),
    /// A store flag is wrong.
    #[error("{0}")]
    Store(String),
}

impl Config {
    /// Validates `args`; `env` looks up the launcher's variables.
    pub fn from_args(
        args: Args,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let tls = match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        };
        if !args.listen.ip().is_loopback() && !args.insecure_listen && tls.is_none() {
            return Err(ConfigError::NotLoopback(args.listen));
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
        let registry = args.registry.policy()?;
        if let Some(home) = &args.sandbox_home {
            if !home.is_absolute() {
                return Err(ConfigError::RelativeHome(home.clone()));
            }
        }
        let home = args.sandbox_home.clone();
        let launcher = LauncherConfig::from_vars(|name| match (name, &home) {
            ("SANDBOX_HOME", Some(home)) => Some(home.clone().into_os_string()),
            _ => env(name),
        })
        .map_err(ConfigError::Launcher)?;
        let (token_file, token_file_is_default) = match args.token_file {
            Some(file) => (file, false),
            None => (launcher.home.root().join("sandboxd").join("token"), true),
        };
        let fleet = fleet_config(&args.fleet, launcher.home.root())?;
        let store = store_config(&args.store, &env)?;
        if store.is_some() && args.attach.is_some() {
            return Err(ConfigError::Store(
                "--store needs microVMs: an attached agent has no checkpoints".to_owned(),
            ));
        }
        let mode = match &args.attach {
            Some(url) => Mode::Attach(AttachConfig {
                url: url.parse().map_err(ConfigError::AttachUrl)?,
                token: match &args.attach_token_file {
                    Some(file) => std::fs::read_to_string(file)
                        .map_err(|error| ConfigError::AttachToken(file.clone(), error))?
                        .lines()
                        .next()
                        .map(|line| line.trim().to_owned())
                        .filter(|token| !token.is_empty()),
                    None => None,
                },
            }),
            None => Mode::Launch(LaunchConfig {
                launcher,
                template: TemplateRef::parse(args.template.trim()),
                pool: args.pool,
                max_sandboxes: args.max_sandboxes,
                boot_timeout: Duration::from_secs(args.boot_timeout_secs),
                max_fork_count: args.max_fork_count,
                egress_allow,
                owner: sandbox_engine::config::OwnerKind::Node,
                registry,
            }),
        };
        Ok(Self {
            fleet,
            store,
            command: args.command,
            listen: args.listen,
            advertise: advertised(args.advertise, args.listen, tls.is_some()),
            token_file,
            token_file_is_default,
            tls,
            mode,
        })
    }
}

/// `--etcd` and its companions, checked; `None` without `--etcd`.
fn fleet_config(
    args: &FleetArgs,
    home: &std::path::Path,
) -> Result<Option<FleetConfig>, ConfigError> {
    let endpoints: Vec<String> = args
        .etcd
        .iter()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
        .collect();
    if endpoints.is_empty() {
        return Ok(None);
    }
    if !(1..=3600).contains(&args.lease_ttl_secs) {
        return Err(ConfigError::Fleet(
            "--lease-ttl must be between 1 and 3600 seconds",
        ));
    }
    if !args.etcd_prefix.starts_with('/') {
        return Err(ConfigError::Fleet("--etcd-prefix must start with /"));
    }
    let node_id = args.node_id.as_deref().map(str::trim).map(str::to_owned);
    if let Some(id) = &node_id {
        if id.is_empty() || id.contains('/') {
            return Err(ConfigError::Fleet(
                "--node-id must be non-empty and hold no /",
            ));
        }
    }
    Ok(Some(FleetConfig {
        endpoints,
        prefix: args.etcd_prefix.clone(),
        node_id,
        ttl: Duration::from_secs(args.lease_ttl_secs),
        node_id_file: home.join("sandboxd").join("node-id"),
    }))
}

/// `--store` and its companions, checked; `None` without `--store`.
fn store_config(
    args: &StoreArgs,
    env: &impl Fn(&str) -> Option<OsString>,
) -> Result<Option<StoreConfig>, ConfigError> {
    let Some(url) = args
        .store
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
    else {
        return Ok(None);
    };
    let (bucket, prefix) =
        StoreConfig::parse_url(url).map_err(|why| ConfigError::Store(format!("--store: {why}")))?;
    let endpoint = args
        .store_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned);
    let mut allow_http = args.store_allow_http;
    if let Some(endpoint) = &endpoint {
        let Some(rest) = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
        else {
            return Err(ConfigError::Store(format!(
                "--store-endpoint {endpoint:?} must start with http:// or https://"
            )));
        };
        if endpoint.starts_with("http://") && !allow_http {
            let host = rest.split('/').next().unwrap_or_default();
            let host = host.rsplit_once(':').map_or(host, |(host, _)| host);
            let loopback = host == "localhost"
                || host
                    .trim_matches(|c| c == '[' || c == ']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(ConfigError::Store(format!(
                    "--store-endpoint {endpoint} is plain HTTP to another host and carries \
                     credentials: use https://, or pass --store-allow-http"
                )));
            }
            allow_http = true;
        }
    }
    let region = args
        .store_region
        .clone()
        .or_else(|| env("AWS_DEFAULT_REGION").map(|r| r.to_string_lossy().into_owned()))
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "us-east-1".to_owned());
    let credentials = match (&args.store_access_key_id, &args.store_secret_access_key) {
        (Some(id), Some(secret)) => Some(Credentials {
            access_key_id: id.clone(),
            secret_access_key: secret.clone(),
            session_token: args.store_session_token.clone(),
        }),
        (None, None) => None,
        _ => {
            return Err(ConfigError::Store(
                "--store-access-key-id and --store-secret-access-key go together \
                 (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
                    .to_owned(),
            ))
        }
    };
    Ok(Some(StoreConfig {
        bucket,
        prefix,
        endpoint,
        region,
        path_style: args.store_path_style,
        allow_http,
        credentials,
    }))
}

/// What claims report as `owner_addr`: `--advertise`, else the listen address; on
/// TLS, an address without a scheme is `https://`, so clients and peers that read
/// it never send a token to this node in the clear.
fn advertised(given: Option<String>, listen: std::net::SocketAddr, tls: bool) -> String {
    let addr = given.unwrap_or_else(|| listen.to_string());
    if tls && !addr.contains("://") {
        format!("https://{addr}")
    } else {
        addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(argv: &[&str]) -> Result<Config, ConfigError> {
        let mut full = vec!["sandboxd", "--sandbox-home", "/s"];
        full.extend_from_slice(argv);
        Config::from_args(Args::try_parse_from(full).unwrap(), |_| None)
    }

    #[test]
    fn defaults_listen_on_loopback_port_7777_with_a_token_in_the_home() {
        let config = config(&[]).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.advertise, DEFAULT_LISTEN);
        assert_eq!(config.token_file, PathBuf::from("/s/sandboxd/token"));
        assert!(config.token_file_is_default);
    }

    #[test]
    fn a_public_address_needs_the_insecure_flag() {
        let refused = config(&["--listen", "0.0.0.0:7777"]).unwrap_err();
        assert!(
            refused.to_string().contains("--insecure-listen"),
            "{refused}"
        );
        assert!(config(&["--listen", "0.0.0.0:7777", "--insecure-listen"]).is_ok());
        let tls = config(&[
            "--listen",
            "0.0.0.0:7777",
            "--tls-cert",
            "/c.pem",
            "--tls-key",
            "/k.pem",
        ])
        .unwrap();
        assert_eq!(
            tls.tls,
            Some(TlsFiles {
                cert: "/c.pem".into(),
                key: "/k.pem".into()
            })
        );
        let half = Args::try_parse_from(["sandboxd", "--tls-cert", "/c.pem"]);
        assert!(half.is_err(), "a certificate without its key is refused");
    }

    #[test]
    fn a_node_on_tls_advertises_https() {
        let tls = ["--tls-cert", "/c.pem", "--tls-key", "/k.pem"];
        let listen = ["--listen", "0.0.0.0:7777"];
        let both = [&listen[..], &tls[..]].concat();
        assert_eq!(config(&both).unwrap().advertise, "https://0.0.0.0:7777");
        let named = [&both[..], &["--advertise", "node-1.internal:7777"][..]].concat();
        assert_eq!(
            config(&named).unwrap().advertise,
            "https://node-1.internal:7777"
        );
        let given = [&both[..], &["--advertise", "https://node-1:7777"][..]].concat();
        assert_eq!(config(&given).unwrap().advertise, "https://node-1:7777");
        assert_eq!(config(&[]).unwrap().advertise, DEFAULT_LISTEN);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let bad = |argv: &[&str]| config(argv).unwrap_err().to_string();
        assert!(bad(&["--max-sandboxes", "0"]).contains("--max-sandboxes"));
        assert!(bad(&["--pool", "9"]).contains("--pool"));
        assert!(bad(&["--boot-timeout", "0"]).contains("--boot-timeout"));
        assert!(bad(&["--template", " "]).contains("--template"));
        assert!(bad(&["--max-fork-count", "0"]).contains("--max-fork-count"));
        assert!(bad(&["--etcd", "http://e:2379", "--lease-ttl", "0"]).contains("--lease-ttl"));
        assert!(bad(&["--etcd", "http://e:2379", "--node-id", "a/b"]).contains("--node-id"));
    }

    #[test]
    fn etcd_urls_join_the_fleet_with_a_node_id_kept_in_the_home() {
        assert_eq!(config(&[]).unwrap().fleet, None);
        let fleet = config(&["--etcd", "http://a:2379,http://b:2379"])
            .unwrap()
            .fleet
            .unwrap();
        assert_eq!(fleet.endpoints, vec!["http://a:2379", "http://b:2379"]);
        assert_eq!(fleet.prefix, "/sandbox");
        assert_eq!(fleet.ttl, Duration::from_secs(5));
        assert_eq!(fleet.node_id_file, PathBuf::from("/s/sandboxd/node-id"));
    }

    #[test]
    fn a_store_url_with_an_endpoint_and_keys_makes_a_store_config() {
        assert_eq!(config(&[]).unwrap().store, None);
        let store = config(&[
            "--store",
            "s3://ckpt/fleet/a",
            "--store-endpoint",
            "http://127.0.0.1:8333",
            "--store-access-key-id",
            "id",
            "--store-secret-access-key",
            "secret",
        ])
        .unwrap()
        .store
        .unwrap();
        assert_eq!(
            (store.bucket.as_str(), store.prefix.as_str()),
            ("ckpt", "fleet/a")
        );
        assert_eq!(store.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(store.region, "us-east-1");
        assert!(store.path_style);
        // Plain HTTP to loopback is allowed without the flag.
        assert!(store.allow_http);
        assert_eq!(store.credentials.unwrap().access_key_id, "id");
    }

    #[test]
    fn bad_store_flags_are_refused_with_the_flag_named() {
        let bad = |argv: &[&str]| config(argv).unwrap_err().to_string();
        assert!(bad(&["--store", "ckpt/x"]).contains("--store"));
        assert!(
            bad(&["--store", "s3://ckpt", "--store-endpoint", "ftp://h"])
                .contains("--store-endpoint")
        );
        assert!(bad(&[
            "--store",
            "s3://ckpt",
            "--store-endpoint",
            "http://10.0.0.1:9000"
        ])
        .contains("--store-allow-http"));
        assert!(config(&[
            "--store",
            "s3://ckpt",
            "--store-endpoint",
            "http://10.0.0.1:9000",
            "--store-allow-http"
        ])
        .is_ok());
        assert!(
            bad(&["--store", "s3://ckpt", "--store-access-key-id", "id"])
                .contains("--store-secret-access-key")
        );
    }
}
