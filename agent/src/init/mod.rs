//! PID 1 duties: what the agent does before serving when it is the guest's init.
//!
//! Nothing here runs when the agent is an ordinary process (development, tests on
//! the host): the caller checks [`is_pid1`] first.
//!
//! # Order
//! 1. [`early`], before logging exists: mount `/proc` and `/dev`, attach
//!    `/dev/console` to any closed stdio fd, read the `sandbox.*` kernel parameters
//!    ([`cmdline`]). The caller then sets up logging with [`BootParams::log`].
//! 2. [`prepare`]: log the parameter warnings, mount the rest ([`mounts`]), keep
//!    init from the OOM killer ([`oom`]), load the modules the image builder listed
//!    ([`modules`]), switch into a root disk when one is given and this is still the
//!    initramfs ([`stage_one`]; on success the agent on the disk starts over at 1),
//!    then set the hostname and bring up loopback ([`net`]).
//! 3. The caller serves, reports readiness (`crate::ready`) and, at the very end,
//!    calls [`shutdown::power_off`], the only way PID 1 ends.
//!
//! Failures of single steps are logged and collected in [`InitReport::problems`]:
//! a guest without `/dev/shm` or loopback is still useful. Only a failed stage one is
//! fatal, because the template's files are on the disk that could not be entered.

pub mod cmdline;
pub mod console;
pub mod modules;
pub mod mounts;
pub mod net;
pub mod oom;
pub mod shutdown;
pub mod stage_one;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tracing::{info, warn};

pub use cmdline::{BootParams, CmdlineWarning};
pub use shutdown::{power_off, PowerAction};

