//! The launcher's configuration and where its defaults come from.
//!
//! [`LauncherConfig::new`] takes the sandbox home and fills in defaults;
//! [`LauncherConfig::from_env`] is the one place that reads environment variables,
//! meant for the command-line front end:
//!
//! | variable | field | default |
//! | --- | --- | --- |
//! | `SANDBOX_HOME` | `home` | `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox` (relative values are ignored) |
//! | `SANDBOX_RUN_DIR` | `run_root` | `SANDBOX_HOME/run` |
//! | `SANDBOX_ACCEL` | `accel` | `auto` (`auto`, `kvm` or `tcg`) |
//! | `SANDBOX_QEMU` | `qemu_path` | `qemu-system-x86_64` on `PATH` |
//! | `SANDBOX_QEMU_IMG` | `qemu_img_path` | `qemu-img` on `PATH` |
//! | `SANDBOX_VHOST_VSOCK` | `vhost_path` | `vhost-device-vsock` on `PATH` |
//! | `SANDBOX_RELAY` | `relay_path` | `sandbox-relay` next to the running program, else on `PATH` |
//! | `SANDBOX_CHECKPOINT_DIR` | `checkpoint_root` | `SANDBOX_HOME/checkpoints` |
//! | `SANDBOX_RAM_DIR` | `ram_dir` | `/dev/shm` (a tmpfs: RAM files of serial-transport VMs) |
//! | `SANDBOX_TRANSPORT` | `transport` | `serial` (`serial` or `vsock`) |

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use sandbox_rootfs::{PathsError, SandboxHome};

use super::accel::{AccelMode, UnknownAccelMode, KVM_PROBE_TIMEOUT_SECS};

/// Everything the launcher needs to know about the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherConfig {
    /// Root of templates, caches and run folders.
    pub home: SandboxHome,
    /// Where per-VM run folders go. Unix socket paths inside must stay under 108
    /// bytes, so keep it short.
    pub run_root: PathBuf,
    /// `qemu-system-x86_64`.
    pub qemu_path: PathBuf,
    /// `qemu-img`, for disk overlays.
    pub qemu_img_path: PathBuf,
    /// `vhost-device-vsock`.
    pub vhost_path: PathBuf,
    /// `sandbox-relay` (see `relay_daemon::resolve` for how a bare name is found).
    pub relay_path: PathBuf,
    /// A tmpfs folder for the guest RAM of serial-transport VMs (checkpoints copy it).
    pub ram_dir: PathBuf,
    /// Where checkpoints are kept (on a disk: they outlive reboots).
    pub checkpoint_root: PathBuf,
    /// How VMs are reached unless a boot says otherwise.
    pub transport: AgentTransport,
    /// KVM, TCG, or probe.
    pub accel: AccelMode,
    /// The KVM device.
    pub kvm_device: PathBuf,
    /// Bound on the quick KVM boot in `auto` mode.
    pub kvm_probe_timeout: Duration,
    /// The host TSC frequency for `tsc_early_khz`; `None` detects it.
    pub tsc_khz: Option<u32>,
}

/// The environment could not be turned into a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither `SANDBOX_HOME`, `XDG_DATA_HOME` nor `HOME` is an absolute path.
    #[error(transparent)]
    Home(#[from] PathsError),
    /// `SANDBOX_ACCEL` is not a mode.
    #[error("Invalid SANDBOX_ACCEL")]
    Accel(#[source] UnknownAccelMode),
    /// `SANDBOX_TRANSPORT` is not a transport.
    #[error("Invalid SANDBOX_TRANSPORT")]
    Transport(#[source] UnknownTransport),
}

/// How the host reaches a VM's agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentTransport {
    /// The link over one virtio-serial port, behind a per-VM `sandbox-relay`, with
    /// guest RAM in a tmpfs file: the VM can be checkpointed, forked and hibernated.
    #[default]
    Serial,
    /// virtio-vsock through `vhost-device-vsock`: what other VMMs offer; such a VM
    /// cannot be snapshotted (vhost-user-vsock blocks migration).
    Vsock,
}

impl AgentTransport {
    /// `serial` or `vsock`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serial => "serial",
            Self::Vsock => "vsock",
        }
    }
}

impl std::fmt::Display for AgentTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transport name that is neither `serial` nor `vsock`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("Unknown transport {0:?} (expected serial or vsock)")]
pub struct UnknownTransport(String);

impl std::str::FromStr for AgentTransport {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "serial" => Ok(Self::Serial),
            "vsock" => Ok(Self::Vsock),
            other => Err(UnknownTransport(other.to_owned())),
        }
    }
}

