//! `ps` and `kill`.

use anyhow::Context;
use sandbox_protocol::{ExitStatus, Pid, ProcessDetail, ProcessInfo, ProcessState};

use sandbox_vmm::client::Client;

use crate::json::ProcessView;
use crate::output::{self, print_json_line};

/// Lists tracked processes as a table or JSON: with what each left behind in its
/// cgroup and OOM kills when the agent knows `ps_detail`, else plain `ps`.
pub(crate) async fn ps(client: &Client, json: bool) -> anyhow::Result<u8> {
    let mut list = match client.ps_detail().await.context("ps failed")? {
        Some(list) => list,
        None => client
            .ps()
            .await
            .context("ps failed")?
            .into_iter()
            .map(without_detail)
            .collect(),
    };
    list.sort_by_key(|row| (row.info.started_at_ms, row.info.pid));
    if json {
        let views: Vec<ProcessView<'_>> = list.iter().map(ProcessView::from).collect();
        print_json_line(&views)?;
    } else {
        output::print(&table(&list))?;
    }
    Ok(0)
}

/// A plain `ps` row as a detail row (an agent without cgroups).
fn without_detail(info: ProcessInfo) -> ProcessDetail {
    let live_pids = u32::from(info.state == ProcessState::Running);
    ProcessDetail {
        info,
        cgroup: None,
        live_pids,
        oom: None,
    }
}

/// Signals a process's cgroup (or group).
pub(crate) async fn kill(client: &Client, pid: i32, signal: i32) -> anyhow::Result<u8> {
    client
        .kill(Pid(pid), signal)
        .await
        .with_context(|| format!("kill {pid} failed"))?;
    Ok(0)
}

/// The human `ps` table: PID KIND STATE EXIT STARTED ARGV; an exited process that
/// left processes in its cgroup shows as `exited+N`, and OOM kills follow the table
/// as one line per process.
fn table(list: &[ProcessDetail]) -> String {
    let rows: Vec<[String; 6]> = list
        .iter()
        .map(|row| {
            let info = &row.info;
            let (state, exit) = match info.state {
                ProcessState::Running => ("running".to_owned(), "-".to_owned()),
                ProcessState::Exited(status) if row.live_pids > 0 => {
                    (format!("exited+{}", row.live_pids), exit_text(status))
                }
                ProcessState::Exited(status) => ("exited".to_owned(), exit_text(status)),
            };
            [
                info.pid.to_string(),
                info.kind.as_str().to_owned(),
                state,
                exit,
                utc_time(info.started_at_ms),
                info.argv.join(" "),
            ]
        })
        .collect();
    let header = ["PID", "KIND", "STATE", "EXIT", "STARTED", "ARGV"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for row in list {
        if let Some(oom) = row.oom {
            out.push_str(&format!("pid {}: {oom}\n", row.info.pid));
        }
    }
    out
}

/// `0`, `3`, or `SIGKILL` (`sig 77` for numbers without a name).
fn exit_text(status: ExitStatus) -> String {
    match (status.code, status.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => name.as_str().to_owned(),
            Err(_) => format!("sig {signal}"),
        },
        (None, None) => "?".to_owned(),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` in UTC.
fn utc_time(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ms / 1000);
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replacen('T', " ", 1)
        .trim_end_matches('Z')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::ProcessKind;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc_time(1_700_000_000_123), "2023-11-14 22:13:20");
    }

    #[test]
    fn table_aligns_columns_and_names_signals() {
        let list = [
            ProcessInfo {
                pid: Pid(12),
                kind: ProcessKind::Spawn,
                argv: vec!["sleep".into(), "1000".into()],
                state: ProcessState::Running,
                started_at_ms: 0,
                ended_at_ms: None,
            },
            ProcessInfo {
                pid: Pid(12345),
                kind: ProcessKind::Exec,
                argv: vec!["sh".into()],
                state: ProcessState::Exited(ExitStatus {
                    code: None,
                    signal: Some(9),
                }),
                started_at_ms: 0,
                ended_at_ms: Some(1),
            },
        ];
        let mut list: Vec<_> = list.into_iter().map(without_detail).collect();
        list[1].live_pids = 2;
        list[1].oom = Some(sandbox_protocol::OomKill {
            pid: Pid(12345),
            kills: 1,
            memory_max_bytes: Some(64 << 20),
        });
        let text = table(&list);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "PID    KIND   STATE     EXIT     STARTED              ARGV"
        );
        assert_eq!(
            lines[1],
            "12     spawn  running   -        1970-01-01 00:00:00  sleep 1000"
        );
        assert_eq!(
            lines[2],
            "12345  exec   exited+2  SIGKILL  1970-01-01 00:00:00  sh"
        );
        assert_eq!(
            lines[3],
            "pid 12345: killed by the OOM killer (memory limit 64 MiB)"
        );
    }
}
