//! The launcher: boots a template in a QEMU microVM and hands back a [`Vm`].
//!
//! # A boot, step by step
//! 1. [`Template::load`] reads `template.json` (kernel, initramfs, optional disk,
//!    command line, default size).
//! 2. [`accel`] picks KVM or TCG: a `kvm-ioctls` preflight plus a bounded, cached
//!    quick boot, because a usable `/dev/kvm` does not prove KVM boots our kernel.
//! 3. [`run_dir`] creates `RUN_ROOT/<id>/`, locked by this process, with `vm.json`.
//! 4. A disk becomes a qcow2 overlay in the run folder (`qemu-img create -b`), so the
//!    template is never written.
//! 5. [`ready`] binds `vm.vsock_1025` before anything can connect to it.
//! 6. [`vsock_daemon`] starts this VM's own `vhost-device-vsock`.
//! 7. [`qemu`] builds the command line and QEMU starts; the clock for
//!    [`Vm::boot_duration`] starts here.
//! 8. The agent connects to host port 1025 and sends one `Ready` frame. QEMU exiting
//!    or the deadline passing first fails the boot with the console and QEMU log tails.
//!
//! # No stray processes
//! Children are forked from one long-lived thread with `PR_SET_PDEATHSIG(SIGKILL)`
//! ([`process`]), so they die with the process that started them, however it dies.
//! Every handle kills and reaps its process on drop, and [`Vm`]'s drop removes the run
//! folder, so a panic or an early return cleans up too. A caller killed outright
//! leaves only a run folder, which [`Launcher::sweep`] (run at every boot) removes.
//! Detached VMs ([`BootSpec::detached`]) are the one exception, by request: they live
//! until [`Launcher::stop`].
//!
//! # Layout
//! - [`config`]: [`LauncherConfig`] and its environment defaults.
//! - [`boot`]: [`Launcher`] and [`BootSpec`]; the boot sequence, stop, list, sweep.
//! - [`vm`]: [`Vm`], the running VM and its shutdown.
//! - [`template`], [`size`], [`accel`], [`qemu`], [`vsock_daemon`], [`ready`],
//!   [`run_dir`]: one step each, as above.
//! - [`adopt`]: a handle on a detached VM another process (or an earlier life of
//!   this one) started: how a restarted node daemon takes its VMs back.
//! - [`post_mortem`]: how a VM that stopped ended (power-off, panic), from its console.
//! - [`qmp`]: a typed QMP client (run state, migration to and from a file, disk
//!   overlays), what snapshots drive a running QEMU with.
//! - [`process`], [`sys`]: child processes and the syscalls std lacks.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

pub mod accel;
pub mod adopt;
pub mod boot;
pub mod config;
pub mod post_mortem;
mod process;
pub mod qemu;
pub mod qmp;
pub mod ready;
pub mod relay_daemon;
pub mod run_dir;
pub mod snapshot;
pub mod start;
/// VM sizes are the builder's type: `template.json` records one, checked at build.
pub use sandbox_rootfs::size;
mod sys;
pub mod template;
pub mod vm;
pub mod vsock_daemon;

pub use accel::{Accel, AccelDecision, AccelMode};
pub use adopt::AdoptError;
pub use boot::{BootSpec, Launcher};
pub use config::{AgentTransport, ConfigError, LauncherConfig};
pub use post_mortem::{GuestEnd, PostMortem};
pub use run_dir::{RunDirEntry, VmId, VmRecord, VmStatus};
pub use size::Size;
pub use template::{Template, TemplateRef};
pub use vm::{StopOutcome, Vm};

/// The port the agent listens on inside the guest.
pub const AGENT_PORT: u32 = sandbox_protocol::limits::AGENT_VSOCK_PORT;
/// The host port the agent reports readiness to.
pub const READY_PORT: u32 = sandbox_protocol::limits::READY_VSOCK_PORT;

/// How long a boot may take to `Ready` unless the caller says otherwise. Generous: a
/// TCG boot takes about 1.5 s on an idle host, many times that on a busy one.
pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 60;

/// Characters in a generated VM id.
pub const VM_ID_HEX_CHARS: usize = 12;

/// How much of each log a boot error quotes.
pub const LOG_TAIL_BYTES: u64 = 4096;

