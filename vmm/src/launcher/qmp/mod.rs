//! A typed QMP client: the launcher's control channel into a running QEMU.
//!
//! Snapshots drive QEMU while it runs: pause it, stream its device state out
//! (`migrate`), start a second QEMU that reads it back (`-incoming defer`, then
//! `migrate-incoming`), move a disk onto a fresh overlay. All of that is QMP, the JSON
//! protocol QEMU serves on `-qmp unix:PATH,server=on,wait=off`. The protocol is small,
//! so this is a client of our own (serde_json and tokio) rather than a dependency.
//!
//! # The protocol, as this client speaks it
//! - One JSON object per line each way. QEMU greets (`{"QMP": …}`), the client answers
//!   `qmp_capabilities`, then sends one command at a time ([`Qmp::execute`] takes
//!   `&mut self`).
//! - Every command carries an `id` that QEMU echoes in its reply, so the reply to a
//!   command whose caller gave up (a timeout) is recognised when it comes late and
//!   dropped: it is never taken for the answer to the next command.
//! - Events (`STOP`, `RESUME`, `DEVICE_DELETED`, …) arrive at any time between replies.
//!   They wait in a bounded queue ([`EVENT_QUEUE_LEN`], oldest dropped first) for
//!   [`Qmp::wait_event`] or [`Qmp::take_events`].
//! - Nothing waits unbounded: every command has a deadline
//!   ([`DEFAULT_COMMAND_TIMEOUT_SECS`] unless set), a line over [`QMP_LINE_MAX_BYTES`]
//!   is an error whose rest is skipped unbuffered, and a QEMU that exits or dies shows
//!   as [`QmpError::Closed`].
//!
//! # Layout
//! - this file: [`Qmp`] (connect, execute, events) and [`QmpError`].
//! - [`wire`]: the line reader and the message parser; no commands.
//! - [`commands`]: the typed helpers snapshots use ([`Qmp::stop`], [`Qmp::migrate`],
//!   [`Qmp::blockdev_snapshot_sync`], …) and the types they return.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::time::Instant;

pub mod commands;
pub mod wire;

pub use commands::{BlockDevice, MigrationStats, MigrationStatus, RunState};
pub use wire::{Event, EventTimestamp, Greeting, QemuVersion};

use wire::{LineError, LineReader, Message};

/// The longest line accepted from QEMU. The largest replies the launcher asks for
/// (`query-block`, `query-migrate`) are a few KiB; a longer line means a broken peer.
pub const QMP_LINE_MAX_BYTES: usize = 1 << 20;

/// How many unclaimed events are kept; beyond it the oldest is dropped.
pub const EVENT_QUEUE_LEN: usize = 256;

/// How long a command may take to be answered unless set otherwise
/// ([`Qmp::set_command_timeout`]). QMP is served by QEMU's main loop, not a vCPU, so
/// even a busy TCG guest answers in milliseconds; ten seconds means QEMU is hung.
pub const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 10;

/// How often [`Qmp::connect`] looks for the socket while QEMU starts (QEMU 7.2 creates
/// it about 15 ms after exec on an idle host).
const CONNECT_POLL: Duration = Duration::from_millis(5);

/// How many leading bytes of a bad line an error quotes.
const QUOTED_BYTES: usize = 120;

