//! QMP on the wire: lines in, messages out. No commands and no deadlines here.
//!
//! QEMU ends every message with `\r\n` and never breaks a message across lines. A
//! line is one of four things, told apart by its key: a greeting (`QMP`), a reply
//! (`return` or `error`, echoing the command's `id`), or an event (`event`).

use std::fmt;
use std::io;

use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::OwnedReadHalf;

/// What QEMU says first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// QEMU's version.
    pub version: QemuVersion,
    /// The distribution's package string (`Debian 1:7.2+dfsg-7+deb12u18+b3`).
    pub package: String,
    /// The QMP capabilities QEMU offers (`oob`); this client enables none.
    pub capabilities: Vec<String>,
}

/// A QEMU version, `major.minor.micro`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct QemuVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Micro version.
    pub micro: u32,
}

impl fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

/// An asynchronous event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Its name (`STOP`, `RESUME`, `SHUTDOWN`, `DEVICE_DELETED`, …).
    pub name: String,
    /// Its `data` member; `Value::Null` when it has none.
    pub data: Value,
    /// When QEMU emitted it, if it said.
    pub timestamp: Option<EventTimestamp>,
}

/// An event's host wall-clock time (QEMU sends `-1, -1` when it could not read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct EventTimestamp {
    /// Seconds since the epoch.
    pub seconds: i64,
    /// Microseconds past the second.
    pub microseconds: i64,
}

/// One line from QEMU.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message {
    Greeting(Greeting),
    Return {
        id: Option<Value>,
        value: Value,
    },
    Error {
        id: Option<Value>,
        class: String,
        desc: String,
    },
    Event(Event),
}

/// Every member any message may have; which one is present says what it is.
#[derive(Deserialize)]
struct RawMessage {
    #[serde(rename = "QMP")]
    greeting: Option<RawGreeting>,
    #[serde(rename = "return")]
    value: Option<Value>,
    error: Option<RawError>,
    event: Option<String>,
    #[serde(default)]
    data: Value,
    timestamp: Option<EventTimestamp>,
    id: Option<Value>,
}

#[derive(Deserialize)]
struct RawGreeting {
    version: RawVersion,
    #[serde(default)]
    capabilities: Vec<String>,
}

#[derive(Deserialize)]
struct RawVersion {
    qemu: QemuVersion,
    #[serde(default)]
    package: String,
}

#[derive(Deserialize)]
struct RawError {
    class: String,
    desc: String,
}

/// Parses one line (without its line end).
pub(crate) fn parse_message(line: &[u8]) -> Result<Message, serde_json::Error> {
    let raw: RawMessage = serde_json::from_slice(line)?;
    if let Some(value) = raw.value {
        return Ok(Message::Return { id: raw.id, value });
    }
    if let Some(RawError { class, desc }) = raw.error {
        return Ok(Message::Error {
            id: raw.id,
            class,
            desc,
        });
    }
    if let Some(name) = raw.event {
        return Ok(Message::Event(Event {
            name,
            data: raw.data,
            timestamp: raw.timestamp,
        }));
    }
    if let Some(RawGreeting {
        version,
        capabilities,
    }) = raw.greeting
    {
        return Ok(Message::Greeting(Greeting {
            version: version.qemu,
            package: version.package,
            capabilities,
        }));
    }
    Err(serde::de::Error::custom(
        "neither a greeting, a reply nor an event",
    ))
}

/// Why no line came.
#[derive(Debug)]
pub(crate) enum LineError {
    /// The stream ended (a partial last line is dropped).
    Eof,
    /// Reading failed.
    Io(io::Error),
    /// The line is longer than the limit. Its rest is skipped by the next call.
    TooLong,
}

/// Splits a stream into lines of at most `max` bytes; an oversize line is dropped as
/// it comes, never held whole.
///
/// Cancel-safe: the only await is `fill_buf`, and a partial line is kept here, so a
/// caller that times out and calls again loses nothing.
#[derive(Debug)]
pub(crate) struct LineReader {
    inner: BufReader<OwnedReadHalf>,
    /// The line so far.
    line: Vec<u8>,
    /// Skipping the rest of a line that was too long.
    discarding: bool,
    max: usize,
}

impl LineReader {
    pub(crate) fn new(read: OwnedReadHalf, max: usize) -> Self {
        Self {
            inner: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            max,
        }
    }

