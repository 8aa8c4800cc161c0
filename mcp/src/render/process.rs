//! Results of the process tools: `exec`, `spawn`, `ps`, `logs`, `kill`.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Serialize;

use super::Render;
use crate::output::{size, text_field, OutputRun};

/// `exec`
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct ExecResult {
    /// Standard output (invalid UTF-8 replaced): whole up to max_bytes, else the part
    /// `kept` names, with a "[... N omitted ...]" line where bytes were left out.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// The exit code (128+N when killed by signal N); null if it never ended.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Bytes the command wrote to stdout.
    pub stdout_bytes: u64,
    /// Bytes the command wrote to stderr.
    pub stderr_bytes: u64,
    /// A stream went past max_bytes, and part of it was left out.
    pub truncated: bool,
    /// What was kept of a stream past max_bytes: "tail", "head" or "head_tail";
    /// null when nothing was left out.
    pub kept: Option<String>,
    /// The timeout passed and the command was killed with all it started.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Set when the run was cut off (timeout, lost connection): the output above is
    /// what was collected until then.
    pub error: Option<String>,
    /// Set when the OOM killer ended it: "killed by the OOM killer (memory limit N
    /// MiB)".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<String>,
}

impl Render for ExecResult {
    fn render(&self) -> String {
        let mut out = match (self.exit_code, self.signal) {
            (_, Some(_)) if self.oom_killed.is_some() => {
                self.oom_killed.clone().unwrap_or_default()
            }
            (_, Some(signal)) => format!("killed by signal {signal}"),
            (Some(code), None) => format!("exit_code: {code}"),
            (None, None) => "exit_code: none (did not finish)".to_owned(),
        };
        let streams = [
            ("stdout", &self.stdout, self.stdout_bytes),
            ("stderr", &self.stderr, self.stderr_bytes),
        ];
        for (name, text, bytes) in streams {
            if text.is_empty() {
                continue;
            }
            let cut = self
                .kept
                .as_deref()
                .filter(|_| bytes > text.len() as u64)
                .map(|kept| format!(" ({} in all; {kept} kept)", size(bytes)))
                .unwrap_or_default();
            let _ = write!(
                out,
                "\n--- {name}{cut} ---\n{}",
                text_field(name, text, false)
            );
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        if self.stdout.is_empty() && self.stderr.is_empty() {
            out.push_str("\n(no output)");
        }
        out
    }
}

/// `spawn`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SpawnResult {
    /// The process id, for logs, kill and ps.
    pub pid: i32,
}

impl Render for SpawnResult {
    fn render(&self) -> String {
        format!(
            "started pid {} (read its output with logs, stop it with kill)",
            self.pid
        )
    }
}

/// One tracked process.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProcessRow {
    /// Process id (also its process group).
    pub pid: i32,
    /// How it was started: exec, spawn, pty, or session (an eval_code interpreter).
    pub kind: String,
    /// What it runs.
    pub command: String,
    /// "running" or "exited".
    pub state: String,
    /// Exit code once exited (128+N when killed by signal N).
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Start time (RFC 3339, UTC).
    pub started_at: String,
    /// End time (RFC 3339, UTC), once exited.
    pub ended_at: Option<String>,
}

/// `ps`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PsResult {
    /// The processes asked for (running ones only, unless running_only was false).
    pub processes: Vec<ProcessRow>,
    /// Tracked processes the filters left out.
    pub hidden: usize,
}

impl Render for PsResult {
    fn render(&self) -> String {
        let mut out = if self.processes.is_empty() {
            "no processes".to_owned()
        } else {
            let mut out = String::from("PID\tKIND\tSTATE\tSTARTED\tCOMMAND");
            for p in &self.processes {
                let state = match (p.state.as_str(), p.exit_code) {
                    ("exited", Some(code)) => format!("exited({code})"),
                    (state, _) => state.to_owned(),
                };
                let _ = write!(
                    out,
                    "\n{}\t{}\t{}\t{}\t{}",
                    p.pid, p.kind, state, p.started_at, p.command
                );
            }
            out
        };
        if self.hidden > 0 {
            let _ = write!(
                out,
                "\n({} more tracked, exited or of another kind: pass running_only: false \
                 and no kind to list them)",
                self.hidden
            );
        }
        out
    }
}

