//! Configuration in stages: command-line [`Args`] (plus, as PID 1, the kernel's
//! `sandbox.*` parameters) into one validated [`Config`].

use std::time::Duration;

use clap::Parser;
use sandbox_protocol::limits::{FORGET_EXITED_AFTER_SECS, HOST_CID};

use crate::init::BootParams;
use crate::server::{ListenAddr, PeerPolicy, VSOCK_CID_ANY};

/// Command-line arguments of `sandbox-agent`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sandbox-agent",
    version,
    about = "In-guest agent of a sandbox microVM"
)]
pub struct Args {
    /// Where to listen (repeatable): `unix://PATH`, `vsock://CID:PORT` (CID -1 = any),
    /// `serial://PORT_NAME` (the link on a virtio-serial port) or `link+unix://PATH`
    /// (the link for a host relay). As PID 1 the default is `vsock://-1:PORT` with
    /// `sandbox.port` from the kernel command line (1024), or `serial://NAME` with
    /// `sandbox.serial`.
    #[arg(long = "listen", value_name = "URL")]
    pub listen: Vec<ListenAddr>,
    /// Token clients must present in their Hello.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Forget exited processes this many seconds after they exit.
    #[arg(long, default_value_t = FORGET_EXITED_AFTER_SECS, value_name = "SECS")]
    pub forget_after_secs: u64,
    /// Accept vsock peers with this CID besides the host's (2) (repeatable).
    #[arg(long, value_name = "CID")]
    pub allow_cid: Vec<u32>,
    /// Log filter (`tracing` syntax, e.g. `debug` or `sandbox_agent=trace`); default
    /// `sandbox.log` from the kernel command line as PID 1, else `info`.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// The template's defaults and boot sessions (JSON, see `ImageConfig`); default
    /// `/etc/sandbox/image.json` as PID 1, none otherwise.
    #[arg(long, value_name = "PATH")]
    pub image_config: Option<std::path::PathBuf>,
}

/// Everything the agent needs to run, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listeners to bind.
    pub listen: Vec<ListenAddr>,
    /// Token clients must present.
    pub token: Option<String>,
    /// How long exited processes stay visible.
    pub forget_after: Duration,
    /// Which vsock peers may connect.
    pub peers: PeerPolicy,
    /// Whether the agent is the guest's init.
    pub is_init: bool,
    /// Log filter.
    pub log: String,
    /// Where the image's config is read from, if anywhere.
    pub image_config: Option<std::path::PathBuf>,
}

impl Config {
    /// Merges arguments with the boot parameters (PID 1 only); arguments win.
    pub fn new(args: Args, boot: Option<&BootParams>) -> Self {
        let mut listen = args.listen;
        if listen.is_empty() {
            if let Some(boot) = boot {
                listen.push(match &boot.serial {
                    Some(name) => ListenAddr::Serial(name.clone()),
                    None => ListenAddr::Vsock {
                        cid: VSOCK_CID_ANY,
                        port: boot.port,
                    },
                });
            }
        }
        let mut allowed_cids = vec![HOST_CID];
        allowed_cids.extend(args.allow_cid);
        allowed_cids.extend(boot.and_then(|b| b.allow_cid));
        Self {
            listen,
            token: args.token.or_else(|| boot.and_then(|b| b.token.clone())),
            forget_after: Duration::from_secs(args.forget_after_secs),
            peers: PeerPolicy { allowed_cids },
            is_init: boot.is_some(),
            log: args
                .log
                .or_else(|| boot.map(|b| b.log.clone()))
                .unwrap_or_else(|| "info".to_owned()),
            image_config: args.image_config.or_else(|| {
                boot.map(|_| std::path::PathBuf::from(sandbox_protocol::image::IMAGE_CONFIG_PATH))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid1_defaults_to_vsock_on_the_boot_port() {
        let args = Args::parse_from(["sandbox-agent"]);
        let boot = BootParams {
            port: 5000,
            token: Some("t".into()),
            ..BootParams::default()
        };
        let config = Config::new(args, Some(&boot));
        assert_eq!(
            config.listen,
            vec![ListenAddr::Vsock {
                cid: VSOCK_CID_ANY,
                port: 5000
            }]
        );
        assert_eq!(config.token.as_deref(), Some("t"));
        assert!(config.is_init);
    }

    #[test]
    fn arguments_win_over_boot_parameters() {
        let args = Args::parse_from([
            "sandbox-agent",
            "--listen",
            "unix:///tmp/x.sock",
            "--token",
            "a",
            "--log",
            "debug",
        ]);
        let boot = BootParams {
            token: Some("b".into()),
            log: "warn".into(),
            ..BootParams::default()
        };
        let config = Config::new(args, Some(&boot));
        assert_eq!(config.listen, vec![ListenAddr::Unix("/tmp/x.sock".into())]);
        assert_eq!(config.token.as_deref(), Some("a"));
        assert_eq!(config.log, "debug");
        let config = Config::new(Args::parse_from(["sandbox-agent"]), Some(&boot));
        assert_eq!(config.log, "warn");
    }
}
