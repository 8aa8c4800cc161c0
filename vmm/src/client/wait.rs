//! `wait_for_text`: until a guest file, or a tracked process's output, contains a
//! string (see [`sandbox_protocol::wait`]). The agent watches (inotify, the output
//! ring); the client only waits for the one reply. Dropping the future sends
//! `Cancel`, and the agent drops its watch.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use sandbox_protocol::{Pid, Reply, Request, TextFound, WaitForTextRequest, WaitTarget};

use super::{unexpected, Client, ClientError};

impl Client {
    /// Waits until `target` contains `text` and says where: the match's offset, its
    /// stream (for a process), the line holding it. `timeout` `None` is the agent's
    /// default ([`WAIT_DEFAULT_TIMEOUT_MS`]); past it the call fails with the agent's
    /// `TimedOut` error, and a timeout over [`WAIT_MAX_TIMEOUT_MS`] is refused
    /// (`BadRequest`). A process that exits without printing the text fails at once
    /// (`NotFound`). An agent older than this request answers `Unsupported`.
    ///
    /// [`WAIT_DEFAULT_TIMEOUT_MS`]: sandbox_protocol::wait::WAIT_DEFAULT_TIMEOUT_MS
    /// [`WAIT_MAX_TIMEOUT_MS`]: sandbox_protocol::wait::WAIT_MAX_TIMEOUT_MS
    pub async fn wait_for_text(
        &self,
        target: WaitTarget,
        text: impl Into<String>,
        timeout: Option<Duration>,
    ) -> Result<TextFound, ClientError> {
        let request = WaitForTextRequest {
            target,
            text: text.into(),
            timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        };
        match self.request(Request::WaitForText(request)).await? {
            Reply::TextFound(found) => Ok(found),
            other => Err(unexpected("wait_for_text", other)),
        }
    }

    /// [`Self::wait_for_text`] on the guest file `path` (absolute), which may not
    /// exist yet, nor its directory.
    pub async fn wait_for_file_text(
        &self,
        path: impl AsRef<Path>,
        text: impl Into<String>,
        timeout: Option<Duration>,
    ) -> Result<TextFound, ClientError> {
        let path = path.as_ref().as_os_str().as_bytes().to_vec();
        self.wait_for_text(WaitTarget::File(path), text, timeout)
            .await
    }

    /// [`Self::wait_for_text`] on the output of the tracked process `pid` (stdout
    /// and stderr, or its terminal), from the oldest byte its ring still holds.
    pub async fn wait_for_output_text(
        &self,
        pid: Pid,
        text: impl Into<String>,
        timeout: Option<Duration>,
    ) -> Result<TextFound, ClientError> {
        self.wait_for_text(WaitTarget::Output(pid), text, timeout)
            .await
    }
}
