//! `wait-for (--file PATH | --pid PID) TEXT`: wait until a guest file or a tracked
//! process's output contains TEXT, and print where it was found. The agent does the
//! watching; a timeout exits [`EXIT_TIMED_OUT`] like `exec`'s, with the agent's
//! message (what it saw) on stderr.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use anyhow::{bail, Context};
use sandbox_protocol::{ErrorKind, Pid, TextFound, WaitTarget};
use sandbox_vmm::client::Client;

use crate::args::WaitForArgs;
use crate::json::{stream_name, FoundView};
use crate::output::{self, print_json_line};
use crate::run::EXIT_TIMED_OUT;

/// Waits and prints `offset N[ (stream)] after T s: LINE`, or JSON.
pub(crate) async fn wait_for(client: &Client, args: &WaitForArgs) -> anyhow::Result<u8> {
    let (target, what) = match (&args.file, args.pid) {
        (Some(path), None) => (
            WaitTarget::File(path.as_os_str().as_bytes().to_vec()),
            path.display().to_string(),
        ),
        (None, Some(pid)) => (WaitTarget::Output(Pid(pid)), format!("process {pid}")),
        // clap requires exactly one.
        _ => bail!("wait-for takes exactly one of --file and --pid"),
    };
    let timeout = args.timeout.map(timeout).transpose()?;
    let result = client
        .wait_for_text(target, args.text.as_str(), timeout)
        .await;
    let found = match result {
        Ok(found) => found,
        Err(error) if error.wire_kind() == Some(ErrorKind::TimedOut) => {
            // The agent's message says how long and what it saw.
            let message = match &error {
                sandbox_vmm::client::ClientError::Agent(wire) => wire.message.clone(),
                other => other.to_string(),
            };
            eprintln!("sandboxctl: {message}");
            return Ok(EXIT_TIMED_OUT);
        }
        Err(error) => return Err(error).with_context(|| format!("wait-for on {what} failed")),
    };
    if args.json {
        print_json_line(&FoundView::from(&found))?;
    } else {
        output::print(&format!("{}\n", human(&found)))?;
    }
    Ok(0)
}

/// A timeout in seconds: 0 (look once) or more.
fn timeout(secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs >= 0.0) {
        bail!("--timeout must be a number of seconds, 0 or more, not {secs}");
    }
    Duration::try_from_secs_f64(secs).with_context(|| format!("--timeout {secs} is out of range"))
}

/// `offset 15 (stderr) after 1.2 s: warn: listening on :8080`
fn human(found: &TextFound) -> String {
    let stream = found
        .stream
        .map(|stream| format!(" ({})", stream_name(stream)))
        .unwrap_or_default();
    let waited = Duration::from_millis(found.waited_ms).as_secs_f64();
    format!(
        "offset {}{stream} after {waited:.1} s: {}",
        found.offset, found.line
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::Stream;

    #[test]
    fn the_human_line_says_where_and_when() {
        let found = TextFound {
            offset: 15,
            stream: Some(Stream::Stderr),
            line: "warn: listening on :8080".into(),
            waited_ms: 1234,
        };
        assert_eq!(
            human(&found),
            "offset 15 (stderr) after 1.2 s: warn: listening on :8080"
        );
        let in_file = TextFound {
            stream: None,
            waited_ms: 0,
            ..found
        };
        assert_eq!(
            human(&in_file),
            "offset 15 after 0.0 s: warn: listening on :8080"
        );
    }

    #[test]
    fn timeouts_may_be_zero_but_not_negative() {
        assert_eq!(timeout(0.0).unwrap(), Duration::ZERO);
        assert_eq!(timeout(2.5).unwrap(), Duration::from_millis(2500));
        assert!(timeout(-1.0).is_err());
        assert!(timeout(f64::NAN).is_err());
    }
}
