//! The process tools' work: `ps` with its filters, `logs` cut to a model's size in
//! the order the output was written, and `kill` that says what it did to a process
//! that had already exited.

use sandbox_protocol::limits::RING_BYTES;
use sandbox_protocol::{Pid, ProcessInfo, ProcessKind, ProcessState};
use sandbox_vmm::Client;

use crate::error::{Op, ToolError};
use crate::output::{select_runs, Part};
use crate::params::{KindFilter, LogsKeep, LogsParams, PsParams};
use crate::render::{rfc3339_ms, KillResult, LogsResult, ProcessRow, PsResult};

/// What `logs` returns without `max_bytes`: the end of a server's log, a few
/// thousand tokens.
pub const LOGS_DEFAULT_MAX_BYTES: u64 = 16 * 1024;

/// `ps`: the tracked processes `params` asks for.
pub async fn ps(
    client: &Client,
    sandbox_id: &str,
    params: &PsParams,
) -> Result<PsResult, ToolError> {
    let list = client
        .ps()
        .await
        .map_err(|error| ToolError::agent(Op::Kill, sandbox_id, &error))?;
    let total = list.len();
    let processes: Vec<ProcessRow> = list
        .into_iter()
        .filter(|info| !params.running_only || info.state == ProcessState::Running)
        .filter(|info| params.kind.is_none_or(|kind| matches(kind, info.kind)))
        .map(row)
        .collect();
    Ok(PsResult {
        hidden: total - processes.len(),
        processes,
    })
}

fn matches(filter: KindFilter, kind: ProcessKind) -> bool {
    matches!(
        (filter, kind),
        (KindFilter::Exec, ProcessKind::Exec)
            | (KindFilter::Spawn, ProcessKind::Spawn)
            | (KindFilter::Pty, ProcessKind::Pty)
            | (KindFilter::Session, ProcessKind::Session)
    )
}

fn row(info: ProcessInfo) -> ProcessRow {
    let (state, exit) = match info.state {
        ProcessState::Running => ("running", None),
        ProcessState::Exited(status) => ("exited", Some(status)),
    };
    ProcessRow {
        pid: info.pid.0,
        kind: info.kind.as_str().to_owned(),
        command: match info.kind {
            ProcessKind::Session => session_line(&info.argv),
            _ => command_line(&info.argv),
        },
        state: state.to_owned(),
        exit_code: exit.map(|status| status.shell_code()),
        signal: exit.and_then(|status| status.signal),
        started_at: rfc3339_ms(info.started_at_ms),
        ended_at: info.ended_at_ms.map(rfc3339_ms),
    }
}

/// `logs`: at most `max_bytes` of a process's output from the cursor.
pub async fn logs(
    client: &Client,
    sandbox_id: &str,
    params: &LogsParams,
) -> Result<LogsResult, ToolError> {
    let max = match params.max_bytes {
        None => LOGS_DEFAULT_MAX_BYTES,
        Some(0) => {
            return Err(ToolError::new(
                "max_bytes must be at least 1; omit it for 16 KiB.",
            ))
        }
        Some(max) if max > RING_BYTES as u64 => {
            return Err(ToolError::new(format!(
                "max_bytes may be at most {RING_BYTES} (the whole 256 KiB ring a process's \
                 output is kept in); got {max}. Page with cursor and next_cursor."
            )))
        }
        Some(max) => max,
    };
    let reply = client
        .logs(Pid(params.pid), params.cursor)
        .await
        .map_err(|error| ToolError::agent(Op::Logs, sandbox_id, &error))?;
    let part = match (params.keep, params.cursor) {
        (LogsKeep::Head, _) | (LogsKeep::Auto, Some(_)) => Part::Head,
        (LogsKeep::Tail, _) | (LogsKeep::Auto, None) => Part::Tail,
    };
    let batch = &reply.batch;
    let held: u64 = batch.chunks.iter().map(|c| c.data.len() as u64).sum();
    let max = usize::try_from(max).unwrap_or(RING_BYTES);
    let runs = select_runs(&batch.chunks, batch.end, part, max);
    let shown = runs.to - runs.from;
    Ok(LogsResult {
        pid: params.pid,
        running: reply.exit.is_none(),
        exit_code: reply.exit.map(|status| status.shell_code()),
        signal: reply.exit.and_then(|status| status.signal),
        output: runs.runs,
        from: runs.from,
        next_cursor: runs.to,
        end: batch.end,
        dropped_bytes: batch.dropped,
        omitted_bytes: held - shown,
    })
}

/// `kill`: `signal` to a process and all it started, unless it had exited and left
/// nothing running (then nothing is sent, and the result says so).
pub async fn kill(
    client: &Client,
    sandbox_id: &str,
    pid: i32,
    signal: i32,
) -> Result<KillResult, ToolError> {
    let failed = |error| ToolError::agent(Op::Kill, sandbox_id, &error);
    // An agent without ps_detail (None) is asked plainly.
    let exited = match client.ps_detail().await.map_err(failed)? {
        Some(details) => details
            .into_iter()
            .find(|detail| detail.info.pid.0 == pid)
            .and_then(|detail| match detail.info.state {
                ProcessState::Exited(status) => Some((status, Some(detail.live_pids))),
                ProcessState::Running => None,
            }),
        None => None,
    };
    let sent = match exited {
        Some((_, Some(0))) => false,
        _ => {
            client.kill(Pid(pid), signal).await.map_err(failed)?;
            true
        }
    };
    Ok(KillResult {
        pid,
        signal,
        sent,
        already_exited: exited.is_some(),
        exit_code: exited.map(|(status, _)| status.shell_code()),
        left_running: exited.and_then(|(_, live)| live),
    })
}

/// A process's command as one line: the shell line for `sh -c LINE`, else the argv.
pub fn command_line(argv: &[String]) -> String {
    match argv {
        [sh, flag, line] if sh.ends_with("sh") && flag == "-c" => line.clone(),
        _ => argv.join(" "),
    }
}

/// An `eval_code` session's interpreter as `ps` shows it: its name and program, not
/// the bootstrap that loads its driver (the session's name is its last argument).
fn session_line(argv: &[String]) -> String {
    match (argv.first(), argv.last()) {
        (Some(program), Some(name)) if argv.len() > 1 => {
            format!("eval_code session {name} ({program})")
        }
        _ => command_line(argv),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_commands_show_their_line() {
        let argv = ["/bin/sh", "-c", "sleep 1"].map(String::from);
        assert_eq!(command_line(&argv), "sleep 1");
        let argv = ["python3", "-m", "http.server"].map(String::from);
        assert_eq!(command_line(&argv), "python3 -m http.server");
    }

    #[test]
    fn sessions_show_their_name_not_their_bootstrap() {
        let argv = ["python3", "-u", "-c", "import sys;exec(...)", "work"].map(String::from);
        assert_eq!(session_line(&argv), "eval_code session work (python3)");
    }
}
