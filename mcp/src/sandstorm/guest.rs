//! The sandstorm tools that reach the guest (each after its token was checked):
//! `exec_command` over the streamed exec ([`crate::exec`]), `eval_code` in the
//! sandbox's default Python session, `wait_for_text` on a file, `ping_sandbox`.

use std::time::Duration;

use rmcp::model::CallToolResult;
use sandbox_protocol::limits::EXEC_DEADLINE_SECS;
use sandbox_protocol::wait::WAIT_MAX_TIMEOUT_MS;
use sandbox_protocol::{
    Command, ErrorKind, EvalReply, EvalRequest, ExecRequest, Language, ProcessSpec, WaitTarget,
};
use sandbox_vmm::client::Client;

use super::errors;
use super::params::CommandArgs;
use super::render::{
    object, object_error, EvalCodeResult, ExecCommandResult, PingInfo, WaitForTextResult,
};
use super::{EVAL_TIMEOUT_SECS, EXCERPT_BYTES};
use crate::backend::{Backend, Handle};
use crate::error::ToolError;
use crate::exec::{self, End, Shape, EXEC_DEFAULT_MAX_BYTES};
use crate::output::Keep;
use crate::progress::Progress;
use sandbox_engine::util::millis;

/// `exec_command`: `args` run without a shell (a command line with `/bin/sh -c`); a
/// non-zero exit is a normal result, a run cut off (its timeout, a lost agent) an
/// error result that keeps the output.
pub async fn exec_command(
    sandbox: &Handle,
    args: CommandArgs,
    timeout_secs: f64,
    progress: &Progress,
) -> Result<CallToolResult, ToolError> {
    let Some(command) = args.into_command() else {
        return Err(ToolError::new(
            "args must start with a program, like [\"python3\", \"-c\", \"print(2+2)\"], \
             or be a shell command line, like \"ls -l /tmp\".",
        ));
    };
    let timeout = seconds("timeout_secs", timeout_secs, EXEC_DEADLINE_SECS, false)?;
    let program = match &command {
        Command::Argv(argv) => argv.first().cloned().unwrap_or_default(),
        Command::Shell(_) => "/bin/sh".to_owned(),
    };
    let client = client(sandbox, "exec_command").await?;
    let request = ExecRequest {
        spec: ProcessSpec::new(command),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: true,
    };
    // Sized as the default profile's exec: 16 KiB of each stream as JSON encodes it,
    // the tail of a failure (where the error is), head and tail of a success. Whole
    // streams (sandstorm's 1 MiB) made a 3 MB output a 2 MB result, and 3 MB of NUL
    // bytes a 12 MB one.
    let shape = Shape {
        max_bytes: EXEC_DEFAULT_MAX_BYTES,
        keep: Keep::Auto,
    };
    let collected = exec::run(&client, request, timeout, shape, progress).await;
    let full = collected.to_result(timeout);
    let result = ExecCommandResult {
        stdout: full.stdout,
        stderr: full.stderr,
        exit_code: full.exit_code,
        signal: full.signal,
        truncated: full.truncated,
        timed_out: full.timed_out,
        duration_ms: full.duration_ms,
    };
    let cut = match &collected.end {
        End::Finished(reply) => reply.timed_out.then(|| {
            format!(
                "Timed out after {} s and killed with all it started; stdout and stderr hold \
                 what it printed until then. Call again with a larger timeout_secs (at most \
                 {EXEC_DEADLINE_SECS}).",
                timeout.as_secs_f64()
            )
        }),
        End::Failed(error) if !collected.started => {
            let id = sandbox.id();
            let error = errors::agent("exec_command", id, error);
            tracing::info!(sandbox = id, program, "exec_command did not start");
            return Err(error);
        }
        End::Failed(error) => Some(format!(
            "The run was cut off: {}; stdout and stderr hold what arrived before. If \
             ping_sandbox fails, kill_sandbox this sandbox and spawn a new one.",
            sandbox_vmm::error_chain(error)
        )),
        End::NoReply => Some(
            "The agent did not answer past the timeout; the run was cancelled (killed with all \
             it started). stdout and stderr hold what arrived before."
                .to_owned(),
        ),
    };
    Ok(match cut {
        Some(message) => object_error(&result, &message),
        None => object(&result),
    })
}