/// Files in a run folder.
pub const CONSOLE_LOG: &str = "console.log";
/// QEMU's console socket (serial-transport VMs), which the relay copies into
/// [`CONSOLE_LOG`].
pub const CONSOLE_SOCKET: &str = "console.sock";
/// QEMU's stdout and stderr.
pub const QEMU_LOG: &str = "qemu.log";
/// `vhost-device-vsock`'s stdout and stderr.
pub const VHOST_LOG: &str = "vhost.log";
/// The vhost-user control socket.
pub const VHOST_SOCKET: &str = "vhost.sock";
/// The hybrid vsock socket clients connect to.
pub const VSOCK_SOCKET: &str = "vm.vsock";
/// QEMU's end of the agent's virtio-serial port (serial transport).
pub const SERIAL_SOCKET: &str = "serial.sock";
/// Where clients reach a serial-transport VM's agent (its relay listens).
pub const AGENT_SOCKET: &str = "agent.sock";
/// QEMU's monitor socket (serial-transport VMs).
pub const QMP_SOCKET: &str = "qmp.sock";
/// `sandbox-relay`'s log.
pub const RELAY_LOG: &str = "relay.log";
/// The copy-on-write overlay of the template disk.
pub const DISK_OVERLAY: &str = "overlay.qcow2";
/// `qemu-img`'s output.
pub const QEMU_IMG_LOG: &str = "qemu-img.log";