/// What went wrong talking to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket did not accept a connection in time (QEMU not started, or gone).
    #[error("Cannot connect to the QMP socket {} within {timeout:?}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The deadline.
        timeout: Duration,
        /// The last attempt's error.
        #[source]
        error: io::Error,
    },
    /// The first message was not a QMP greeting.
    #[error("The peer is not a QMP server: it greeted with {message}")]
    Greeting {
        /// What it sent instead, quoted.
        message: String,
    },
    /// Writing a command failed.
    #[error("Cannot send {command} to QEMU")]
    Send {
        /// The command.
        command: String,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// Reading from the socket failed.
    #[error("Cannot read from QEMU while waiting for {waiting_for}")]
    Receive {
        /// What the client was waiting for.
        waiting_for: String,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// QEMU closed the connection (end of stream or reset): it exited, or was killed.
    #[error("QEMU closed the QMP connection while the client waited for {waiting_for}")]
    Closed {
        /// What the client was waiting for.
        waiting_for: String,
    },
    /// QEMU sent a line longer than [`QMP_LINE_MAX_BYTES`]; its rest is skipped.
    #[error("QEMU sent a line over {QMP_LINE_MAX_BYTES} bytes while the client waited for {waiting_for}")]
    LineTooLong {
        /// What the client was waiting for.
        waiting_for: String,
    },
    /// A line was not JSON, or not a QMP message.
    #[error("QEMU sent a malformed QMP message while the client waited for {waiting_for}: {line}")]
    Malformed {
        /// What the client was waiting for.
        waiting_for: String,
        /// The start of the line, quoted.
        line: String,
        /// Why it was rejected.
        #[source]
        error: serde_json::Error,
    },
    /// Nothing came in time: QEMU is hung, or the awaited thing never happened.
    #[error("Gave up after {timeout:?} waiting for {waiting_for}")]
    Timeout {
        /// What the client was waiting for.
        waiting_for: String,
        /// The deadline.
        timeout: Duration,
    },
    /// An earlier command was abandoned halfway through being written (its future was
    /// dropped or timed out mid-write), so the stream can no longer be trusted.
    #[error("The QMP connection is unusable: an earlier command was cut off while being sent")]
    Interrupted,
    /// QEMU answered with an `error` reply.
    #[error("QEMU refused {command}: {desc} ({class})")]
    Command {
        /// The command.
        command: String,
        /// QEMU's error class (`GenericError`, `CommandNotFound`, …).
        class: String,
        /// QEMU's description.
        desc: String,
    },
    /// A reply did not have the shape a typed helper expects.
    #[error("QEMU's answer to {command} has an unexpected shape")]
    Answer {
        /// The command.
        command: String,
        /// Why it did not decode.
        #[source]
        error: serde_json::Error,
    },
    /// An outgoing migration ended in `failed`.
    #[error("The migration failed: {desc}")]
    MigrationFailed {
        /// QEMU's `error-desc`, or a note that it gave none.
        desc: String,
    },
    /// An outgoing migration was cancelled.
    #[error("The migration was cancelled")]
    MigrationCancelled,
    /// A path that must travel in JSON is not UTF-8.
    #[error("{} is not UTF-8, which QMP needs", path.display())]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
}

/// A point in time to give up at, and the timeout it came from (for the error).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The earlier of the two.
    pub(crate) fn min(self, other: Self) -> Self {
        if other.at < self.at {
            other
        } else {
            self
        }
    }

    pub(crate) fn expired(&self, waiting_for: impl Into<String>) -> QmpError {
        QmpError::Timeout {
            waiting_for: waiting_for.into(),
            timeout: self.timeout,
        }
    }
}

/// A QMP session with one QEMU. Commands go one at a time; events that arrive in
/// between are queued. Dropping it closes the connection (QEMU keeps running and
/// accepts a new one).
///
/// A command future dropped while waiting for its reply costs nothing (the reply is
/// dropped when it comes); one dropped halfway through sending makes every later call
/// fail with [`QmpError::Interrupted`].
#[derive(Debug)]
pub struct Qmp {
    reader: LineReader,
    writer: OwnedWriteHalf,
    greeting: Greeting,
    events: VecDeque<Event>,
    next_id: u64,
    command_timeout: Duration,
    /// Set while a command is being written; still set afterwards means the write was
    /// cut off.
    sending: bool,
}

