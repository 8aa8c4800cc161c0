//! Handles for requests in flight: the raw [`RequestStream`] and the typed
//! [`ExecStream`] and [`LogsStream`] built on it.
//!
//! Dropping a handle before its final frame arrived sends `Cancel`, so abandoning a
//! streaming exec kills it with all it started, and abandoning a follow ends it on the
//! agent. Each handle reports the payload it has handed out (`Consumed`), which is
//! what lets the agent send more: a stream runs at the speed of its reader.

use std::sync::Arc;

use sandbox_protocol::limits::CONSUMED_REPORT_BYTES;
use sandbox_protocol::{
    AgentMsg, Event, ExecReply, LogsBatch, LogsReply, OutputChunk, Pid, Reply, RequestId,
};
use tokio::sync::mpsc;

use super::error::ClientError;
use super::mux::{Connection, Routed};

/// One step of a request: a progress event, or the final reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// More frames follow.
    Event(Event),
    /// The request is done.
    Reply(Reply),
}

/// A request in flight and the frames the agent sends about it.
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    what: &'static str,
    rx: mpsc::UnboundedReceiver<Routed>,
    conn: Arc<Connection>,
    finished: bool,
    /// Event payload bytes handed to the caller so far, and how many of them the
    /// agent has been told about (its stream window).
    consumed: u64,
    reported: u64,
}

impl RequestStream {
    pub(crate) fn new(
        id: RequestId,
        what: &'static str,
        rx: mpsc::UnboundedReceiver<Routed>,
        conn: Arc<Connection>,
    ) -> Self {
        Self {
            id,
            what,
            rx,
            conn,
            finished: false,
            consumed: 0,
            reported: 0,
        }
    }

    /// Counts an event handed to the caller and, every `CONSUMED_REPORT_BYTES`,
    /// tells the agent, which keeps at most its window of payload unconsumed: so a
    /// caller that reads slowly (a `get` into a slow pipe) holds at most that here.
    fn consume(&mut self, event: &Event) {
        self.consumed += event.payload_bytes();
        if self.consumed - self.reported >= CONSUMED_REPORT_BYTES && self.conn.has_stream_window() {
            self.reported = self.consumed;
            // A connection that is gone fails the next `next()` anyway.
            let _ = self.conn.send(
                self.id,
                sandbox_protocol::ClientMsg::Consumed(self.consumed),
            );
        }
    }

    /// The request id on the wire.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// True once the final reply or error has been returned.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The next event or the final reply. An agent error ends the request as `Err`.
    pub async fn next(&mut self) -> Result<Step, ClientError> {
        if self.finished {
            return Err(ClientError::Finished { request: self.what });
        }
        let routed = self.rx.recv().await;
        let step = match routed {
            Some(Routed::Msg(AgentMsg::Event(event))) => {
                self.consume(&event);
                return Ok(Step::Event(event));
            }
            Some(Routed::Msg(AgentMsg::Reply(reply))) => Ok(Step::Reply(reply)),
            Some(Routed::Msg(AgentMsg::Error(error))) => Err(ClientError::Agent(error)),
            Some(Routed::Msg(other @ AgentMsg::Hello(_))) => {
                // Not final on the wire; stop listening and tell the agent to stop.
                self.conn.abandon(self.id);
                Err(ClientError::UnexpectedReply {
                    request: self.what,
                    got: format!("{other:?}"),
                })
            }
            Some(Routed::Failed(error)) => Err(error),
            None => Err(ClientError::ConnectionLost {
                reason: self
                    .conn
                    .closed_reason()
                    .unwrap_or_else(|| Arc::from("request dropped by the connection")),
            }),
        };
        self.finished = true;
        step
    }

    /// Sends `msg` (put data) under this request's id.
    pub fn send(&self, msg: sandbox_protocol::ClientMsg) -> Result<(), ClientError> {
        if self.conn.send(self.id, msg) {
            Ok(())
        } else {
            Err(ClientError::ConnectionLost {
                reason: self
                    .conn
                    .closed_reason()
                    .unwrap_or_else(|| Arc::from("connection closed")),
            })
        }
    }

