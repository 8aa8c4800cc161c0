//! The command-line flags of claim-time builds, one `clap::Args` flattened into
//! every front end that runs an engine (`sandboxd`, `sandbox-mcp`, `sandboxctl`), so
//! the flags are spelled, documented and validated once.

use std::path::PathBuf;

use super::{RegistryPolicy, DEFAULT_BUILDER};

/// Claims by image reference.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RegistryArgs {
    /// A registry (HOST or HOST:PORT; docker.io for Docker Hub) a claim naming an image
    /// reference the node does not hold may build its template from (repeatable).
    /// None by default: such claims are refused with the command that builds it.
    #[arg(
        long = "allow-registry",
        env = "SANDBOX_ALLOW_REGISTRY",
        value_delimiter = ',',
        value_name = "HOST[:PORT]"
    )]
    pub allow_registry: Vec<String>,
    /// A registry spoken to over plain HTTP by claim-time builds (repeatable); all
    /// others only over HTTPS.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    pub insecure_registry: Vec<String>,
    /// The template builder claim-time builds run (default: sandbox-rootfs beside
    /// this program, else on PATH).
    #[arg(
        long = "rootfs-builder",
        env = "SANDBOX_ROOTFS_BUILDER",
        value_name = "PROGRAM"
    )]
    pub rootfs_builder: Option<PathBuf>,
}

/// A flag's value is no registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?} is not HOST or HOST:PORT")]
pub struct RegistryArgError {
    /// The flag.
    pub flag: &'static str,
    /// Its value.
    pub value: String,
}

impl RegistryArgs {
    /// The validated policy.
    pub fn policy(&self) -> Result<RegistryPolicy, RegistryArgError> {
        let hosts = |flag: &'static str, values: &[String]| {
            values
                .iter()
                .map(|value| {
                    let host = value.trim().to_ascii_lowercase();
                    if valid_host(&host) {
                        Ok(host)
                    } else {
                        Err(RegistryArgError {
                            flag,
                            value: value.clone(),
                        })
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let program = self
            .rootfs_builder
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BUILDER));
        Ok(RegistryPolicy {
            allow: hosts("--allow-registry", &self.allow_registry)?,
            insecure: hosts("--insecure-registry", &self.insecure_registry)?,
            builder: sandbox_vmm::launcher::relay_daemon::resolve(&program),
        })
    }
}

/// `HOST` or `HOST:PORT`: letters, digits, `.`, `-`, and at most one `:` before a port.
fn valid_host(text: &str) -> bool {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        && port.is_none_or(|port| port.parse::<u16>().is_ok_and(|p| p != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_hosts_with_an_optional_port() {
        for good in [
            "docker.io",
            "127.0.0.1:5000",
            "Ghcr.IO",
            "registry-1.example",
        ] {
            assert!(valid_host(&good.to_ascii_lowercase()), "{good}");
        }
        for bad in ["", ":5000", "h:0", "h:x", "https://h", "h/p", "h:1:2"] {
            assert!(!valid_host(bad), "{bad}");
        }
        let args = RegistryArgs {
            allow_registry: vec!["Docker.IO".into()],
            ..RegistryArgs::default()
        };
        assert_eq!(args.policy().unwrap().allow, ["docker.io"]);
        let bad = RegistryArgs {
            insecure_registry: vec!["http://x".into()],
            ..RegistryArgs::default()
        };
        assert!(bad
            .policy()
            .unwrap_err()
            .to_string()
            .contains("--insecure-registry"));
    }
}