impl Qmp {
    /// Connects to the QMP socket at `path` and negotiates capabilities. QEMU creates
    /// the socket shortly after it starts, so a missing socket (or one nobody listens
    /// on yet) is retried until `timeout`, which bounds the whole handshake.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let deadline = Deadline::after(timeout);
        let stream = connect_socket(path, deadline).await?;
        Self::handshake(stream, deadline).await
    }

    /// Reads the greeting from a connected stream and sends `qmp_capabilities`.
    async fn handshake(stream: UnixStream, deadline: Deadline) -> Result<Self, QmpError> {
        let (read, writer) = stream.into_split();
        let mut reader = LineReader::new(read, QMP_LINE_MAX_BYTES);
        const WAITING_FOR: &str = "the QMP greeting";
        let greeting = match receive(&mut reader, WAITING_FOR, deadline).await? {
            Message::Greeting(greeting) => greeting,
            other => {
                return Err(QmpError::Greeting {
                    message: format!("{other:?}"),
                })
            }
        };
        tracing::debug!(version = %greeting.version, "QMP greeting");
        let mut qmp = Self {
            reader,
            writer,
            greeting,
            events: VecDeque::new(),
            next_id: 1,
            command_timeout: Duration::from_secs(DEFAULT_COMMAND_TIMEOUT_SECS),
            sending: false,
        };
        qmp.execute_by("qmp_capabilities", Value::Null, deadline)
            .await?;
        Ok(qmp)
    }

    /// QEMU's greeting: its version and QMP capabilities.
    pub fn greeting(&self) -> &Greeting {
        &self.greeting
    }

    /// How long each command may take to be answered.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Sets how long each command may take to be answered.
    pub fn set_command_timeout(&mut self, timeout: Duration) {
        self.command_timeout = timeout;
    }

    /// Runs `command` with `arguments` (a JSON object, or `Value::Null` for none) and
    /// returns its `return` value. An `error` reply is [`QmpError::Command`]; no reply
    /// within the command timeout is [`QmpError::Timeout`].
    pub async fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let deadline = Deadline::after(self.command_timeout);
        self.execute_by(command, arguments, deadline).await
    }

    /// [`Qmp::execute`] with an explicit deadline.
    pub(crate) async fn execute_by(
        &mut self,
        command: &str,
        arguments: Value,
        deadline: Deadline,
    ) -> Result<Value, QmpError> {
        let id = self.send(command, arguments, None, deadline).await?;
        self.reply_to(command, &id, deadline).await
    }

    /// Hands QEMU the open file `file` under `name` (QMP `getfd`: the descriptor rides
    /// the command's message as `SCM_RIGHTS`), for a later `fd:NAME` migration URI.
    /// QEMU keeps its own copy of the descriptor; a second `getfd` of the same name
    /// replaces (and closes) the first.
    pub async fn send_fd(&mut self, name: &str, file: &impl AsFd) -> Result<(), QmpError> {
        const COMMAND: &str = "getfd";
        let deadline = Deadline::after(self.command_timeout);
        let arguments = serde_json::json!({ "fdname": name });
        let id = self
            .send(COMMAND, arguments, Some(file.as_fd()), deadline)
            .await?;
        self.reply_to(COMMAND, &id, deadline).await.map(drop)
    }

    /// Reads until the reply to `command` (sent as `id`) arrives, queueing events.
    async fn reply_to(
        &mut self,
        command: &str,
        id: &Value,
        deadline: Deadline,
    ) -> Result<Value, QmpError> {
        loop {
            match receive(&mut self.reader, command, deadline).await? {
                Message::Return {
                    id: Some(got),
                    value,
                } if got == *id => return Ok(value),
                // An error without an id answers a command QEMU could not parse: ours,
                // as only one is in flight.
                Message::Error {
                    id: reply_id,
                    class,
                    desc,
                } if reply_id.as_ref().is_none_or(|got| got == id) => {
                    return Err(QmpError::Command {
                        command: command.to_owned(),
                        class,
                        desc,
                    })
                }
                Message::Event(event) => self.queue(event),
                other => tracing::debug!(command, ?other, "dropping a stale QMP reply"),
            }
        }
    }

    /// Waits for the next event named `name` (`"DEVICE_DELETED"`, `"STOP"`, …), taking
    /// it out of the queue if it already arrived. Other events are queued meanwhile.
    pub async fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<Event, QmpError> {
        if let Some(index) = self.events.iter().position(|event| event.name == name) {
            if let Some(event) = self.events.remove(index) {
                return Ok(event);
            }
        }
        let deadline = Deadline::after(timeout);
        let waiting_for = format!("event {name}");
        loop {
            match receive(&mut self.reader, &waiting_for, deadline).await? {
                Message::Event(event) if event.name == name => return Ok(event),
                Message::Event(event) => self.queue(event),
                other => tracing::debug!(?other, "dropping a stale QMP reply"),
            }
        }
    }

    /// Takes every queued event, oldest first.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// Writes one command line; returns the id it carries.
    async fn send(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<BorrowedFd<'_>>,
        deadline: Deadline,
    ) -> Result<Value, QmpError> {
        if self.sending {
            return Err(QmpError::Interrupted);
        }
        let id = Value::from(self.next_id);
        self.next_id += 1;
        let mut message = serde_json::json!({ "execute": command, "id": id });
        if !arguments.is_null() {
            message["arguments"] = arguments;
        }
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        self.sending = true;
        let write = async {
            let mut rest: &[u8] = &line;
            if let Some(fd) = fd {
                let sent = send_with_fd(self.writer.as_ref(), rest, fd).await?;
                rest = &rest[sent..];
            }
            self.writer.write_all(rest).await
        };
        let written = tokio::time::timeout_at(deadline.at, write).await;
        let Ok(written) = written else {
            // Cut off mid-line: `sending` stays set.
            return Err(deadline.expired(format!("QEMU to take {command}")));
        };
        // A failed write leaves no stream to desynchronise: later writes fail alike.
        self.sending = false;
        match written {
            Ok(()) => Ok(id),
            Err(error) if gone(&error) => Err(QmpError::Closed {
                waiting_for: command.to_owned(),
            }),
            Err(error) => Err(QmpError::Send {
                command: command.to_owned(),
                error,
            }),
        }
    }

    /// Queues an event, dropping the oldest when full.
    fn queue(&mut self, event: Event) {
        if self.events.len() >= EVENT_QUEUE_LEN {
            if let Some(dropped) = self.events.pop_front() {
                tracing::debug!(event = %dropped.name, "QMP event queue full; dropped the oldest");
            }
        }
        self.events.push_back(event);
    }
}