/// `logs`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LogsResult {
    /// The process.
    pub pid: i32,
    /// Whether it still runs.
    pub running: bool,
    /// Exit code once exited (128+N when killed by signal N).
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Its output from `from` to `next_cursor` in the order it was written, one run
    /// per switch between stdout and stderr (invalid UTF-8 replaced).
    pub output: Vec<OutputRun>,
    /// Offset of the first byte returned.
    pub from: u64,
    /// Offset one past the last byte returned: pass it as cursor to continue.
    pub next_cursor: u64,
    /// Bytes the process has written so far.
    pub end: u64,
    /// Bytes after the cursor that the 256 KiB ring no longer holds.
    pub dropped_bytes: u64,
    /// Bytes held but not returned (max_bytes): before `from` when the tail was
    /// kept (a cursor reads them), after `next_cursor` when the head was.
    pub omitted_bytes: u64,
}

impl Render for LogsResult {
    fn render(&self) -> String {
        let mut out = match (self.running, self.exit_code) {
            (true, _) => format!("pid {} running", self.pid),
            (false, Some(code)) => format!("pid {} exited with code {code}", self.pid),
            (false, None) => format!("pid {} ended", self.pid),
        };
        let _ = write!(
            out,
            "; bytes {}..{} of {}; next_cursor: {}",
            self.from, self.next_cursor, self.end, self.next_cursor
        );
        if self.dropped_bytes > 0 {
            let _ = write!(
                out,
                "\n({} older bytes were dropped from the 256 KiB ring)",
                self.dropped_bytes
            );
        }
        if self.omitted_bytes > 0 && self.next_cursor < self.end {
            let _ = write!(
                out,
                "\n({} more after next_cursor: call logs with cursor {} for them)",
                size(self.omitted_bytes),
                self.next_cursor
            );
        } else if self.omitted_bytes > 0 {
            let _ = write!(
                out,
                "\n({} earlier bytes not shown: pass cursor {} for them)",
                size(self.omitted_bytes),
                self.from - self.omitted_bytes
            );
        }
        let text: String = self.output.iter().map(|run| run.text.as_str()).collect();
        if self.output.is_empty() {
            out.push_str("\n(no new output)");
        } else if text.len() > crate::output::TEXT_FULL_BYTES {
            let _ = write!(
                out,
                "\n--- output ---\n{}",
                text_field("output", &text, false)
            );
        } else {
            for run in &self.output {
                let _ = write!(out, "\n--- {} ---\n{}", run.stream, run.text);
                if out.ends_with('\n') {
                    out.pop();
                }
            }
        }
        out
    }
}

/// `kill`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KillResult {
    /// The process.
    pub pid: i32,
    /// The signal asked for (9 when 0 was asked).
    pub signal: i32,
    /// Whether the signal was sent: not when the process had exited and left
    /// nothing running.
    pub sent: bool,
    /// The process had already exited before this call.
    pub already_exited: bool,
    /// Its exit code, when it had already exited.
    pub exit_code: Option<i32>,
    /// Processes it left running that the signal went to, when it had exited.
    pub left_running: Option<u32>,
}