/// `eval_code`: Python in the sandbox's `default` session (a template's warm
/// session when it has one), restarted if it died. An exception is a normal result
/// with `error` set, as in sandstorm.
pub async fn eval_code(
    backend: &Backend,
    sandbox: &Handle,
    code: String,
) -> Result<CallToolResult, ToolError> {
    let client = client(sandbox, "eval_code").await?;
    let request = EvalRequest {
        session: sandbox_protocol::eval::DEFAULT_SESSION.to_owned(),
        language: Language::Python,
        code,
        timeout_ms: Some(EVAL_TIMEOUT_SECS * 1000),
        restart: true,
    };
    let reply = client.eval(request).await;
    let with_python = match &reply {
        Err(error) if crate::eval::is_missing_python(error) => backend.python_templates().await,
        _ => Vec::new(),
    };
    let reply = reply.map_err(|error| {
        if crate::eval::is_missing_python(&error) {
            return crate::eval::no_python(
                sandbox.id(),
                sandbox.template(),
                &with_python,
                |name| format!("call spawn_sandboxes with snapshot_tag {name:?}"),
                "run programs with exec_command here",
            );
        }
        errors::agent("eval_code", sandbox.id(), &error)
    })?;
    Ok(object(&eval_result(reply)))
}

fn eval_result(reply: EvalReply) -> EvalCodeResult {
    let error = match (&reply.died, reply.timed_out, &reply.exception) {
        (_, true, _) => Some(format!(
            "Interrupted after {EVAL_TIMEOUT_SECS} s (KeyboardInterrupt){}.",
            if reply.died.is_some() {
                "; the interpreter did not recover, so the next call starts a fresh one"
            } else {
                ""
            }
        )),
        (Some(status), false, _) => Some(format!(
            "The interpreter exited during the evaluation (status {}); the next call starts \
             a fresh one, without the old state.",
            status.shell_code()
        )),
        (None, false, Some(raised)) => Some(if raised.traceback.is_empty() {
            format!("{}: {}", raised.type_name, raised.message)
        } else {
            raised.traceback.clone()
        }),
        (None, false, None) => None,
    };
    EvalCodeResult {
        result: reply.value,
        exit_code: i32::from(error.is_some()),
        error,
        stdout: String::from_utf8_lossy(&reply.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
        duration_ms: reply.duration_ms,
    }
}

/// `wait_for_text`: the agent watches the file (no polling); not finding the marker
/// in time is a normal result with `found: false` and the file's tail.
pub async fn wait_for_text(
    sandbox: &Handle,
    path: &str,
    marker: String,
    timeout_secs: f64,
) -> Result<CallToolResult, ToolError> {
    if !path.starts_with('/') {
        return Err(ToolError::new(format!(
            "path {path:?} is relative; pass an absolute path such as /tmp/{path}"
        )));
    }
    let timeout = seconds(
        "timeout_secs",
        timeout_secs,
        WAIT_MAX_TIMEOUT_MS / 1000,
        true,
    )?;
    let client = client(sandbox, "wait_for_text").await?;
    let target = WaitTarget::File(path.as_bytes().to_vec());
    match client.wait_for_text(target, marker, Some(timeout)).await {
        Ok(found) => Ok(object(&WaitForTextResult {
            found: true,
            elapsed_ms: found.waited_ms,
            last_excerpt: found.line,
        })),
        Err(error) if error.wire_kind() == Some(ErrorKind::TimedOut) => {
            Ok(object(&WaitForTextResult {
                found: false,
                elapsed_ms: millis(timeout),
                last_excerpt: tail(&client, path).await,
            }))
        }
        Err(error) => Err(errors::agent("wait_for_text", sandbox.id(), &error)),
    }
}

/// The last [`EXCERPT_BYTES`] of the file at `path`; empty when it cannot be read.
async fn tail(client: &Client, path: &str) -> String {
    let data = client.read_file(path).await.unwrap_or_default();
    let start = data.len().saturating_sub(EXCERPT_BYTES);
    String::from_utf8_lossy(&data[start..]).into_owned()
}

/// `ping_sandbox`: a hibernated sandbox of the embedded engine is reported without
/// waking it; a node's is woken by the connection, as every data-plane call does.
pub async fn ping_sandbox(
    backend: &Backend,
    sandbox: &Handle,
) -> Result<CallToolResult, ToolError> {
    let ping = match sandbox {
        Handle::Embedded(inner) => backend
            .engine("ping_sandbox")?
            .ping(inner)
            .await
            .map_err(|error| errors::unreachable("ping_sandbox", sandbox.id(), &error))?,
        Handle::Node(_) => {
            let client = client(sandbox, "ping_sandbox").await?;
            let started = std::time::Instant::now();
            let info = client
                .info()
                .await
                .map_err(|error| errors::agent("ping_sandbox", sandbox.id(), &error))?;
            sandbox_engine::batch::Ping {
                status: sandbox_engine::sandbox::Status::Running,
                info: Some(info),
                round_trip: Some(started.elapsed()),
            }
        }
    };
    let info = ping.info.as_ref();
    Ok(object(&PingInfo {
        id: sandbox.id().to_owned(),
        ok: info.is_some(),
        round_trip_ms: ping.round_trip.map(millis),
        agent_version: info.map(|info| info.agent_version.clone()),
        uptime_ms: info.map(|info| info.uptime_ms),
        load_1m: info.map(|info| info.load[0]),
        mem_total_bytes: info.map(|info| info.mem_total_bytes),
        mem_available_bytes: info.map(|info| info.mem_available_bytes),
        processes_running: info.map(|info| info.processes_running),
    }))
}

async fn client(sandbox: &Handle, tool: &str) -> Result<Client, ToolError> {
    match sandbox {
        Handle::Embedded(inner) => inner
            .client()
            .await
            .map_err(|error| errors::unreachable(tool, sandbox.id(), &error)),
        Handle::Node(held) => held
            .connect()
            .await
            .map_err(|error| errors::agent(tool, sandbox.id(), &error)),
    }
}

/// A timeout in (fractional) seconds, at most `max_secs`; zero only when `zero_ok`.
fn seconds(name: &str, secs: f64, max_secs: u64, zero_ok: bool) -> Result<Duration, ToolError> {
    let low_ok = if zero_ok { secs >= 0.0 } else { secs > 0.0 };
    match Duration::try_from_secs_f64(secs) {
        Ok(duration) if low_ok && duration <= Duration::from_secs(max_secs) => Ok(duration),
        _ => Err(ToolError::new(format!(
            "{name} must be {} and at most {max_secs}; got {secs}.",
            if zero_ok { "0 or more" } else { "more than 0" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_checked_against_their_range() {
        assert_eq!(
            seconds("t", 1.5, 300, false).unwrap(),
            Duration::from_millis(1500)
        );
        assert!(seconds("t", 0.0, 300, false).is_err());
        assert_eq!(seconds("t", 0.0, 300, true).unwrap(), Duration::ZERO);
        assert!(seconds("t", 301.0, 300, false).is_err());
        assert!(seconds("t", -1.0, 300, true).is_err());
        assert!(seconds("t", f64::NAN, 300, true).is_err());
        let message = seconds("timeout_secs", 500.0, 300, false)
            .unwrap_err()
            .message;
        assert!(message.contains("timeout_secs"), "{message}");
    }
}
