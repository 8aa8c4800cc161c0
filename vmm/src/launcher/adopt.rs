//! Adoption: a [`Vm`] handle on a detached VM that some other process (or an earlier
//! life of this one) started, so a restarted node daemon, or a server whose
//! hibernated VM was woken by the CLI, can use and stop it like one it booted.
//!
//! An adopted VM's QEMU and daemon are not children of this process: they cannot be
//! waited for with `waitpid`, only watched and signalled through pidfds. Each pid is
//! checked against the record first ([`run_dir::is_vm_qemu`]: the VM's `-name` in
//! its arguments and its start time), and the pidfd is opened before the check, so a
//! signal can never reach a process that took over the pid.
//!
//! Nothing here changes the VM: it keeps running, detached, whatever becomes of the
//! handle, until the handle is shut down or dropped (which stop it, as for a VM this
//! process booted) or let go with [`Vm::detach`].

use std::time::Duration;

use nix::sys::signal::Signal;

use super::boot::{stop_foreign, Launcher};
use super::run_dir::{self, VmId, VmRecord};
use super::sys::PidFd;
use super::vm::{StopOutcome, Vm, DAEMON_STOP_GRACE};

/// Why a VM could not be adopted.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// No run folder (or no readable record) with that id.
    #[error("No VM with id {id}")]
    NotFound {
        /// The id asked for.
        id: VmId,
    },
    /// The VM belongs to the process that booted it: it dies with that process, and
    /// only that process may stop it.
    #[error("VM {id} is owned by process {owner_pid}, not detached")]
    Owned {
        /// The VM.
        id: VmId,
        /// Its owner.
        owner_pid: u32,
    },
    /// The VM is hibernated: there is nothing running to adopt (wake it instead).
    #[error("VM {id} is hibernated")]
    Hibernated {
        /// The VM.
        id: VmId,
    },
    /// Its QEMU is gone (or its pid now names another process).
    #[error("VM {id} is not running: its QEMU is gone")]
    Dead {
        /// The VM.
        id: VmId,
    },
    /// The run folder holds no agent token.
    #[error("VM {id} has no agent token in its run folder")]
    NoToken {
        /// The VM.
        id: VmId,
    },
}

/// The processes of an adopted VM, reached by pidfd.
#[derive(Debug)]
pub(crate) struct Adopted {
    /// QEMU's pidfd, opened before its pid was checked.
    qemu: PidFd,
    qemu_pid: u32,
    /// QEMU's `-name`, which its arguments carry.
    qemu_name: String,
    /// The VM's relay or vsock daemon, if its record names one.
    daemon_pid: Option<u32>,
    /// The run folder's path, which the daemon's arguments carry.
    run_path: String,
    /// Set by [`Adopted::release`]: the VM outlives the handle.
    released: bool,
}

impl Adopted {
    /// Stops QEMU (`SIGTERM`, up to `grace`, then `SIGKILL`), then the daemon.
    pub(crate) async fn stop(&mut self, grace: Duration) -> StopOutcome {
        self.released = true;
        let outcome = stop_foreign(self.qemu_pid, &self.qemu_name, grace).await;
        if let Some(pid) = self.daemon_pid {
            stop_foreign(pid, &self.run_path, DAEMON_STOP_GRACE).await;
        }
        outcome
    }

    /// Waits until QEMU exits. Cancel-safe.
    pub(crate) async fn wait_exit(&self) -> std::io::Result<()> {
        let fd = self.qemu.try_clone()?.into_async()?;
        let _ = fd.readable().await?;
        Ok(())
    }

    /// `SIGKILL` to QEMU and the daemon, without waiting. For `Drop`.
    pub(crate) fn kill(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if let Err(error) = self.qemu.send_signal(Signal::SIGKILL) {
            if error.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(pid = self.qemu_pid, %error, "kill of an adopted QEMU failed");
            }
        }
        if let Some(pid) = self.daemon_pid {
            run_dir::kill_if_ours(pid, &self.run_path);
        }
    }

    /// Lets the VM outlive the handle.
    pub(crate) fn release(&mut self) {
        self.released = true;
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Launcher {
    /// A handle on the running, detached VM `id`: the same id, token, agent address
    /// and run folder as whoever booted it had. The VM must be detached (an owned
    /// VM is its owner's), awake (a hibernated one is woken, not adopted) and its
    /// QEMU the one its record names.
    pub fn adopt(&self, id: &VmId) -> Result<Vm, AdoptError> {
        let run_path = self.config.run_root.join(id.as_str());
        let record: VmRecord = run_dir::read_record(&run_path)
            .ok_or_else(|| AdoptError::NotFound { id: id.clone() })?;
        if !record.detached {
            return Err(AdoptError::Owned {
                id: id.clone(),
                owner_pid: record.owner_pid,
            });
        }
        if record.hibernation.is_some() {
            return Err(AdoptError::Hibernated { id: id.clone() });
        }
        let dead = || AdoptError::Dead { id: id.clone() };
        let qemu_pid = record.qemu_pid.ok_or_else(dead)?;
        // Opened before the check, so the pid the check passes is the one we hold.
        let qemu = PidFd::open(qemu_pid).map_err(|_| dead())?;
        if !run_dir::is_vm_qemu(&record) {
            return Err(dead());
        }
        let token =
            run_dir::read_token(&run_path).ok_or_else(|| AdoptError::NoToken { id: id.clone() })?;
        let run_text = run_path.to_string_lossy().into_owned();
        // A daemon pid that no longer names this VM's daemon is not ours to stop.
        let daemon_pid = record
            .daemon_pid
            .filter(|pid| run_dir::process_mentions(*pid, &run_text));
        tracing::info!(vm = %id, qemu_pid, transport = %record.transport, "adopted a running VM");
        let accel = super::AccelDecision {
            accel: record.accel,
            reason: "adopted: chosen when it was booted".into(),
        };
        Ok(Vm {
            ready: sandbox_protocol::Ready {
                magic: sandbox_protocol::MAGIC,
                version: sandbox_protocol::PROTOCOL_VERSION,
                agent_version: String::new(),
                boot_id: String::new(),
                uptime_ms: 0,
            },
            boot_duration: Duration::ZERO,
            accel,
            token,
            qemu: None,
            daemon: None,
            run_dir: None,
            adopted: Some(Adopted {
                qemu,
                qemu_pid,
                qemu_name: run_dir::qemu_name(id),
                daemon_pid,
                run_path: run_text,
                released: false,
            }),
            run_path,
            record,
        })
    }
}