/// Why a VM could not be booted or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The template could not be loaded.
    #[error("Cannot load template {template}")]
    LoadTemplate {
        /// The template asked for.
        template: TemplateRef,
        /// The cause.
        #[source]
        error: template::TemplateError,
    },
    /// The requested size is invalid.
    #[error("Invalid VM size")]
    Size(#[from] size::SizeError),
    /// `accel = kvm` was configured but KVM is unusable.
    #[error("KVM was requested but is unusable")]
    ChooseAccel(#[from] accel::KvmUnavailable),
    /// The run folder could not be created or written.
    #[error(transparent)]
    RunDir(#[from] run_dir::RunDirError),
    /// The copy-on-write overlay of the template disk could not be made.
    #[error("Cannot create a disk overlay of {}: {detail}", disk.display())]
    CreateOverlay {
        /// The template disk.
        disk: PathBuf,
        /// What went wrong (status and `qemu-img` output).
        detail: String,
    },
    /// The readiness socket could not be bound.
    #[error("Cannot listen for the agent's readiness")]
    ListenReady(#[source] ready::ReadyError),
    /// `vhost-device-vsock` did not come up.
    #[error("Cannot start the vsock daemon\n{logs}")]
    StartDaemon {
        /// The cause.
        #[source]
        error: vsock_daemon::DaemonError,
        /// Its log.
        logs: BootLogs,
    },
    /// QEMU could not be started.
    #[error("Cannot start {}", program.display())]
    StartQemu {
        /// The QEMU binary.
        program: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// QEMU exited before the agent was ready.
    #[error("QEMU exited ({status}) before the agent was ready\n{logs}")]
    QemuExited {
        /// How it exited.
        status: ExitStatus,
        /// Console and QEMU log tails.
        logs: BootLogs,
    },
    /// The agent did not report ready in time.
    #[error("The agent was not ready within {timeout:?}\n{logs}")]
    ReadyTimeout {
        /// The deadline.
        timeout: Duration,
        /// Console and QEMU log tails.
        logs: BootLogs,
    },
    /// The readiness message was unusable.
    #[error("The agent's readiness message was rejected\n{logs}")]
    Ready {
        /// The cause.
        #[source]
        error: ready::ReadyError,
        /// Console and QEMU log tails.
        logs: BootLogs,
    },
    /// Restoring a template's snapshot failed.
    #[error("Cannot start from the template's snapshot")]
    Snapshot(#[source] Box<snapshot::SnapshotError>),
    /// A fresh agent token could not be made.
    #[error("Cannot generate an agent token")]
    Token(#[source] std::io::Error),
    /// A restoring QEMU did not take its checkpoint.
    #[error("Cannot restore the checkpoint: {detail}\n{logs}")]
    Restore {
        /// What failed.
        detail: String,
        /// Console, QEMU and relay log tails.
        logs: BootLogs,
    },
    /// `net: egress` asked of a vsock-transport VM (egress rides the serial link).
    #[error("Egress needs the serial transport (it rides the VM's link to its relay)")]
    EgressNeedsSerial,
    /// The VM's egress policy could not be written.
    #[error("Cannot store the egress policy")]
    Egress(#[source] Box<crate::egress::PolicyFileError>),
    /// The relay reported no readiness (serial transport).
    #[error("The agent did not attach to the relay\n{logs}")]
    RelayReady {
        /// The cause.
        #[source]
        error: relay_daemon::RelayReadyError,
        /// Console, QEMU and relay log tails.
        logs: BootLogs,
    },
    /// Waiting on a VM process failed.
    #[error("Cannot wait for {what}")]
    Wait {
        /// Which process.
        what: &'static str,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// No run folder with that id.
    #[error("No VM with id {id}")]
    NotFound {
        /// The id asked for.
        id: VmId,
    },
    /// Removing a stopped VM's run folder failed.
    #[error("Cannot remove the run folder of VM {id}")]
    RemoveRunDir {
        /// The VM.
        id: VmId,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
}

/// The ends of a failed VM's logs, quoted in boot errors (the run folder itself is
/// removed with the VM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootLogs {
    /// The end of the serial console.
    pub console: String,
    /// The end of QEMU's stdout and stderr.
    pub qemu: String,
    /// The end of the VM's daemon's output (`vhost-device-vsock` or
    /// `sandbox-relay`).
    pub vhost: String,
}

impl BootLogs {
    /// Reads the tails of the logs in `dir`.
    pub fn collect(dir: &Path) -> Self {
        Self {
            console: console_tail(dir),
            qemu: tail(&dir.join(QEMU_LOG), LOG_TAIL_BYTES),
            vhost: if dir.join(RELAY_LOG).exists() {
                tail(&dir.join(RELAY_LOG), LOG_TAIL_BYTES)
            } else {
                tail(&dir.join(VHOST_LOG), LOG_TAIL_BYTES)
            },
        }
    }
}

impl fmt::Display for BootLogs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sections = [
            ("guest console", &self.console),
            ("QEMU log", &self.qemu),
            ("daemon log", &self.vhost),
        ];
        let mut any = false;
        for (name, text) in sections {
            let text = text.trim_end();
            if !text.is_empty() {
                writeln!(f, "--- {name} (end):")?;
                writeln!(f, "{text}")?;
                any = true;
            }
        }
        if !any {
            write!(f, "(the console and logs are empty)")?;
        }
        Ok(())
    }
}

/// The end of a VM's console: `console.log`, after the end of its rotated `.1` when
/// the current file holds less than [`LOG_TAIL_BYTES`].
pub(crate) fn console_tail(dir: &Path) -> String {
    let current = tail(&dir.join(CONSOLE_LOG), LOG_TAIL_BYTES);
    if current.len() as u64 >= LOG_TAIL_BYTES {
        return current;
    }
    let mut older = dir.join(CONSOLE_LOG).into_os_string();
    older.push(".1");
    let older = tail(Path::new(&older), LOG_TAIL_BYTES - current.len() as u64);
    older + &current
}

/// The last `max` bytes of a file, from a line start; empty when unreadable.
fn tail(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let text = if start > 0 {
        text.split_once('\n').map_or(&*text, |(_, rest)| rest)
    } else {
        &text
    };
    text.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callers spawn boots and shutdowns on multi-threaded runtimes.
    #[allow(dead_code)]
    fn futures_are_send(launcher: &Launcher, vm: Vm) {
        fn send<T: Send>(_: T) {}
        send(launcher.boot(BootSpec::default()));
        send(launcher.stop(&VmId::generate(), Duration::ZERO));
        send(vm.shutdown_with(Duration::ZERO, async {}));
    }

    #[test]
    fn tail_starts_at_a_line_and_logs_show_only_non_empty_sections() {
        let dir = std::env::temp_dir().join(format!("sbx-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.join(CONSOLE_LOG), &lines).unwrap();
        std::fs::write(dir.join(QEMU_LOG), "qemu: boom\n").unwrap();
        let logs = BootLogs::collect(&dir);
        assert!(logs.console.starts_with("line "));
        assert!(logs.console.ends_with("line 999\n"));
        assert!(logs.console.len() <= 4096);
        let text = logs.to_string();
        assert!(text.contains("--- guest console (end):"));
        assert!(text.contains("qemu: boom"));
        assert!(!text.contains("daemon log"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            BootLogs::default().to_string(),
            "(the console and logs are empty)"
        );
    }
}
