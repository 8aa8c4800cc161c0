//! The `exec` tool's run: a streaming exec whose output is collected here, so a run
//! that is cut off (its timeout, a lost connection, the tool-call cap) still returns
//! everything that arrived before the cut.
//!
//! Each stream goes into a [`Capture`] that keeps its first and last `max_bytes`
//! (the caller's, at most [`EXEC_MAX_BYTES`]); once the run has ended, the part its
//! outcome calls for is cut from them ([`Keep::part`]: the tail of a failure), to
//! at most `max_bytes` as the result's JSON encodes it (control bytes take six). The
//! last line printed so far is the call's progress message. The agent
//! kills the command and all it started (its cgroup, or its process group on an agent
//! without cgroups) at the timeout and replies within [`EXEC_DEADLINE_GRACE_SECS`];
//! if it does not, this side gives up one second later and cancels the request,
//! which kills the same way. A command that ended by `SIGKILL` is looked up once
//! more (`ps_detail`), so a kill by the OOM killer is reported as such.

use std::time::Duration;

use sandbox_protocol::limits::{EXEC_DEADLINE_GRACE_SECS, EXEC_OUTPUT_CAP_BYTES, MAX_FRAME_BYTES};
use sandbox_protocol::{ExecReply, ExecRequest, OomKill, OutputChunk, Stream};
use sandbox_vmm::client::{Client, ClientError, ExecEvent};
use tokio::time::Instant;

use crate::output::{size, Capture, Keep};
use crate::progress::Progress;
use crate::render::ExecResult;
use sandbox_engine::util::millis;

/// What `exec` returns of each stream without `max_bytes`: about a screenful of a
/// build log's end, a few thousand tokens.
pub const EXEC_DEFAULT_MAX_BYTES: usize = 16 * 1024;

/// The most `exec` returns of each stream.
pub const EXEC_MAX_BYTES: usize = EXEC_OUTPUT_CAP_BYTES;

/// The most stdin an `exec` takes: it travels in the one request frame
/// ([`MAX_FRAME_BYTES`]), with room left for the command and its environment.
pub const EXEC_STDIN_MAX_BYTES: usize = MAX_FRAME_BYTES - 1024 * 1024;

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
    pub stdout: Capture,
    /// Errors so far.
    pub stderr: Capture,
    /// The most of each stream the result returns.
    pub max_bytes: usize,
    /// Which part of a longer stream it returns.
    pub keep: Keep,
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
        let failed = match &self.end {
            End::Finished(reply) => {
                reply.timed_out || reply.exit.is_none_or(|exit| exit.shell_code() != 0)
            }
            End::Failed(_) | End::NoReply => true,
        };
        let part = self.keep.part(failed);
        let stdout = self.stdout.keep_encoded(part, self.max_bytes);
        let stderr = self.stderr.keep_encoded(part, self.max_bytes);
        let truncated = stdout.omitted > 0 || stderr.omitted > 0;
        let mut result = ExecResult {
            stdout: stdout.text,
            stderr: stderr.text,
            stdout_bytes: stdout.total,
            stderr_bytes: stderr.total,
            truncated,
            kept: truncated.then(|| part.as_str().to_owned()),
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
                         with logs (or wait_for_text).",
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

/// How a run's output is returned.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The most of each stream returned.
    pub max_bytes: usize,
    /// Which part of a longer one.
    pub keep: Keep,
}

/// Runs `request` streamed (its `stream` flag is set here) with `timeout`,
/// reporting the last line of output as `progress`.
pub async fn run(
    client: &Client,
    mut request: ExecRequest,
    timeout: Duration,
    shape: Shape,
    progress: &Progress,
) -> Collected {
    let started = Instant::now();
    request.timeout_ms = Some(millis(timeout));
    let mut collected = Collected {
        stdout: Capture::new(shape.max_bytes),
        stderr: Capture::new(shape.max_bytes),
        max_bytes: shape.max_bytes,
        keep: shape.keep,
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
            Ok(ExecEvent::Started(pid)) => {
                collected.started = true;
                progress.set_status(format!("exec: running as pid {}", pid.0));
            }
            Ok(ExecEvent::Output(chunk)) => {
                let stream = chunk.stream;
                collected.push(&chunk);
                if progress.is_on() {
                    progress.set_status(collected.status(stream));
                }
            }
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
    fn push(&mut self, chunk: &OutputChunk) {
        match chunk.stream {
            Stream::Stdout | Stream::Pty => self.stdout.push(&chunk.data),
            Stream::Stderr => self.stderr.push(&chunk.data),
        }
    }

    /// The progress message after output on `stream`: sizes and its last line.
    fn status(&self, stream: Stream) -> String {
        let (name, capture) = match stream {
            Stream::Stdout | Stream::Pty => ("stdout", &self.stdout),
            Stream::Stderr => ("stderr", &self.stderr),
        };
        let total = self.stdout.total() + self.stderr.total();
        match capture.last_line() {
            Some(line) => format!("exec: {} of output; {name}: {line}", size(total)),
            None => format!("exec: {} of output", size(total)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> Collected {
        Collected {
            stdout: Capture::new(EXEC_MAX_BYTES),
            stderr: Capture::new(EXEC_MAX_BYTES),
            max_bytes: EXEC_MAX_BYTES,
            keep: Keep::Head,
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
    fn each_stream_keeps_its_max_bytes() {
        let mut collected = empty();
        collected.push(&chunk(Stream::Stdout, EXEC_MAX_BYTES - 1));
        collected.push(&chunk(Stream::Stdout, 2));
        collected.push(&chunk(Stream::Stderr, 5));
        let result = collected.to_result(Duration::from_secs(1));
        assert!(result.truncated);
        assert_eq!(result.kept.as_deref(), Some("head"));
        assert_eq!(result.stdout_bytes, EXEC_MAX_BYTES as u64 + 1);
        // The marker line counts against max_bytes too.
        assert!(
            result.stdout.ends_with(" omitted ...]\n"),
            "{}",
            &result.stdout[result.stdout.len() - 40..]
        );
        assert!(crate::output::json_len(&result.stdout) <= EXEC_MAX_BYTES);
        assert_eq!(result.stderr, "xxxxx");
    }

    #[test]
    fn a_failed_run_keeps_the_tail_where_the_error_is() {
        let mut collected = Collected {
            stdout: Capture::new(64),
            stderr: Capture::new(64),
            max_bytes: 64,
            keep: Keep::Auto,
            ..empty()
        };
        for n in 0..100 {
            collected.push(&OutputChunk {
                stream: Stream::Stdout,
                offset: 0,
                data: format!("step {n:03}\n").into_bytes(),
            });
        }
        collected.push(&OutputChunk {
            stream: Stream::Stdout,
            offset: 0,
            data: b"error: it broke\n".to_vec(),
        });
        let result = collected.to_result(Duration::from_secs(1));
        assert_eq!(
            result.kept.as_deref(),
            Some("tail"),
            "no reply counts as failed"
        );
        assert!(
            result.stdout.ends_with("step 099\nerror: it broke\n"),
            "{}",
            result.stdout
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let mut collected = empty();
        collected.push(&OutputChunk {
            stream: Stream::Stdout,
            offset: 0,
            data: vec![b'a', 0xff, b'b'],
        });
        let result = collected.to_result(Duration::from_secs(1));
        assert_eq!(result.stdout, "a\u{fffd}b");
        assert!(result.error.is_some(), "no reply is a cut-off run");
    }
}
