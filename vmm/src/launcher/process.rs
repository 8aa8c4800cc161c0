//! Child processes that cannot outlive their owner.
//!
//! Every helper the launcher starts (QEMU, `vhost-device-vsock`, `qemu-img`) goes
//! through [`ChildProcess::spawn`]:
//! - It forks from one long-lived thread, the *spawner*. `PR_SET_PDEATHSIG` fires when
//!   the **thread** that forked the child exits, not the process; forking from a tokio
//!   worker or blocking-pool thread would kill the child whenever that thread retires.
//!   The spawner lives until the process exits, so the death signal means exactly
//!   "the owning process died" (even by `SIGKILL`).
//! - In the child, before `exec`: a process group of its own (so a terminal's Ctrl-C
//!   reaches the caller, which stops the VM in order, not QEMU directly), and either
//!   `PR_SET_PDEATHSIG(SIGKILL)` ([`Lifetime::Owned`]) or a new session
//!   ([`Lifetime::Detached`], for VMs that outlive the command that started them).
//! - Waiting is by pidfd, never by `waitpid(-1)`: the launcher is a library inside
//!   someone else's process and must not steal the exit status of their children.
//! - Dropping a [`ChildProcess`] that is still running sends `SIGKILL` and reaps it.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::sys::PidFd;

/// How a child's life is tied to the process that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed (`SIGKILL`) as soon as the starting process dies.
    Owned,
    /// In a session of its own; survives the starting process. Someone must stop it
    /// later by pid (see `Launcher::stop`).
    Detached,
}

struct SpawnJob {
    command: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// The sender to the spawner thread, started on first use.
fn spawner() -> io::Result<&'static mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnJob>();
            let started = thread::Builder::new()
                .name("sandbox-spawner".into())
                .spawn(move || {
                    // Lives as long as the process: the static sender is never dropped.
                    for mut job in rx {
                        // The asker may have gone (its boot was cancelled): then
                        // nobody owns the child, so stop it here.
                        if let Err(Ok(mut orphan)) = job.reply.send(job.command.spawn()) {
                            let _ = orphan.kill();
                            let _ = orphan.wait();
                        }
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(error) => {
                    tracing::error!(%error, "cannot start the spawner thread");
                    None
                }
            }
        })
        .as_ref()
        .ok_or_else(|| io::Error::other("the spawner thread could not be started"))
}

/// A running (or exited but not yet reaped) helper process.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    /// Short name for logs and errors (`qemu`, `vhost-device-vsock`, ...).
    name: &'static str,
    child: Child,
    pidfd: PidFdSlot,
    /// Set once reaped.
    status: Option<ExitStatus>,
    /// Set by [`ChildProcess::release`]: do not kill on drop.
    released: bool,
}

impl ChildProcess {
    /// Starts `command` from the spawner thread with the given lifetime.
    pub(crate) async fn spawn(
        name: &'static str,
        mut command: Command,
        lifetime: Lifetime,
    ) -> io::Result<Self> {
        let parent = Pid::this();
        // SAFETY: the closure runs between fork and exec in the child and only makes
        // async-signal-safe system calls (setpgid, setsid, prctl, getppid); it does not
        // allocate or take locks.
        unsafe {
            command.pre_exec(move || child_setup(lifetime, parent));
        }
        let (reply, answer) = oneshot::channel();
        spawner()?
            .send(SpawnJob { command, reply })
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        let child = answer
            .await
            .map_err(|_| io::Error::other("the spawner thread dropped a request"))??;
        // Opened before anyone can reap the child, so the pid is still ours.
        let pidfd = match PidFd::open(child.id()) {
            Ok(fd) => PidFdSlot::Plain(fd),
            Err(error) => {
                tracing::warn!(name, pid = child.id(), %error, "pidfd_open failed; polling instead");
                PidFdSlot::None
            }
        };
        tracing::debug!(name, pid = child.id(), "spawned");
        Ok(Self {
            name,
            child,
            pidfd,
            status: None,
            released: false,
        })
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the child has exited; reaps it.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let status = self.child.try_wait()?;
        self.status = status;
        Ok(status)
    }

