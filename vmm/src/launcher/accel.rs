//! Choosing the accelerator: KVM where it really boots our kernel, else TCG.
//!
//! A usable `/dev/kvm` is not enough. Some hosts expose a nested "PVM" KVM that passes
//! every capability check yet cannot boot a stock kernel (QEMU aborts on an MSR with
//! `-cpu host`, or the guest hangs after real-mode setup). So in `auto` mode:
//! 1. **Preflight** with `kvm-ioctls`: open the device, check the API version and the
//!    capabilities QEMU's KVM microvm relies on, create (and drop) a VM. Cheap, not
//!    cached.
//! 2. **Quick boot**: the template's kernel under KVM, with the exact QEMU flags a real
//!    boot would use but no initramfs and no devices, must reach the kernel's "cannot
//!    mount root" panic (which `panic=-1` and `-no-reboot` turn into a QEMU exit)
//!    within [`KVM_PROBE_TIMEOUT_SECS`]. The verdict is cached per kernel path in
//!    `SANDBOX_HOME/cache/accel.json`, invalidated when the kernel file or the QEMU
//!    binary changes, so only the first boot of a kernel pays for it.
//!
//! `accel = kvm` skips the quick boot (preflight failures are errors); `accel = tcg`
//! skips both.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use kvm_ioctls::{Cap, Kvm};
use serde::{Deserialize, Serialize};

use super::process::{ChildProcess, Lifetime};
use super::qemu::{kernel_cmdline, qemu_args, QemuSpec};
use super::run_dir::{now_unix_ms, qemu_name, RunDir};
use super::size::Size;
use super::{CONSOLE_LOG, QEMU_LOG};

/// How long the quick KVM boot may take before KVM is judged unable to boot.
pub const KVM_PROBE_TIMEOUT_SECS: u64 = 5;

/// Guest memory for the quick boot: the smallest that boots the stock kernel.
const KVM_PROBE_MEMORY_MIB: u32 = 128;

/// What the console shows when the kernel got all the way to mounting a root.
const KVM_PROBE_MARKERS: [&str; 2] = ["Kernel panic", "VFS: "];

/// Capabilities QEMU's KVM accelerator needs for a microvm guest.
const REQUIRED_CAPS: [(Cap, &str); 6] = [
    (Cap::Irqchip, "IRQCHIP"),
    (Cap::UserMemory, "USER_MEMORY"),
    (Cap::SetTssAddr, "SET_TSS_ADDR"),
    (Cap::ExtCpuid, "EXT_CPUID"),
    (Cap::Pit2, "PIT2"),
    (Cap::AdjustClock, "ADJUST_CLOCK"),
];

/// The accelerator a VM runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// QEMU's software emulator.
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        })
    }
}

/// The configured choice: `auto` (probe), or a forced accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelMode {
    /// KVM if the preflight and the quick boot say it works, else TCG.
    #[default]
    Auto,
    /// KVM; fail if the preflight fails.
    Kvm,
    /// TCG always.
    Tcg,
}

impl FromStr for AccelMode {
    type Err = UnknownAccelMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            _ => Err(UnknownAccelMode(s.to_owned())),
        }
    }
}

impl fmt::Display for AccelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        })
    }
}

/// Not `auto`, `kvm` or `tcg`.
#[derive(Debug, thiserror::Error)]
#[error("Unknown accelerator {0:?}: use auto, kvm or tcg")]
pub struct UnknownAccelMode(pub String);

/// Why KVM cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum KvmUnavailable {
    /// The device could not be opened.
    #[error("Cannot open {path}")]
    Open {
        /// The KVM device.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// The kernel speaks another KVM API.
    #[error("KVM API version {found}, expected {expected}")]
    ApiVersion {
        /// What the device reports.
        found: i32,
        /// What this build expects.
        expected: u32,
    },
    /// Capabilities QEMU needs are missing.
    #[error("KVM lacks capabilities: {}", .0.join(", "))]
    MissingCaps(Vec<&'static str>),
    /// A VM could not be created.
    #[error("Cannot create a KVM VM")]
    CreateVm(#[source] std::io::Error),
}

/// The accelerator chosen and why, for logs and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelDecision {
    /// The accelerator to use.
    pub accel: Accel,
    /// One line saying why.
    pub reason: String,
}

/// Checks that `device` is a KVM the launcher could use: API version, capabilities,
/// and that a VM can be created.
pub fn kvm_preflight(device: &Path) -> Result<(), KvmUnavailable> {
    let open_error = |error| KvmUnavailable::Open {
        path: device.to_owned(),
        error,
    };
    let path = CString::new(device.as_os_str().as_bytes()).map_err(|_| {
        open_error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path contains NUL",
        ))
    })?;
    let kvm = Kvm::new_with_path(&path).map_err(|e| open_error(kvm_io_error(e)))?;
    let found = kvm.get_api_version();
    let expected = kvm_bindings::KVM_API_VERSION;
    if u32::try_from(found).ok() != Some(expected) {
        return Err(KvmUnavailable::ApiVersion { found, expected });
    }
    let missing: Vec<&'static str> = REQUIRED_CAPS
        .iter()
        .filter(|(cap, _)| !kvm.check_extension(*cap))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(KvmUnavailable::MissingCaps(missing));
    }
    kvm.create_vm()
        .map_err(|e| KvmUnavailable::CreateVm(kvm_io_error(e)))?;
    Ok(())
}

