//! The MCP logging capability: the server's own `tracing` events (targets under
//! `sandbox_mcp`) go to the client as `notifications/message` as well as to stderr,
//! at or above the level the client chose with `logging/setLevel` (warning until
//! it chooses). So a client, and a person watching it, hear about what no tool call
//! returns: a sandbox destroyed at its deadline, a sandbox whose VM died, a wake
//! that failed, a warm VM that failed to boot.
//!
//! [`ClientLog`] is made in `main` before logging is set up: its [`ClientLogLayer`]
//! sits in the `tracing` subscriber, and the server hands it the client's peer once
//! the client has initialized. Events are sent from a spawned task, never awaited
//! where they are logged, and dropped when no client is connected yet.

// The logging types are deprecated in rmcp (SEP-2577 moves logging elsewhere), but
// they are what clients of this protocol version speak.
#![allow(deprecated)]

use std::fmt::Debug;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::{Peer, RoleServer};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

use sandbox_engine::util::lock;

/// Targets forwarded: this crate's own events, not its libraries'.
const TARGET_PREFIX: &str = "sandbox_mcp";

/// Targets never forwarded: the stdio front's, about the message stream itself. A
/// malformed or oversize line is answered with a JSON-RPC error already, and a
/// client that reads its replies line by line must find that error next, not a log
/// message about it.
const TARGET_EXCLUDED: &str = "sandbox_mcp::stdio";

/// Whether events of `target` go to the client.
pub fn forwards(target: &str) -> bool {
    (target.starts_with(TARGET_PREFIX) || target.starts_with(ENGINE_TARGET_PREFIX))
        && !target.starts_with(TARGET_EXCLUDED)
}

/// The engine's events (a sandbox destroyed at its deadline, one that did not
/// wake) concern the client as much as the server's own.
const ENGINE_TARGET_PREFIX: &str = "sandbox_engine";

/// The level forwarded before the client sets one.
const DEFAULT_LEVEL: LoggingLevel = LoggingLevel::Warning;

/// Where the server's log events meet the client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ClientLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The least severe level forwarded, as [`rank`].
    level: AtomicU8,
    /// The connected client.
    peer: Mutex<Option<Peer<RoleServer>>>,
}

impl Default for ClientLog {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                level: AtomicU8::new(rank(DEFAULT_LEVEL)),
                peer: Mutex::new(None),
            }),
        }
    }
}

impl ClientLog {
    /// The layer to put in the `tracing` subscriber.
    pub fn layer(&self) -> ClientLogLayer {
        ClientLogLayer {
            inner: self.inner.clone(),
        }
    }

    /// Starts forwarding to `peer` (the client, once it has initialized).
    pub fn connect(&self, peer: Peer<RoleServer>) {
        *lock(&self.inner.peer) = Some(peer);
    }

    /// `logging/setLevel`: forward `level` and what is more severe.
    pub fn set_level(&self, level: LoggingLevel) {
        self.inner.level.store(rank(level), Ordering::Relaxed);
    }

    /// Whether an event at `level` is forwarded now.
    fn wants(&self, level: LoggingLevel) -> bool {
        rank(level) >= self.inner.level.load(Ordering::Relaxed)
    }
}

/// The `tracing` layer that forwards events to the client.
#[derive(Debug)]
pub struct ClientLogLayer {
    inner: Arc<Inner>,
}

impl<S: Subscriber> Layer<S> for ClientLogLayer {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let meta = event.metadata();
        if !forwards(meta.target()) {
            return;
        }
        let level = mcp_level(*meta.level());
        let log = ClientLog {
            inner: self.inner.clone(),
        };
        if !log.wants(level) {
            return;
        }
        let Some(peer) = lock(&self.inner.peer).clone() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let params = LoggingMessageNotificationParam::new(level, Value::Object(fields.0))
            .with_logger(meta.target());
        runtime.spawn(async move {
            // A client that has gone away is no error of the event's.
            let _ = peer.notify_logging_message(params).await;
        });
    }
}

/// An event's fields as JSON: `message` first, then the structured ones.
#[derive(Debug, Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// The MCP level of a `tracing` level (MCP has no trace).
fn mcp_level(level: Level) -> LoggingLevel {
    match level {
        Level::ERROR => LoggingLevel::Error,
        Level::WARN => LoggingLevel::Warning,
        Level::INFO => LoggingLevel::Info,
        _ => LoggingLevel::Debug,
    }
}

/// Severity order (RFC 5424, as MCP uses it): debug lowest.
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_set_by_the_client_filters_by_severity() {
        let log = ClientLog::default();
        assert!(log.wants(LoggingLevel::Warning));
        assert!(!log.wants(LoggingLevel::Info), "warning until it chooses");
        log.set_level(LoggingLevel::Debug);
        assert!(log.wants(mcp_level(Level::TRACE)));
        log.set_level(LoggingLevel::Error);
        assert!(!log.wants(mcp_level(Level::WARN)));
        assert!(log.wants(LoggingLevel::Critical));
    }

    /// Regression: the stdio front's warning about an oversize line reached the
    /// client before the line's error reply, which a client waiting for the reply
    /// then read instead.
    #[test]
    fn only_the_servers_own_events_go_to_the_client_not_the_stdio_fronts() {
        assert!(forwards("sandbox_engine::registry"));
        assert!(forwards("sandbox_mcp::host::tools"));
        assert!(!forwards("sandbox_mcp::stdio"));
        assert!(!forwards("sandbox_mcp::stdio::scan"));
        assert!(!forwards("rmcp::service"));
        assert!(!forwards("sandbox_vmm::launcher"));
    }
}