    /// Asks the agent to stop this request and waits for its final frame (the agent
    /// answers `Error(Cancelled)`, or the reply if it finished first).
    pub async fn cancel(mut self) -> Result<(), ClientError> {
        if self.finished {
            return Ok(());
        }
        self.conn.send_cancel(self.id);
        loop {
            match self.next().await {
                Ok(Step::Event(_)) => {}
                Ok(Step::Reply(_)) => return Ok(()),
                Err(ClientError::Agent(_)) => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }

    /// Skips events and returns the final reply.
    pub async fn reply(mut self) -> Result<Reply, ClientError> {
        loop {
            match self.next().await? {
                Step::Event(event) => {
                    tracing::debug!(id = %self.id, ?event, "event ignored by a unary call");
                }
                Step::Reply(reply) => return Ok(reply),
            }
        }
    }

    fn unexpected(&self, got: impl std::fmt::Debug) -> ClientError {
        ClientError::UnexpectedReply {
            request: self.what,
            got: format!("{got:?}"),
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.abandon(self.id);
        }
    }
}

/// What a streaming exec produces, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// The child is running with this pid (first, once).
    Started(Pid),
    /// Output from stdout or stderr, in the order it was read.
    Output(OutputChunk),
    /// The child ended (or timed out); `stdout`/`stderr` are empty when streamed.
    Finished(ExecReply),
}

/// A streaming exec. Dropping it before [`ExecEvent::Finished`] kills the command.
#[derive(Debug)]
pub struct ExecStream {
    inner: RequestStream,
}

impl ExecStream {
    pub(crate) fn new(inner: RequestStream) -> Self {
        Self { inner }
    }

    /// The next event; after `Finished` (or an error) the stream is done.
    pub async fn next(&mut self) -> Result<ExecEvent, ClientError> {
        match self.inner.next().await? {
            Step::Event(Event::Started(pid)) => Ok(ExecEvent::Started(pid)),
            Step::Event(Event::Output(chunk)) => Ok(ExecEvent::Output(chunk)),
            Step::Reply(Reply::Exec(reply)) => Ok(ExecEvent::Finished(reply)),
            Step::Event(other) => Err(self.fail(other)),
            Step::Reply(other) => Err(self.inner.unexpected(other)),
        }
    }

    /// True once `Finished` or an error was returned.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Kills the command (via `Cancel`) and waits for the agent to confirm.
    pub async fn cancel(self) -> Result<(), ClientError> {
        self.inner.cancel().await
    }

    fn fail(&mut self, got: Event) -> ClientError {
        let error = self.inner.unexpected(got);
        self.inner.finished = true;
        self.inner.conn.abandon(self.inner.id);
        error
    }
}

/// What following a process's output produces, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogsEvent {
    /// New output (and how much the ring dropped before it).
    Batch(LogsBatch),
    /// The process ended and its output is drained; the last batch and the status.
    Finished(LogsReply),
}

/// A follow stream. Dropping it before [`LogsEvent::Finished`] ends it on the agent.
#[derive(Debug)]
pub struct LogsStream {
    inner: RequestStream,
}

impl LogsStream {
    pub(crate) fn new(inner: RequestStream) -> Self {
        Self { inner }
    }

    /// The next batch, or the final reply.
    pub async fn next(&mut self) -> Result<LogsEvent, ClientError> {
        match self.inner.next().await? {
            Step::Event(Event::Logs(batch)) => Ok(LogsEvent::Batch(batch)),
            Step::Reply(Reply::Logs(reply)) => Ok(LogsEvent::Finished(reply)),
            Step::Event(other) => {
                let error = self.inner.unexpected(other);
                self.inner.finished = true;
                self.inner.conn.abandon(self.inner.id);
                Err(error)
            }
            Step::Reply(other) => Err(self.inner.unexpected(other)),
        }
    }

    /// True once `Finished` or an error was returned.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Stops following and waits for the agent to confirm.
    pub async fn cancel(self) -> Result<(), ClientError> {
        self.inner.cancel().await
    }
}