fn kvm_io_error(error: kvm_ioctls::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(error.errno())
}

/// Inputs to [`decide`], from the launcher's configuration.
#[derive(Debug, Clone)]
pub(crate) struct AccelProbe<'a> {
    pub mode: AccelMode,
    pub kvm_device: &'a Path,
    pub qemu: &'a Path,
    pub run_root: &'a Path,
    pub cache_file: &'a Path,
    pub tsc_khz: Option<u32>,
    pub timeout: Duration,
}

/// Decides the accelerator for `kernel` as the module docs describe.
pub(crate) async fn decide(
    probe: &AccelProbe<'_>,
    kernel: &Path,
) -> Result<AccelDecision, KvmUnavailable> {
    let tcg = |reason: String| AccelDecision {
        accel: Accel::Tcg,
        reason,
    };
    match probe.mode {
        AccelMode::Tcg => return Ok(tcg("TCG chosen by configuration".into())),
        AccelMode::Kvm => {
            kvm_preflight(probe.kvm_device)?;
            return Ok(AccelDecision {
                accel: Accel::Kvm,
                reason: "KVM chosen by configuration".into(),
            });
        }
        AccelMode::Auto => {}
    }
    if let Err(error) = kvm_preflight(probe.kvm_device) {
        return Ok(tcg(format!("KVM unusable: {}", crate::error_chain(&error))));
    }
    let fingerprint = Fingerprint::of(kernel, probe.qemu);
    let key = kernel.to_string_lossy().into_owned();
    let mut cache = CacheFile::load(probe.cache_file);
    let verdict = match cache.entries.get(&key) {
        Some(entry) if entry.fingerprint == fingerprint => {
            tracing::debug!(kernel = %kernel.display(), kvm_boots = entry.kvm_boots, "accel verdict from cache");
            entry.clone()
        }
        _ => {
            let (kvm_boots, detail) = quick_boot_kvm(probe, kernel).await;
            tracing::info!(kernel = %kernel.display(), kvm_boots, %detail, "quick KVM boot");
            let entry = CacheEntry {
                kvm_boots,
                detail,
                fingerprint,
                checked_at_unix_ms: now_unix_ms(),
            };
            cache.entries.insert(key, entry.clone());
            if let Err(error) = cache.store(probe.cache_file) {
                tracing::warn!(path = %probe.cache_file.display(), %error, "cannot cache accel verdict");
            }
            entry
        }
    };
    Ok(if verdict.kvm_boots {
        AccelDecision {
            accel: Accel::Kvm,
            reason: format!("KVM boots this kernel ({})", verdict.detail),
        }
    } else {
        tcg(format!("KVM cannot boot this kernel: {}", verdict.detail))
    })
}

/// Boots `kernel` under KVM without an initramfs; returns whether it reached the
/// root-mount panic in time, and a one-line detail.
async fn quick_boot_kvm(probe: &AccelProbe<'_>, kernel: &Path) -> (bool, String) {
    match try_quick_boot_kvm(probe, kernel).await {
        Ok(verdict) => verdict,
        Err(error) => (false, format!("quick boot failed to run: {error}")),
    }
}

async fn try_quick_boot_kvm(
    probe: &AccelProbe<'_>,
    kernel: &Path,
) -> Result<(bool, String), Box<dyn std::error::Error + Send + Sync>> {
    let dir = RunDir::create(probe.run_root)?;
    let console = dir.file(CONSOLE_LOG);
    let cmdline = kernel_cmdline("", "", probe.tsc_khz);
    let name = qemu_name(dir.id());
    let spec = QemuSpec {
        name: &name,
        accel: Accel::Kvm,
        size: Size {
            vcpus: 1,
            memory_mib: KVM_PROBE_MEMORY_MIB,
        },
        kernel,
        initramfs: None,
        cmdline: &cmdline,
        vhost_socket: None,
        serial_socket: None,
        ram_file: None,
        incoming: false,
        qmp_socket: None,
        disk: None,
        console_log: &console,
        console_socket: None,
    };
    let log = fs::File::create(dir.file(QEMU_LOG))?;
    let mut command = Command::new(probe.qemu);
    command
        .args(qemu_args(&spec))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let started = std::time::Instant::now();
    let mut qemu = ChildProcess::spawn("qemu", command, Lifetime::Owned).await?;
    let exited = tokio::time::timeout(probe.timeout, qemu.wait()).await;
    let elapsed = started.elapsed();
    let console_text = fs::read_to_string(&console).unwrap_or_default();
    let reached_root = KVM_PROBE_MARKERS.iter().any(|m| console_text.contains(m));
    Ok(match exited {
        Ok(Ok(_)) if reached_root => (true, format!("kernel booted in {elapsed:.1?}")),
        Ok(Ok(status)) => {
            let log = fs::read_to_string(dir.file(QEMU_LOG)).unwrap_or_default();
            let last = log
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            (
                false,
                format!("QEMU {status} after {elapsed:.1?}: {}", last.trim()),
            )
        }
        Ok(Err(error)) => (false, format!("cannot wait for QEMU: {error}")),
        Err(_) => (
            false,
            format!(
                "kernel did not finish booting within {:?} ({} console bytes)",
                probe.timeout,
                console_text.len()
            ),
        ),
    })
    // `qemu` (killed if still running) and `dir` are dropped here.
}

