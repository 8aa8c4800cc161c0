//! The `exec` tool's run: a streaming exec whose output is collected here, so a run
//! that is cut off (its timeout, a lost connection, the tool-call cap) still returns
//! everything that arrived before the cut.
//!
//! Each stream keeps its first [`EXEC_OUTPUT_CAP_BYTES`]; the rest is read and
//! dropped with `truncated` set, as the agent does for a collected exec. The agent
//! kills the command and all it started (its cgroup, or its process group on an agent
//! without cgroups) at the timeout and replies within [`EXEC_DEADLINE_GRACE_SECS`];
//! if it does not, this side gives up one second later and cancels the request,
//! which kills the same way. A command that ended by `SIGKILL` is looked up once
//! more (`ps_detail`), so a kill by the OOM killer is reported as such.

use std::time::Duration;

use sandbox_protocol::limits::{EXEC_DEADLINE_GRACE_SECS, EXEC_OUTPUT_CAP_BYTES};
use sandbox_protocol::{ExecReply, ExecRequest, OomKill, OutputChunk, Stream};
use sandbox_vmm::client::{Client, ClientError, ExecEvent};
use tokio::time::Instant;

use crate::render::ExecResult;
use crate::util::millis;

/// How long a cancel may take to be confirmed before the stream is simply dropped.
const CANCEL_WAIT_MS: u64 = 1000;

/// How a run ended.
#[derive(Debug)]
pub enum End {
    /// The agent replied (the command exited, or timed out and was killed).
    Finished(ExecReply),
    /// The request failed before or while running.
    Failed(ClientError),
    /// The agent did not reply by the deadline plus grace.
    NoReply,
}

/// What a run produced.
#[derive(Debug)]
pub struct Collected {
    /// Output so far.
    pub stdout: Vec<u8>,
    /// Errors so far.
    pub stderr: Vec<u8>,
    /// A stream went past the cap.
    pub truncated: bool,
    /// Whether the command started (a `Started` event arrived).
    pub started: bool,
    /// How it ended.
    pub end: End,
    /// Set when the OOM killer ended it.
    pub oom: Option<OomKill>,
    /// Wall time.
    pub elapsed: Duration,
}

impl Collected {
    /// The tool's result, with `error` set for a cut-off run.
    pub fn to_result(&self, timeout: Duration) -> ExecResult {
        let mut result = ExecResult {
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            truncated: self.truncated,
            duration_ms: millis(self.elapsed),
            ..ExecResult::default()
        };
        match &self.end {
            End::Finished(reply) => {
                result.exit_code = reply.exit.map(|exit| exit.shell_code());
                result.signal = reply.exit.and_then(|exit| exit.signal);
                result.timed_out = reply.timed_out;
                result.oom_killed = self.oom.map(|oom| oom.to_string());
                if reply.timed_out {
                    result.error = Some(format!(
                        "Timed out after {} s and it was killed with all it started; the output \
                         above is what it printed until then. Re-run with a larger \
                         timeout_seconds (at most 300), or start it with spawn and poll \
                         with logs.",
                        timeout.as_secs()
                    ));
                }
            }
            End::Failed(error) => {
                result.error = Some(format!(
                    "The run was cut off: {}; the output above is what arrived before. The \
                     sandbox's agent may be gone: if ps also fails, release the sandbox and \
                     create a new one.",
                    sandbox_vmm::error_chain(error)
                ));
            }
            End::NoReply => {
                result.timed_out = true;
                result.error = Some(format!(
                    "No reply {} s past the {} s timeout; the run was cancelled (its process \
                     group killed). The output above is what arrived before.",
                    EXEC_DEADLINE_GRACE_SECS,
                    timeout.as_secs()
                ));
            }
        }
        result
    }
}

/// Runs `request` streamed (its `stream` flag is set here) with `timeout`.
pub async fn run(client: &Client, mut request: ExecRequest, timeout: Duration) -> Collected {
    let started = Instant::now();
    request.timeout_ms = Some(millis(timeout));
    let mut collected = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        truncated: false,
        started: false,
        end: End::NoReply,
        oom: None,
        elapsed: Duration::ZERO,
    };
    let mut stream = match client.exec_stream(request) {
        Ok(stream) => stream,
        Err(error) => {
            collected.end = End::Failed(error);
            return collected;
        }
    };
    let deadline = started + timeout + Duration::from_secs(EXEC_DEADLINE_GRACE_SECS + 1);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = tokio::time::sleep_until(deadline) => {
                let cancel = stream.cancel();
                let _ = tokio::time::timeout(Duration::from_millis(CANCEL_WAIT_MS), cancel).await;
                collected.end = End::NoReply;
                break;
            }
        };
        match event {
            Ok(ExecEvent::Started(_)) => collected.started = true,
            Ok(ExecEvent::Output(chunk)) => collected.push(chunk),
            Ok(ExecEvent::Finished(reply)) => {
                collected.oom = client.exec_oom_kill(&reply).await;
                collected.end = End::Finished(reply);
                break;
            }
            Err(error) => {
                collected.end = End::Failed(error);
                break;
            }
        }
    }
    collected.elapsed = started.elapsed();
    collected
}

impl Collected {
    fn push(&mut self, chunk: OutputChunk) {
        let buffer = match chunk.stream {
            Stream::Stdout | Stream::Pty => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        let room = EXEC_OUTPUT_CAP_BYTES.saturating_sub(buffer.len());
        if chunk.data.len() > room {
            self.truncated = true;
        }
        buffer.extend_from_slice(&chunk.data[..chunk.data.len().min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> Collected {
        Collected {
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
            started: true,
            end: End::NoReply,
            oom: None,
            elapsed: Duration::ZERO,
        }
    }

    fn chunk(stream: Stream, len: usize) -> OutputChunk {
        OutputChunk {
            stream,
            offset: 0,
            data: vec![b'x'; len],
        }
    }

    #[test]
    fn each_stream_keeps_its_first_mebibyte() {
        let mut collected = empty();
        collected.push(chunk(Stream::Stdout, EXEC_OUTPUT_CAP_BYTES - 1));
        assert!(!collected.truncated);
        collected.push(chunk(Stream::Stdout, 2));
        collected.push(chunk(Stream::Stderr, 5));
        assert!(collected.truncated);
        assert_eq!(collected.stdout.len(), EXEC_OUTPUT_CAP_BYTES);
        assert_eq!(collected.stderr.len(), 5);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let mut collected = empty();
        collected.push(OutputChunk {
            stream: Stream::Stdout,
            offset: 0,
            data: vec![b'a', 0xff, b'b'],
        });
        let result = collected.to_result(Duration::from_secs(1));
        assert_eq!(result.stdout, "a\u{fffd}b");
        assert!(result.error.is_some(), "no reply is a cut-off run");
    }
}