/// A failed init step, named after the operation.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A mount point could not be created.
    #[error("Cannot create directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A filesystem could not be mounted.
    #[error("Cannot mount {fstype} on {}", target.display())]
    Mount {
        /// The mount point.
        target: PathBuf,
        /// The filesystem type.
        fstype: &'static str,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A mount could not be moved into the new root.
    #[error("Cannot move mount {} to {}", from.display(), to.display())]
    MoveMount {
        /// The mount point it had.
        from: PathBuf,
        /// The mount point it should get.
        to: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A symlink in `/dev` could not be made.
    #[error("Cannot create symlink {}", link.display())]
    Symlink {
        /// The link.
        link: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The console could not be attached to stdio.
    #[error("Cannot attach {} to stdio", path.display())]
    Console {
        /// The console device.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The kernel command line could not be read.
    #[error("Cannot read the kernel command line from {}", path.display())]
    ReadCmdline {
        /// Where it was read from.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The module list exists but could not be read.
    #[error("Cannot read the module list {}", path.display())]
    ReadModuleList {
        /// The list file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A kernel module could not be loaded.
    #[error("Cannot load kernel module {}", path.display())]
    LoadModule {
        /// The `.ko` file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The OOM score adjustment could not be written.
    #[error("Cannot write {}", path.display())]
    OomScoreAdj {
        /// The proc file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The hostname could not be set.
    #[error("Cannot set hostname {name:?}")]
    Hostname {
        /// The requested name.
        name: String,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A network interface could not be brought up.
    #[error("Cannot bring up interface {interface}")]
    LinkUp {
        /// The interface.
        interface: &'static str,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The root disk's device node never appeared.
    #[error("Root device {} did not appear within {waited:?}", device.display())]
    DeviceMissing {
        /// The device node.
        device: PathBuf,
        /// How long stage one waited.
        waited: Duration,
    },
    /// The root disk holds no agent to execute.
    #[error("No agent found in the new root {}", root.display())]
    NoAgentInRoot {
        /// Where the new root is mounted.
        root: PathBuf,
    },
    /// A step of switching roots failed.
    #[error("Cannot switch root: {step} failed")]
    SwitchRoot {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The agent in the new root could not be executed.
    #[error("Cannot execute {}", path.display())]
    Exec {
        /// The program.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
}

/// What [`prepare`] did, for the log and for `info`.
#[derive(Debug, Default)]
pub struct InitReport {
    /// Filesystems mounted by [`early`] and [`prepare`].
    pub mounted: Vec<PathBuf>,
    /// Kernel modules loaded.
    pub modules_loaded: Vec<PathBuf>,
    /// Kernel modules that were loaded already.
    pub modules_present: Vec<PathBuf>,
    /// Steps that failed without stopping the boot.
    pub problems: Vec<InitError>,
}

/// True when this process is the init of its PID namespace.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO` in the kernel).
const INITIAL_PID_NAMESPACE_INO: u64 = 0xEFFF_FFFC;

/// True when this process is PID 1 of the initial pid namespace: the machine's
/// init, not a container's. Only it confines in cgroups, and the kernel treats it
/// apart (the OOM killer never picks it).
pub fn is_machine_init() -> bool {
    use std::os::unix::fs::MetadataExt;
    is_pid1()
        && std::fs::metadata("/proc/self/ns/pid")
            .is_ok_and(|m| m.ino() == INITIAL_PID_NAMESPACE_INO)
}

/// What [`early`] did, for [`prepare`] to log and report.
#[derive(Debug, Default)]
pub struct EarlyReport {
    /// Filesystems mounted so far.
    pub mounted: Vec<PathBuf>,
    /// Failures, to be logged once logging is up (pass them to [`prepare`]).
    pub problems: Vec<InitError>,
}

/// The first step of PID 1, before logging is set up: mounts `/proc` and `/dev`,
/// puts the console on any closed stdio fd and reads the kernel command line.
/// Never fails: the parameters fall back to their defaults, and what went wrong is
/// returned for [`prepare`] to log.
pub fn early() -> (BootParams, EarlyReport) {
    let report = mounts::mount_early();
    let mut problems = report.failed;
    if let Err(error) = console::attach_stdio() {
        problems.push(error);
    }
    let params = match BootParams::from_proc() {
        Ok(params) => params,
        Err(error) => {
            problems.push(InitError::ReadCmdline {
                path: cmdline::PROC_CMDLINE_PATH.into(),
                error,
            });
            BootParams::default()
        }
    };
    let early = EarlyReport {
        mounted: report.mounted,
        problems,
    };
    (params, early)
}

/// The init duties after [`early`], in order (see the module docs). `early` is the
/// report [`early`] returned; its problems are logged here and carried along.
///
/// Returns `Err` only when stage one was required and failed; on stage one success
/// it does not return at all (the process image is replaced).
pub fn prepare(params: &BootParams, early: EarlyReport) -> Result<InitReport, InitError> {
    info!(?params, "init: preparing the guest");
    for warning in &params.warnings {
        warn!(%warning, "init: kernel command line");
    }
    let mut report = InitReport {
        mounted: early.mounted,
        problems: early.problems,
        ..InitReport::default()
    };
    for problem in &report.problems {
        warn!(error = %ErrorChain(problem), "init: early step failed");
    }

    let mounts = mounts::mount_all();
    report.mounted.extend(mounts.mounted);
    note_all(&mut report, mounts.failed, "mount");

    if let Err(error) = console::attach_stdio() {
        note(&mut report, error, "console");
    }

    match oom::protect_self() {
        Ok(oom::Protection::Kernel) => {
            info!("init: the machine's init, which the OOM killer never picks")
        }
        Ok(oom::Protection::Score) => info!("init: oom_score_adj set to -1000"),
        Err(error) => note(&mut report, error, "oom_score_adj"),
    }

    let modules = modules::load_listed();
    report.modules_loaded = modules.loaded;
    report.modules_present = modules.present;
    note_all(&mut report, modules.failed, "modules");

    if let Some(device) = &params.root {
        if stage_one::running_from_initramfs() {
            info!(device = %device.display(), "init: stage one, switching to the root disk");
            // Returns only on failure.
            let Err(error) = stage_one::switch_root(device);
            return Err(error);
        }
        info!(device = %device.display(), "init: running from the root disk");
    }

    match net::set_hostname(&params.hostname) {
        Ok(()) => info!(hostname = %params.hostname, "init: hostname set"),
        Err(error) => note(&mut report, error, "hostname"),
    }
    match net::loopback_up() {
        Ok(()) => info!("init: loopback up"),
        Err(error) => note(&mut report, error, "loopback"),
    }

    info!(
        mounted = report.mounted.len(),
        modules = report.modules_loaded.len(),
        problems = report.problems.len(),
        "init: guest prepared"
    );
    Ok(report)
}

fn note(report: &mut InitReport, error: InitError, step: &'static str) {
    warn!(step, error = %ErrorChain(&error), "init: step failed");
    report.problems.push(error);
}

fn note_all(report: &mut InitReport, errors: Vec<InitError>, step: &'static str) {
    for error in errors {
        note(report, error, step);
    }
}

/// Displays an error with its sources: `Cannot mount tmpfs on /tmp: Permission denied`.
#[derive(Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_walks_sources() {
        let error = InitError::Mount {
            target: "/tmp".into(),
            fstype: "tmpfs",
            error: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = ErrorChain(&error).to_string();
        assert!(text.starts_with("Cannot mount tmpfs on /tmp: "), "{text}");
        assert!(text.contains("ermitted"), "{text}");
    }
}