/// Connects, retrying while the socket is missing or not yet listened on.
async fn connect_socket(path: &Path, deadline: Deadline) -> Result<UnixStream, QmpError> {
    let failed = |error| QmpError::Connect {
        path: path.to_owned(),
        timeout: deadline.timeout,
        error,
    };
    loop {
        let attempt = tokio::time::timeout_at(deadline.at, UnixStream::connect(path)).await;
        match attempt {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) if starting(&error) && !deadline.passed() => {
                tokio::time::sleep(CONNECT_POLL).await;
            }
            Ok(Err(error)) => return Err(failed(error)),
            Err(_) => return Err(failed(io::ErrorKind::TimedOut.into())),
        }
    }
}

/// Whether a connect error means "QEMU has not created or bound the socket yet".
fn starting(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

/// Whether an I/O error means the peer is gone.
/// Sends the first bytes of `bytes` with `fd` attached (`SCM_RIGHTS`); returns how
/// many went (the descriptor travels with them; the caller writes the rest).
async fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd.as_raw_fd()];
    stream
        .async_io(tokio::io::Interest::WRITABLE, || {
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[io::IoSlice::new(bytes)],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        })
        .await
}

fn gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

/// Reads and parses the next message, by `deadline`.
async fn receive(
    reader: &mut LineReader,
    waiting_for: &str,
    deadline: Deadline,
) -> Result<Message, QmpError> {
    let line = match tokio::time::timeout_at(deadline.at, reader.next_line()).await {
        Err(_) => return Err(deadline.expired(waiting_for)),
        Ok(line) => line,
    };
    let waiting_for = || waiting_for.to_owned();
    let line = line.map_err(|error| match error {
        LineError::Eof => QmpError::Closed {
            waiting_for: waiting_for(),
        },
        LineError::Io(error) if gone(&error) => QmpError::Closed {
            waiting_for: waiting_for(),
        },
        LineError::Io(error) => QmpError::Receive {
            waiting_for: waiting_for(),
            error,
        },
        LineError::TooLong => QmpError::LineTooLong {
            waiting_for: waiting_for(),
        },
    })?;
    wire::parse_message(&line).map_err(|error| QmpError::Malformed {
        waiting_for: waiting_for(),
        line: quote(&line),
        error,
    })
}

