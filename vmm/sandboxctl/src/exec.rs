//! `exec`, `sh` and `spawn`.

use std::io::{IsTerminal, Read};
use std::time::Duration;

use anyhow::Context;
use sandbox_protocol::{ErrorKind, ExecReply, ExecRequest, ProcessSpec, WireError};
use tokio::signal::unix::{signal, SignalKind};

use sandbox_vmm::client::{Client, ClientError, ExecEvent};

use crate::args::RunArgs;
use crate::output::{self, write_chunk};
use crate::run::{exit_byte, seconds, EXIT_TIMED_OUT};

/// How long to wait for the agent to confirm a cancel after Ctrl-C.
const CANCEL_WAIT_SECS: u64 = 5;

/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// Exit code when the command was found but could not be started (not executable, a
/// directory, a bad working directory or user), as shells, `docker exec` and
/// `kubectl exec` use it.
const EXIT_CANNOT_INVOKE: u8 = 126;

/// Exit code when the command was not found, as shells, `docker exec` and `kubectl
/// exec` use it.
const EXIT_NOT_FOUND: u8 = 127;

/// How the agent's message for a program it could not start begins
/// (`ProcessError::Start` in `agent/src/process/mod.rs`); its other refusals before a
/// start (working directory, user) begin otherwise.
const START_FAILED_PREFIX: &str = "Cannot start ";

/// Runs `spec` with live output; returns the command's exit code.
pub(crate) async fn exec(client: &Client, spec: ProcessSpec, run: &RunArgs) -> anyhow::Result<u8> {
    let timeout = run
        .timeout
        .map(|secs| seconds("--timeout", secs))
        .transpose()?;
    let stdin = match &run.stdin_file {
        None if run.interactive || !std::io::stdin().is_terminal() => read_stdin()?,
        None => Vec::new(),
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => {
            std::fs::read(path).with_context(|| format!("Cannot read {}", path.display()))?
        }
    };
    let request = ExecRequest {
        spec,
        stdin,
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        stream: true,
    };
    let mut interrupt = signal(SignalKind::interrupt()).context("Cannot watch for Ctrl-C")?;
    let mut stream = client.exec_stream(request)?;
    let mut started = false;
    loop {
        tokio::select! {
            event = stream.next() => {
                let event = match event {
                    Ok(event) => event,
                    Err(ClientError::Agent(error)) if !started => {
                        let Some(code) = start_failure_code(&error) else {
                            return Err(ClientError::Agent(error)).context("exec failed");
                        };
                        eprintln!("sandboxctl: {}", error.message);
                        return Ok(code);
                    }
                    Err(error) => return Err(error).context("exec failed"),
                };
                match event {
                    ExecEvent::Started(pid) => {
                        started = true;
                        tracing::debug!(%pid, "exec started");
                    }
                    ExecEvent::Output(chunk) => write_chunk(&chunk)?,
                    ExecEvent::Finished(reply) => {
                        if let Some(oom) = client.exec_oom_kill(&reply).await {
                            eprintln!("sandboxctl: pid {}: {oom}", reply.pid);
                        }
                        let cgroups = client.hello().capabilities.iter().any(|c| c == "cgroups");
                        return Ok(finish(&reply, timeout, cgroups));
                    }
                }
            }
            _ = interrupt.recv() => {
                let cancel = stream.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(CANCEL_WAIT_SECS), cancel).await;
                eprintln!("sandboxctl: interrupted; the command was killed");
                return Ok(EXIT_INTERRUPTED);
            }
        }
    }
}

/// Our stdin to its end (the exec's stdin travels in its one request); nothing when
/// there is no stdin at all (a closed descriptor 0).
fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut data = Vec::new();
    match std::io::stdin().read_to_end(&mut data) {
        Err(error) if error.raw_os_error() == Some(libc::EBADF) => Ok(Vec::new()),
        Err(error) => Err(error).context("Cannot read stdin"),
        Ok(_) => Ok(data),
    }
}