    /// Waits for the child to exit and reaps it. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if let PidFdSlot::Plain(_) = self.pidfd {
                // Registered lazily: spawning does not need a reactor, waiting does.
                if let PidFdSlot::Plain(fd) = std::mem::replace(&mut self.pidfd, PidFdSlot::None) {
                    self.pidfd = PidFdSlot::Registered(fd.into_async()?);
                }
            }
            match &self.pidfd {
                PidFdSlot::Registered(fd) => {
                    // Readable means "exited"; the loop then reaps it.
                    let mut guard = fd.readable().await?;
                    guard.clear_ready();
                }
                PidFdSlot::Plain(_) | PidFdSlot::None => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// Sends `signal` unless the child was already reaped (its pid could be reused).
    pub(crate) fn signal(&mut self, signal: Signal) -> io::Result<()> {
        if self.try_wait()?.is_some() {
            return Ok(());
        }
        let result = match &self.pidfd {
            PidFdSlot::Plain(fd) => fd.send_signal(signal),
            PidFdSlot::Registered(fd) => fd.get_ref().send_signal(signal),
            PidFdSlot::None => {
                // Not reaped yet, so the pid still names our child (a zombie at worst).
                let pid = i32::try_from(self.child.id())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pid out of range"))?;
                nix::sys::signal::kill(Pid::from_raw(pid), signal).map_err(io::Error::from)
            }
        };
        match result {
            Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }

    /// Sends `SIGKILL` and reaps, blocking briefly. For `Drop` and error paths.
    pub(crate) fn kill_and_reap(&mut self) {
        if self.status.is_some() || self.released {
            return;
        }
        if let Err(error) = self.signal(Signal::SIGKILL) {
            tracing::warn!(name = self.name, pid = self.pid(), %error, "kill failed");
        }
        match self.child.wait() {
            Ok(status) => self.status = Some(status),
            Err(error) => {
                tracing::warn!(name = self.name, pid = self.pid(), %error, "reap failed")
            }
        }
    }

    /// Stops the child: `SIGTERM`, up to `grace` to exit, then `SIGKILL`.
    pub(crate) async fn terminate(&mut self, grace: std::time::Duration) -> io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM)?;
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            return status;
        }
        self.signal(Signal::SIGKILL)?;
        self.wait().await
    }

    /// The child's stdout, when it was spawned with a pipe there (once).
    pub(crate) fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Gives the child up without killing it (a detached VM); returns its pid.
    pub(crate) fn release(mut self) -> u32 {
        self.released = true;
        self.pid()
    }
}

/// The child's pidfd, if one could be opened, before and after it joins the reactor.
#[derive(Debug)]
enum PidFdSlot {
    None,
    Plain(PidFd),
    Registered(AsyncFd<PidFd>),
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// Runs in the child between fork and exec: only async-signal-safe calls, and no
/// allocation (errors are raw errno values).
fn child_setup(lifetime: Lifetime, parent: Pid) -> io::Result<()> {
    match lifetime {
        Lifetime::Owned => {
            nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died between fork and prctl: then the death signal
            // will never come, so do not start at all.
            if nix::unistd::getppid() != parent {
                // No allocation here (another thread may hold the malloc lock).
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Lifetime::Detached => {
            nix::unistd::setsid()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn alive(pid: u32) -> bool {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }

    #[tokio::test]
    async fn wait_reports_the_exit_status() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 7"]);
        let mut child = ChildProcess::spawn("sh", cmd, Lifetime::Owned)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
    }

    #[tokio::test]
    async fn drop_kills_and_reaps_a_running_child() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let child = ChildProcess::spawn("sleep", cmd, Lifetime::Owned)
            .await
            .unwrap();
        let pid = child.pid();
        assert!(alive(pid));
        drop(child);
        assert!(!alive(pid), "child {pid} survived its handle");
    }

    #[tokio::test]
    async fn terminate_escalates_to_sigkill_after_the_grace() {
        let mut cmd = Command::new("sh");
        // Ignored signals stay ignored across exec.
        cmd.args(["-c", "trap '' TERM; exec sleep 30"]);
        let mut child = ChildProcess::spawn("sh", cmd, Lifetime::Owned)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let status = child.terminate(Duration::from_millis(200)).await.unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    /// Regression: children forked from a short-lived thread died with that thread
    /// (PR_SET_PDEATHSIG is per thread). The spawner thread prevents it.
    #[test]
    fn child_outlives_the_thread_that_asked_for_it() {
        let child = thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            rt.block_on(ChildProcess::spawn("sleep", cmd, Lifetime::Owned))
                .unwrap()
        })
        .join()
        .unwrap();
        thread::sleep(Duration::from_millis(200));
        assert!(alive(child.pid()));
        drop(child);
    }
}