/// What identifies "the same kernel with the same QEMU" for the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Fingerprint {
    kernel_bytes: u64,
    kernel_mtime_unix_s: u64,
    qemu: String,
    qemu_mtime_unix_s: u64,
}

impl Fingerprint {
    fn of(kernel: &Path, qemu: &Path) -> Self {
        let meta = fs::metadata(kernel).ok();
        let qemu_resolved = resolve_program(qemu);
        Self {
            kernel_bytes: meta.as_ref().map_or(0, fs::Metadata::len),
            kernel_mtime_unix_s: meta.as_ref().map_or(0, mtime_s),
            qemu: qemu_resolved.to_string_lossy().into_owned(),
            qemu_mtime_unix_s: fs::metadata(&qemu_resolved).as_ref().map_or(0, mtime_s),
        }
    }
}

fn mtime_s(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// `program` as found on `PATH` when it is a bare name.
pub(crate) fn resolve_program(program: &Path) -> PathBuf {
    find_program(program).unwrap_or_else(|| program.to_owned())
}

/// The file `program` names: itself when it has a `/`, else its first match on
/// `PATH`; `None` when there is no such file (what `doctor` and the tests check).
pub fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_owned());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheEntry {
    kvm_boots: bool,
    detail: String,
    fingerprint: Fingerprint,
    checked_at_unix_ms: u64,
}

/// `accel.json`: verdicts keyed by kernel path. Written by rename, so readers never see
/// a torn file; concurrent writers may drop each other's new entry, which only costs
/// a second quick boot.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: BTreeMap<String, CacheEntry>,
}

impl CacheFile {
    fn load(path: &Path) -> Self {
        fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn store(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_case_insensitively() {
        assert_eq!("AUTO".parse::<AccelMode>().unwrap(), AccelMode::Auto);
        assert_eq!(" kvm".parse::<AccelMode>().unwrap(), AccelMode::Kvm);
        assert_eq!("tcg".parse::<AccelMode>().unwrap(), AccelMode::Tcg);
        assert!("hvf".parse::<AccelMode>().is_err());
    }

    #[test]
    fn a_missing_device_fails_the_preflight_with_its_path() {
        let err = kvm_preflight(Path::new("/nonexistent/kvm")).unwrap_err();
        assert!(matches!(err, KvmUnavailable::Open { .. }), "{err}");
        assert!(crate::error_chain(&err).contains("/nonexistent/kvm"));
    }

    #[tokio::test]
    async fn forced_tcg_never_touches_kvm() {
        let probe = AccelProbe {
            mode: AccelMode::Tcg,
            kvm_device: Path::new("/nonexistent/kvm"),
            qemu: Path::new("/nonexistent/qemu"),
            run_root: Path::new("/nonexistent/run"),
            cache_file: Path::new("/nonexistent/accel.json"),
            tsc_khz: None,
            timeout: Duration::from_secs(1),
        };
        let decision = decide(&probe, Path::new("/k")).await.unwrap();
        assert_eq!(decision.accel, Accel::Tcg);
    }

    #[tokio::test]
    async fn forced_kvm_without_a_device_is_an_error_and_auto_falls_back() {
        let mut probe = AccelProbe {
            mode: AccelMode::Kvm,
            kvm_device: Path::new("/nonexistent/kvm"),
            qemu: Path::new("/nonexistent/qemu"),
            run_root: Path::new("/nonexistent/run"),
            cache_file: Path::new("/nonexistent/accel.json"),
            tsc_khz: None,
            timeout: Duration::from_secs(1),
        };
        assert!(decide(&probe, Path::new("/k")).await.is_err());
        probe.mode = AccelMode::Auto;
        let decision = decide(&probe, Path::new("/k")).await.unwrap();
        assert_eq!(decision.accel, Accel::Tcg);
        assert!(
            decision.reason.contains("KVM unusable"),
            "{}",
            decision.reason
        );
    }

    #[test]
    fn the_cache_round_trips_through_its_file() {
        let path = std::env::temp_dir().join(format!("sbx-accel-{}.json", std::process::id()));
        let mut cache = CacheFile::default();
        let entry = CacheEntry {
            kvm_boots: false,
            detail: "hung".into(),
            fingerprint: Fingerprint::of(Path::new("/nonexistent"), Path::new("sh")),
            checked_at_unix_ms: 1,
        };
        cache.entries.insert("/k".into(), entry);
        cache.store(&path).unwrap();
        let back = CacheFile::load(&path);
        assert_eq!(back.entries["/k"].detail, "hung");
        assert!(back.entries["/k"].fingerprint.qemu.ends_with("/sh"));
        fs::remove_file(path).unwrap();
    }
}
