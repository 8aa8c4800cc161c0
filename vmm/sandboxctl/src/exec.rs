//! `exec`, `sh` and `spawn`.

use std::io::Read;
use std::time::Duration;

use anyhow::Context;
use sandbox_protocol::{ExecReply, ExecRequest, ProcessSpec};
use tokio::signal::unix::{signal, SignalKind};

use sandbox_vmm::client::{Client, ExecEvent};

use crate::args::RunArgs;
use crate::output::{self, write_chunk};
use crate::run::{exit_byte, seconds, EXIT_TIMED_OUT};

/// How long to wait for the agent to confirm a cancel after Ctrl-C.
const CANCEL_WAIT_SECS: u64 = 5;

/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// Runs `spec` with live output; returns the command's exit code.
pub(crate) async fn exec(client: &Client, spec: ProcessSpec, run: &RunArgs) -> anyhow::Result<u8> {
    let timeout = run
        .timeout
        .map(|secs| seconds("--timeout", secs))
        .transpose()?;
    let stdin = match &run.stdin_file {
        None => Vec::new(),
        Some(path) if path.as_os_str() == "-" => {
            let mut data = Vec::new();
            std::io::stdin()
                .read_to_end(&mut data)
                .context("Cannot read stdin")?;
            data
        }
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
    loop {
        tokio::select! {
            event = stream.next() => match event.context("exec failed")? {
                ExecEvent::Started(pid) => tracing::debug!(%pid, "exec started"),
                ExecEvent::Output(chunk) => write_chunk(&chunk)?,
                ExecEvent::Finished(reply) => {
                    if let Some(oom) = client.exec_oom_kill(&reply).await {
                        eprintln!("sandboxctl: pid {}: {oom}", reply.pid);
                    }
                    let cgroups = client.hello().capabilities.iter().any(|c| c == "cgroups");
                    return Ok(finish(&reply, timeout, cgroups));
                }
            },
            _ = interrupt.recv() => {
                let cancel = stream.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(CANCEL_WAIT_SECS), cancel).await;
                eprintln!("sandboxctl: interrupted; the command was killed");
                return Ok(EXIT_INTERRUPTED);
            }
        }
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
}