    /// The next line, without `\n` or `\r\n`.
    pub(crate) async fn next_line(&mut self) -> Result<Vec<u8>, LineError> {
        loop {
            let buf = self.inner.fill_buf().await.map_err(LineError::Io)?;
            if buf.is_empty() {
                return Err(LineError::Eof);
            }
            let newline = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..newline.unwrap_or(buf.len())];
            let used = newline.map_or(buf.len(), |at| at + 1);
            if self.discarding {
                // The rest of an oversize line, already reported.
                self.discarding = newline.is_none();
                self.inner.consume(used);
                continue;
            }
            if self.line.len() + chunk.len() > self.max {
                // Freed, not cleared: the buffer may have grown to near the limit.
                self.line = Vec::new();
                self.discarding = newline.is_none();
                self.inner.consume(used);
                return Err(LineError::TooLong);
            }
            self.line.extend_from_slice(chunk);
            self.inner.consume(used);
            if newline.is_some() {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    /// Verbatim from QEMU 7.2.22 on Debian 12.
    const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}, "capabilities": ["oob"]}}"#;

    #[test]
    fn the_greeting_gives_version_package_and_capabilities() {
        let Message::Greeting(greeting) = parse_message(GREETING.as_bytes()).unwrap() else {
            panic!("not a greeting");
        };
        assert_eq!(
            greeting.version,
            QemuVersion {
                major: 7,
                minor: 2,
                micro: 22
            }
        );
        assert_eq!(greeting.version.to_string(), "7.2.22");
        assert_eq!(greeting.package, "Debian 1:7.2+dfsg-7+deb12u18+b3");
        assert_eq!(greeting.capabilities, ["oob"]);
    }

    #[test]
    fn replies_errors_and_events_are_told_apart() {
        let reply = br#"{"return": {"status": "prelaunch", "singlestep": false, "running": false}, "id": 3}"#;
        assert_eq!(
            parse_message(reply).unwrap(),
            Message::Return {
                id: Some(Value::from(3)),
                value: serde_json::json!({"status": "prelaunch", "singlestep": false, "running": false}),
            }
        );
        let empty = br#"{"return": {}}"#;
        assert!(matches!(
            parse_message(empty).unwrap(),
            Message::Return { id: None, .. }
        ));
        let error = br#"{"error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}, "id": 4}"#;
        assert_eq!(
            parse_message(error).unwrap(),
            Message::Error {
                id: Some(Value::from(4)),
                class: "CommandNotFound".into(),
                desc: "The command nope has not been found".into(),
            }
        );
        let event =
            br#"{"timestamp": {"seconds": 1796114028, "microseconds": 296916}, "event": "RESUME"}"#;
        assert_eq!(
            parse_message(event).unwrap(),
            Message::Event(Event {
                name: "RESUME".into(),
                data: Value::Null,
                timestamp: Some(EventTimestamp {
                    seconds: 1796114028,
                    microseconds: 296916
                }),
            })
        );
        let with_data = br#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}"#;
        let Message::Event(event) = parse_message(with_data).unwrap() else {
            panic!("not an event");
        };
        assert_eq!(event.data["reason"], "host-qmp-quit");
    }

    #[test]
    fn bad_json_and_foreign_objects_are_rejected() {
        for line in [
            &b"{"[..],
            b"",
            b"[1, 2]",
            b"\"QMP\"",
            br#"{"hello": 1}"#,
            br#"{"error": "no class"}"#,
            br#"{"QMP": {"version": 7}}"#,
        ] {
            assert!(parse_message(line).is_err(), "{:?}", line.escape_ascii());
        }
    }

    async fn reader_with(bytes: Vec<Vec<u8>>, max: usize) -> LineReader {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            for chunk in bytes {
                theirs.write_all(&chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        LineReader::new(ours.into_split().0, max)
    }

    #[tokio::test]
    async fn lines_split_across_reads_are_joined_and_lose_their_line_ends() {
        let chunks = vec![b"{\"a\"".to_vec(), b": 1}\r\n{\"b\": 2}\n{\"c".to_vec()];
        let mut reader = reader_with(chunks, 64).await;
        assert_eq!(reader.next_line().await.unwrap(), b"{\"a\": 1}");
        assert_eq!(reader.next_line().await.unwrap(), b"{\"b\": 2}");
        // A partial last line is not a line.
        assert!(matches!(reader.next_line().await, Err(LineError::Eof)));
    }

    #[tokio::test]
    async fn an_oversize_line_is_an_error_and_the_next_line_still_comes() {
        let max = 1 << 20;
        let huge = vec![b'x'; max + 10];
        let chunks = vec![huge, b"yyyy\r\n{\"ok\": 1}\r\n".to_vec()];
        let mut reader = reader_with(chunks, max).await;
        assert!(matches!(reader.next_line().await, Err(LineError::TooLong)));
        assert_eq!(reader.line.capacity(), 0, "kept the oversize line's buffer");
        assert_eq!(reader.next_line().await.unwrap(), b"{\"ok\": 1}");
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_passes() {
        let chunks = vec![b"12345678\n123456789\nok\n".to_vec()];
        let mut reader = reader_with(chunks, 8).await;
        assert_eq!(reader.next_line().await.unwrap(), b"12345678");
        assert!(matches!(reader.next_line().await, Err(LineError::TooLong)));
        assert_eq!(reader.next_line().await.unwrap(), b"ok");
    }
}