impl Render for KillResult {
    fn render(&self) -> String {
        let code = self
            .exit_code
            .map(|code| format!(" with code {code}"))
            .unwrap_or_default();
        match (self.already_exited, self.sent) {
            (false, _) => format!(
                "signal {} sent to process {} and everything it started",
                self.signal, self.pid
            ),
            (true, true) => format!(
                "process {} had already exited{code}; signal {} sent to the {} processes \
                 it left running",
                self.pid,
                self.signal,
                self.left_running.unwrap_or_default()
            ),
            (true, false) => format!(
                "process {} had already exited{code} and left nothing running: no signal \
                 was sent",
                self.pid
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::failure_with;

    #[test]
    fn exec_rendering_shows_code_and_non_empty_streams() {
        let result = ExecResult {
            stdout: "hi".into(),
            stdout_bytes: 2,
            exit_code: Some(3),
            ..ExecResult::default()
        };
        assert_eq!(result.render(), "exit_code: 3\n--- stdout ---\nhi\n");
        let silent = ExecResult {
            exit_code: Some(0),
            ..ExecResult::default()
        };
        assert_eq!(silent.render(), "exit_code: 0\n(no output)");
        let cut = ExecResult {
            stdout: "[... 1.0 MiB omitted ...]\nerror: x\n".into(),
            stdout_bytes: 1 << 20,
            truncated: true,
            kept: Some("tail".into()),
            exit_code: Some(1),
            ..ExecResult::default()
        };
        assert!(
            cut.render()
                .starts_with("exit_code: 1\n--- stdout (1.0 MiB in all; tail kept) ---\n"),
            "{}",
            cut.render()
        );
    }

    #[test]
    fn large_output_is_in_the_json_and_only_previewed_in_the_text() {
        let stdout = "x".repeat(99) + "\n";
        let result = ExecResult {
            stdout: stdout.repeat(1000),
            stdout_bytes: 100_000,
            exit_code: Some(0),
            ..ExecResult::default()
        };
        let text = result.render();
        assert!(text.len() < 3000, "{}", text.len());
        assert!(text.contains("structuredContent.stdout"), "{text}");
    }

    #[test]
    fn an_oom_kill_is_named_instead_of_the_bare_signal() {
        let oom = sandbox_protocol::OomKill {
            pid: sandbox_protocol::Pid(5),
            kills: 1,
            memory_max_bytes: Some(32 << 20),
        };
        let result = ExecResult {
            exit_code: Some(137),
            signal: Some(9),
            oom_killed: Some(oom.to_string()),
            ..ExecResult::default()
        };
        assert_eq!(
            result.render(),
            "killed by the OOM killer (memory limit 32 MiB)\n(no output)"
        );
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(
            json["oom_killed"],
            "killed by the OOM killer (memory limit 32 MiB)"
        );
        let plain = serde_json::to_value(ExecResult::default()).unwrap();
        assert!(plain.get("oom_killed").is_none());
    }

    #[test]
    fn a_cut_off_exec_is_an_error_that_keeps_its_output() {
        let partial = ExecResult {
            stdout: "partial".into(),
            timed_out: true,
            error: Some("Timed out".into()),
            ..ExecResult::default()
        };
        let result = failure_with(&partial, "Timed out");
        assert_eq!(result.is_error, Some(true));
        let json = result.structured_content.unwrap();
        assert_eq!(json["stdout"], "partial");
        assert_eq!(json["error"], "Timed out");
    }

    #[test]
    fn logs_show_each_stream_switch_in_order() {
        let run = |stream: &str, offset, text: &str| OutputRun {
            stream: stream.into(),
            offset,
            text: text.into(),
        };
        let logs = LogsResult {
            pid: 7,
            running: true,
            exit_code: None,
            signal: None,
            output: vec![
                run("stdout", 0, "a\n"),
                run("stderr", 2, "E\n"),
                run("stdout", 4, "b\n"),
            ],
            from: 0,
            next_cursor: 6,
            end: 6,
            dropped_bytes: 0,
            omitted_bytes: 0,
        };
        assert_eq!(
            logs.render(),
            "pid 7 running; bytes 0..6 of 6; next_cursor: 6\n--- stdout ---\na\n--- stderr ---\nE\n--- stdout ---\nb"
        );
    }

    #[test]
    fn a_kill_of_an_exited_process_says_so() {
        let kill = KillResult {
            pid: 4,
            signal: 15,
            sent: false,
            already_exited: true,
            exit_code: Some(0),
            left_running: Some(0),
        };
        assert_eq!(
            kill.render(),
            "process 4 had already exited with code 0 and left nothing running: no signal was sent"
        );
    }
}