/// The exit code for a finished exec, telling the user about a timeout (and what
/// the timeout killed: everything in the exec's cgroup when the agent confines in
/// cgroups, else its process group).
fn finish(reply: &ExecReply, timeout: Option<Duration>, cgroups: bool) -> u8 {
    if reply.timed_out {
        let limit = timeout.map_or_else(
            || format!("{}s", sandbox_protocol::limits::EXEC_DEADLINE_SECS),
            |t| format!("{}s", t.as_secs_f64()),
        );
        let what = if cgroups {
            "its cgroup (everything it started)"
        } else {
            "its process group"
        };
        eprintln!(
            "sandboxctl: command timed out after {limit}; {what} (pid {}) was killed",
            reply.pid
        );
        return EXIT_TIMED_OUT;
    }
    match reply.exit {
        Some(status) => exit_byte(status.shell_code()),
        None => {
            eprintln!(
                "sandboxctl: the agent reported no exit status for pid {}",
                reply.pid
            );
            u8::MAX
        }
    }
}

/// The exit code for an agent error before the command started, when the error
/// means the command cannot be run (127: not found; 126: found but not runnable),
/// or `None` for a failure of the agent or the link (exit 1, as for other commands).
fn start_failure_code(error: &WireError) -> Option<u8> {
    let start = error.message.starts_with(START_FAILED_PREFIX);
    match error.kind {
        ErrorKind::NotFound if start => Some(EXIT_NOT_FOUND),
        ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::WrongType => {
            Some(EXIT_CANNOT_INVOKE)
        }
        // ENOEXEC (a file without a `#!` line or of another architecture) and the like.
        _ if start => Some(EXIT_CANNOT_INVOKE),
        _ => None,
    }
}

/// Starts `spec` detached and prints its pid.
pub(crate) async fn spawn(client: &Client, spec: ProcessSpec) -> anyhow::Result<u8> {
    let pid = client.spawn(spec).await.context("spawn failed")?;
    output::print(&format!("{pid}\n"))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::{ExitStatus, Pid};

    fn reply(exit: Option<ExitStatus>, timed_out: bool) -> ExecReply {
        ExecReply {
            pid: Pid(7),
            stdout: vec![],
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            exit,
            timed_out,
            duration_us: 1,
        }
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        let code = |code, signal| {
            finish(
                &reply(Some(ExitStatus { code, signal }), false),
                None,
                false,
            )
        };
        assert_eq!(code(Some(0), None), 0);
        assert_eq!(code(Some(3), None), 3);
        assert_eq!(code(None, Some(9)), 137);
        assert_eq!(finish(&reply(None, true), None, true), EXIT_TIMED_OUT);
        assert_eq!(finish(&reply(None, false), None, false), 255);
    }

    #[test]
    fn a_command_that_cannot_start_exits_126_or_127_as_docker_exec_does() {
        let error = |kind, message: &str| WireError::new(kind, message);
        let code = |kind, message| start_failure_code(&error(kind, message));
        assert_eq!(
            code(
                ErrorKind::NotFound,
                "Cannot start nosuch: nosuch not found in PATH"
            ),
            Some(127)
        );
        assert_eq!(
            code(
                ErrorKind::PermissionDenied,
                "Cannot start /etc/passwd: Permission denied (os error 13)"
            ),
            Some(126)
        );
        assert_eq!(
            code(
                ErrorKind::Internal,
                "Cannot start /x: Exec format error (os error 8)"
            ),
            Some(126)
        );
        assert_eq!(
            code(
                ErrorKind::NotFound,
                "Cannot use /nope as the working directory: No such file"
            ),
            Some(126)
        );
        assert_eq!(code(ErrorKind::Busy, "Too many processes"), None);
        assert_eq!(code(ErrorKind::Internal, "Cannot make a cgroup"), None);
    }
}