/// The start of `line`, escaped and quoted.
fn quote(line: &[u8]) -> String {
    let head = &line[..line.len().min(QUOTED_BYTES)];
    let more = if line.len() > QUOTED_BYTES { "…" } else { "" };
    format!("\"{}{more}\"", head.escape_ascii())
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, BufReader, Lines};
    use tokio::net::unix::OwnedReadHalf;

    const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}, "capabilities": ["oob"]}}"#;

    /// The QEMU end of a socket pair, scripted by the test.
    pub(crate) struct Peer {
        lines: Lines<BufReader<OwnedReadHalf>>,
        writer: OwnedWriteHalf,
    }

    impl Peer {
        /// Reads the next command: its name, arguments and id.
        pub(crate) async fn command(&mut self) -> (String, Value, Value) {
            let line = self.lines.next_line().await.unwrap().unwrap();
            let command: Value = serde_json::from_str(&line).unwrap();
            let name = command["execute"].as_str().unwrap().to_owned();
            (name, command["arguments"].clone(), command["id"].clone())
        }

        /// Sends one line, with QEMU's `\r\n`.
        pub(crate) async fn send(&mut self, line: &str) {
            self.writer
                .write_all(format!("{line}\r\n").as_bytes())
                .await
                .unwrap();
        }

        pub(crate) async fn reply(&mut self, id: &Value, value: Value) {
            self.send(&json!({ "return": value, "id": id }).to_string())
                .await;
        }

        pub(crate) async fn event(&mut self, name: &str) {
            let event = json!({
                "timestamp": { "seconds": 1, "microseconds": 2 },
                "event": name,
            });
            self.send(&event.to_string()).await;
        }
    }

    fn pair() -> (UnixStream, Peer) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (read, writer) = theirs.into_split();
        let peer = Peer {
            lines: BufReader::new(read).lines(),
            writer,
        };
        (ours, peer)
    }

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    /// A client past the handshake, and its peer.
    pub(crate) async fn session() -> (Qmp, Peer) {
        let (ours, mut peer) = pair();
        let server = async {
            peer.send(GREETING).await;
            let (name, arguments, id) = peer.command().await;
            assert_eq!(name, "qmp_capabilities");
            assert_eq!(arguments, Value::Null, "arguments sent for none");
            peer.reply(&id, json!({})).await;
        };
        let (qmp, ()) = tokio::join!(Qmp::handshake(ours, soon()), server);
        (qmp.unwrap(), peer)
    }

    #[tokio::test]
    async fn the_handshake_keeps_the_greeting() {
        let (qmp, _peer) = session().await;
        assert_eq!(qmp.greeting().version.to_string(), "7.2.22");
        assert_eq!(qmp.greeting().capabilities, ["oob"]);
    }

    #[tokio::test]
    async fn a_peer_that_does_not_greet_is_refused() {
        let (ours, mut peer) = pair();
        let (qmp, ()) = tokio::join!(Qmp::handshake(ours, soon()), async {
            peer.send(r#"{"return": {}}"#).await;
        });
        assert!(matches!(qmp, Err(QmpError::Greeting { .. })), "{qmp:?}");
        let (ours, mut peer) = pair();
        let (qmp, ()) = tokio::join!(Qmp::handshake(ours, soon()), async {
            peer.send("SSH-2.0-OpenSSH_9.2").await;
        });
        let error = qmp.unwrap_err();
        assert!(matches!(error, QmpError::Malformed { .. }), "{error:?}");
        assert!(error.to_string().contains("SSH-2.0"), "{error}");
    }

    #[tokio::test]
    async fn events_before_a_reply_are_queued_and_awaited_by_name() {
        let (mut qmp, mut peer) = session().await;
        let server = async {
            let (name, _, id) = peer.command().await;
            assert_eq!(name, "stop");
            peer.event("STOP").await;
            peer.event("OTHER").await;
            peer.reply(&id, json!({})).await;
        };
        let (stopped, ()) = tokio::join!(qmp.execute("stop", Value::Null), server);
        assert_eq!(stopped.unwrap(), json!({}));
        // Already queued: found without reading, even with no time to wait.
        let stop = qmp.wait_event("STOP", Duration::ZERO).await.unwrap();
        assert_eq!(stop.timestamp.unwrap().microseconds, 2);
        // One that has not come yet is read from the socket; others queue meanwhile.
        let (later, ()) = tokio::join!(qmp.wait_event("LATER", Duration::from_secs(5)), async {
            peer.event("THIRD").await;
            peer.event("LATER").await;
        });
        assert_eq!(later.unwrap().name, "LATER");
        let names: Vec<String> = qmp.take_events().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["OTHER", "THIRD"]);
        let error = qmp
            .wait_event("NEVER", Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(error, QmpError::Timeout { .. }), "{error:?}");
    }

    #[tokio::test]
    async fn the_queue_keeps_the_newest_events() {
        let (mut qmp, _peer) = session().await;
        for n in 0..EVENT_QUEUE_LEN + 44 {
            qmp.queue(Event {
                name: format!("E{n}"),
                data: Value::Null,
                timestamp: None,
            });
        }
        let events = qmp.take_events();
        assert_eq!(events.len(), EVENT_QUEUE_LEN);
        assert_eq!(events[0].name, "E44");
    }

    #[tokio::test]
    async fn an_error_reply_is_a_command_error_with_class_and_description() {
        let (mut qmp, mut peer) = session().await;
        let (result, ()) = tokio::join!(qmp.execute("nope", json!({ "a": 1 })), async {
            let (_, arguments, id) = peer.command().await;
            assert_eq!(arguments, json!({ "a": 1 }));
            let error = json!({
                "error": { "class": "CommandNotFound", "desc": "The command nope has not been found" },
                "id": id,
            });
            peer.send(&error.to_string()).await;
        });
        match result {
            Err(QmpError::Command {
                command,
                class,
                desc,
            }) => {
                assert_eq!(command, "nope");
                assert_eq!(class, "CommandNotFound");
                assert_eq!(desc, "The command nope has not been found");
            }
            other => panic!("{other:?}"),
        }
        // An error without an id (QEMU could not parse the command) answers it too.
        let (result, ()) = tokio::join!(qmp.execute("bad", Value::Null), async {
            peer.command().await;
            peer.send(r#"{"error": {"class": "GenericError", "desc": "JSON parse error"}}"#)
                .await;
        });
        assert!(
            matches!(result, Err(QmpError::Command { .. })),
            "{result:?}"
        );
    }

    /// Guards against a reply that comes after its command timed out being taken for
    /// the answer to the next command.
    #[tokio::test]
    async fn a_late_reply_is_not_taken_for_the_next_command() {
        let (mut qmp, mut peer) = session().await;
        qmp.set_command_timeout(Duration::from_millis(50));
        let (result, first_id) = tokio::join!(qmp.query_status(), async { peer.command().await.2 });
        let error = result.unwrap_err();
        assert!(matches!(error, QmpError::Timeout { .. }), "{error:?}");
        assert!(error.to_string().contains("query-status"), "{error}");
        qmp.set_command_timeout(Duration::from_secs(5));
        let (state, ()) = tokio::join!(qmp.query_status(), async {
            let (_, _, id) = peer.command().await;
            assert_ne!(id, first_id);
            peer.reply(&first_id, json!({ "status": "paused", "running": false }))
                .await;
            peer.reply(&id, json!({ "status": "running", "running": true }))
                .await;
        });
        assert_eq!(state.unwrap(), RunState::Running);
    }

    #[tokio::test]
    async fn an_oversize_or_malformed_line_is_an_error_and_the_session_goes_on() {
        let (mut qmp, mut peer) = session().await;
        let (result, id) = tokio::join!(qmp.execute("query-block", Value::Null), async {
            let (_, _, id) = peer.command().await;
            peer.send(&"x".repeat(QMP_LINE_MAX_BYTES + 1)).await;
            id
        });
        assert!(
            matches!(result, Err(QmpError::LineTooLong { .. })),
            "{result:?}"
        );
        let (result, ()) = tokio::join!(qmp.execute("query-block", Value::Null), async {
            let (_, _, id) = peer.command().await;
            peer.send("{not json").await;
            peer.reply(&id, json!([])).await;
        });
        let error = result.unwrap_err();
        assert!(matches!(error, QmpError::Malformed { .. }), "{error:?}");
        assert!(error.to_string().contains("{not json"), "{error}");
        // The reply after the bad line is still there; the first command's never came.
        let (result, ()) = tokio::join!(qmp.execute("query-block", Value::Null), async {
            let (_, _, next) = peer.command().await;
            assert_ne!(next, id);
            peer.reply(&next, json!([{ "device": "disk0" }])).await;
        });
        assert_eq!(result.unwrap(), json!([{ "device": "disk0" }]));
    }

    #[tokio::test]
    async fn a_peer_that_goes_away_is_closed_not_a_hang() {
        let (mut qmp, peer) = session().await;
        drop(peer);
        let error = qmp.query_status().await.unwrap_err();
        assert!(matches!(error, QmpError::Closed { .. }), "{error:?}");
        // Still an error, not a hang or a panic, when asked again.
        let error = qmp.stop().await.unwrap_err();
        assert!(matches!(error, QmpError::Closed { .. }), "{error:?}");
    }

    /// Guards against the half of a cut-off command prefixing the next one.
    #[tokio::test]
    async fn a_command_cut_off_while_sent_makes_the_session_unusable() {
        let (mut qmp, _peer) = session().await;
        qmp.set_command_timeout(Duration::from_millis(50));
        // More than the socket buffers hold, to a peer that does not read.
        let blob = "a".repeat(8 << 20);
        let error = qmp.execute("x", json!({ "blob": blob })).await.unwrap_err();
        assert!(matches!(error, QmpError::Timeout { .. }), "{error:?}");
        let error = qmp.query_status().await.unwrap_err();
        assert!(matches!(error, QmpError::Interrupted), "{error:?}");
    }

    #[tokio::test]
    async fn quit_succeeds_when_qemu_closes_before_replying() {
        let (qmp, mut peer) = session().await;
        let (result, ()) = tokio::join!(qmp.quit(), async {
            let (name, _, _) = peer.command().await;
            assert_eq!(name, "quit");
            peer.event("SHUTDOWN").await;
            drop(peer);
        });
        result.unwrap();
    }

    #[tokio::test]
    async fn connect_gives_up_on_a_socket_that_never_appears() {
        let path = std::env::temp_dir().join(format!("sbx-qmp-none-{}", std::process::id()));
        let started = Instant::now();
        let error = Qmp::connect(&path, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(error, QmpError::Connect { .. }), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(error.to_string().contains("sbx-qmp-none"), "{error}");
    }

    #[tokio::test]
    async fn getfd_carries_the_descriptor_with_its_command() {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::{FromRawFd, OwnedFd};
        use std::os::unix::fs::MetadataExt;

        let (mut qmp, peer) = session().await;
        // The peer reads with recvmsg to see the ancillary data, so it takes the raw
        // socket back from the scripted one.
        let Peer { lines, writer } = peer;
        let theirs = lines.into_inner().into_inner().reunite(writer).unwrap();
        let theirs = theirs.into_std().unwrap();
        theirs.set_nonblocking(false).unwrap();
        let file = tempfile_in_tmp("sbx-qmp-getfd");
        let sent_ino = file.metadata().unwrap().ino();
        let server = std::thread::spawn(move || {
            let mut buffer = [0u8; 512];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let mut iov = [std::io::IoSliceMut::new(&mut buffer)];
            let message = recvmsg::<()>(
                theirs.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::empty(),
            )
            .unwrap();
            let mut received = Vec::new();
            for cmsg in message.cmsgs().unwrap() {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    // SAFETY: the kernel just installed these descriptors for us.
                    received.extend(
                        fds.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            let length = message.bytes;
            let line: Value = serde_json::from_slice(&buffer[..length]).unwrap();
            let received_ino = received.first().map(|fd| {
                std::fs::File::from(fd.try_clone().unwrap())
                    .metadata()
                    .unwrap()
                    .ino()
            });
            let reply = json!({ "return": {}, "id": line["id"] }).to_string() + "\r\n";
            std::io::Write::write_all(&mut &theirs, reply.as_bytes()).unwrap();
            (line, received.len(), received_ino)
        });
        qmp.send_fd("sandbox-migration", &file).await.unwrap();
        let (line, count, received_ino) = server.join().unwrap();
        assert_eq!(line["execute"], "getfd", "{line}");
        assert_eq!(line["arguments"]["fdname"], "sandbox-migration", "{line}");
        assert_eq!(count, 1, "one descriptor with the command");
        assert_eq!(
            received_ino,
            Some(sent_ino),
            "the descriptor of the file sent"
        );
    }

    /// A new empty file under the temporary folder (removed at once: the open file
    /// is all the test needs).
    fn tempfile_in_tmp(prefix: &str) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