impl LauncherConfig {
    /// Defaults for everything but the sandbox home.
    pub fn new(home: SandboxHome) -> Self {
        Self {
            run_root: home.run(),
            checkpoint_root: home.root().join(super::snapshot::CHECKPOINTS_DIR),
            home,
            qemu_path: PathBuf::from("qemu-system-x86_64"),
            qemu_img_path: PathBuf::from("qemu-img"),
            vhost_path: PathBuf::from("vhost-device-vsock"),
            relay_path: PathBuf::from(super::relay_daemon::RELAY_PROGRAM),
            ram_dir: PathBuf::from("/dev/shm"),
            transport: AgentTransport::default(),
            accel: AccelMode::Auto,
            kvm_device: PathBuf::from("/dev/kvm"),
            kvm_probe_timeout: Duration::from_secs(KVM_PROBE_TIMEOUT_SECS),
            tsc_khz: None,
        }
    }

    /// Reads the variables in the module docs.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`LauncherConfig::from_env`] over any variable lookup (testable).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self, ConfigError> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        // The image builder's rule, so both find the same folder.
        let mut config = Self::new(SandboxHome::from_vars(&var)?);
        if let Some(dir) = set("SANDBOX_RUN_DIR") {
            config.run_root = dir.into();
        }
        if let Some(mode) = set("SANDBOX_ACCEL") {
            config.accel = mode.to_string_lossy().parse().map_err(ConfigError::Accel)?;
        }
        if let Some(path) = set("SANDBOX_QEMU") {
            config.qemu_path = path.into();
        }
        if let Some(path) = set("SANDBOX_QEMU_IMG") {
            config.qemu_img_path = path.into();
        }
        if let Some(path) = set("SANDBOX_VHOST_VSOCK") {
            config.vhost_path = path.into();
        }
        if let Some(path) = set("SANDBOX_RELAY") {
            config.relay_path = path.into();
        }
        if let Some(path) = set("SANDBOX_CHECKPOINT_DIR") {
            config.checkpoint_root = path.into();
        }
        if let Some(path) = set("SANDBOX_RAM_DIR") {
            config.ram_dir = path.into();
        }
        if let Some(transport) = set("SANDBOX_TRANSPORT") {
            config.transport = transport
                .to_string_lossy()
                .parse()
                .map_err(ConfigError::Transport)?;
        }
        Ok(config)
    }

    /// `SANDBOX_HOME/templates`.
    pub fn templates_root(&self) -> PathBuf {
        self.home.templates()
    }

    /// `SANDBOX_HOME/cache/accel.json`.
    pub fn accel_cache_file(&self) -> PathBuf {
        self.home.cache().join("accel.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn home_falls_back_from_sandbox_home_to_xdg_to_home() {
        let c = LauncherConfig::from_vars(vars(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.home.root(), Path::new("/h/.local/share/sandbox"));
        assert_eq!(c.run_root, Path::new("/h/.local/share/sandbox/run"));
        let c =
            LauncherConfig::from_vars(vars(&[("HOME", "/h"), ("XDG_DATA_HOME", "/x")])).unwrap();
        assert_eq!(c.home.root(), Path::new("/x/sandbox"));
        let c = LauncherConfig::from_vars(vars(&[("XDG_DATA_HOME", "/x"), ("SANDBOX_HOME", "/s")]))
            .unwrap();
        assert_eq!(c.home.root(), Path::new("/s"));
        assert_eq!(c.templates_root(), Path::new("/s/templates"));
        assert_eq!(c.accel_cache_file(), Path::new("/s/cache/accel.json"));
        assert!(matches!(
            LauncherConfig::from_vars(vars(&[])),
            Err(ConfigError::Home(PathsError::NoHome))
        ));
    }

    #[test]
    fn overrides_apply_and_a_bad_accel_is_refused() {
        let c = LauncherConfig::from_vars(vars(&[
            ("SANDBOX_HOME", "/s"),
            ("SANDBOX_ACCEL", "tcg"),
            ("SANDBOX_RUN_DIR", "/r"),
            ("SANDBOX_QEMU", "/q"),
            ("SANDBOX_TRANSPORT", "vsock"),
            ("SANDBOX_RAM_DIR", "/m"),
        ]))
        .unwrap();
        assert_eq!(c.transport, AgentTransport::Vsock);
        assert_eq!(c.ram_dir, Path::new("/m"));
        assert_eq!(c.accel, AccelMode::Tcg);
        assert_eq!(c.run_root, Path::new("/r"));
        assert_eq!(c.qemu_path, Path::new("/q"));
        let err =
            LauncherConfig::from_vars(vars(&[("SANDBOX_HOME", "/s"), ("SANDBOX_ACCEL", "x")]));
        assert!(matches!(err, Err(ConfigError::Accel(_))));
        let err = LauncherConfig::from_vars(vars(&[
            ("SANDBOX_HOME", "/s"),
            ("SANDBOX_TRANSPORT", "tcp"),
        ]));
        assert!(matches!(err, Err(ConfigError::Transport(_))));
    }
}
