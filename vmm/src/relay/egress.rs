//! The relay's egress: answering the agent's `Dial`s (see [`crate::egress`]).
//!
//! Each `Dial` runs in its own task: check, resolve, connect (at most
//! [`MAX_EGRESS_CONNECTIONS`] at once; more are refused), then open the host half of
//! the agent's channel, answer `Dialed`, and splice the TCP stream to it, counting
//! bytes for the log. A dial that finishes after its session ended is dropped: the
//! agent forgot it when the session ended.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use sandbox_protocol::link::egress::{
    DialOutcome, DialRefusal, DIAL_HOST_MAX_BYTES, EGRESS_CHANNEL_BIT, MAX_EGRESS_CONNECTIONS,
    PROXY_NOTE_MAX_BYTES,
};
use sandbox_protocol::link::mux::Channels;
use sandbox_protocol::link::{ChannelId, LinkFrame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

use crate::egress::dial::dial;
use crate::egress::{EgressConfig, EgressLog, EgressRecord, Policy, Verdict};

/// Longest refusal message sent back to the agent (and the program).
const REFUSAL_MAX_CHARS: usize = 1024;

/// The relay's egress state for its VM.
#[derive(Debug)]
pub(crate) struct Egress {
    /// `None`: `net: none`; every dial is refused (and logged).
    policy: Option<Arc<Policy>>,
    log: Option<Arc<EgressLog>>,
    slots: Arc<Semaphore>,
}

impl Egress {
    pub(crate) fn new(config: Option<&EgressConfig>) -> Self {
        Self {
            policy: config.map(|c| Arc::new(c.policy.clone())),
            log: config.map(|c| Arc::new(EgressLog::new(c.log.clone()))),
            slots: Arc::new(Semaphore::new(MAX_EGRESS_CONNECTIONS)),
        }
    }

    /// Whether to send the agent `Network { egress: true }` after each attach.
    pub(crate) fn enabled(&self) -> bool {
        self.policy.is_some()
    }

    /// The proxy refused a request itself. The note comes from the guest: only its
    /// first [`PROXY_NOTE_MAX_BYTES`] printable characters are kept, and it goes to
    /// the egress log (which rotates), not to the relay's own log (which does not:
    /// a guest that floods refusals must not fill the host's disk).
    pub(crate) fn proxy_refused(&self, note: &str) {
        let note = printable(note, PROXY_NOTE_MAX_BYTES);
        tracing::debug!(%note, "the guest proxy refused a request");
        if let Some(log) = &self.log {
            log.write(&EgressRecord {
                time_unix_ms: now_unix_ms(),
                host: String::new(),
                port: 0,
                address: None,
                verdict: Verdict::Refused,
                reason: Some(note),
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
            });
        }
    }

    /// Handles one `Dial` of the current session.
    pub(crate) async fn dial(
        &self,
        channels: &Arc<Channels>,
        channel: ChannelId,
        host: String,
        port: u16,
    ) {
        let outbox = channels.outbox().clone();
        let session = outbox.session();
        let attempt = Attempt {
            time_unix_ms: now_unix_ms(),
            started: Instant::now(),
            // Cut and made printable for the log only (a host the guest sends may
            // hold newlines or terminal escapes); the check sees the whole name, and
            // refuses one longer than a DNS name can be.
            host: printable(&host, DIAL_HOST_MAX_BYTES),
            port,
        };
        let log = self.log.clone();
        // Capped: a refusal must fit in one link frame, or it would be dropped and
        // the agent would wait for it forever.
        let refuse = move |kind: DialRefusal, message: String| LinkFrame::Dialed {
            channel,
            outcome: DialOutcome::Refused {
                kind,
                message: message.chars().take(REFUSAL_MAX_CHARS).collect(),
            },
        };
        let (Some(policy), true) = (self.policy.clone(), channel & EGRESS_CHANNEL_BIT != 0) else {
            let message = if self.policy.is_none() {
                "this sandbox has no egress (net: none)".to_owned()
            } else {
                format!("channel {channel} is not an egress channel")
            };
            // Never waited for: this runs on the link's reader, which must not stall
            // on a guest that floods dials and reads nothing (a dropped refusal
            // makes the agent's dial time out instead).
            outbox.try_send(session, &refuse(DialRefusal::EgressOff, message));
            return;
        };
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let message = format!("too many egress connections (at most {MAX_EGRESS_CONNECTIONS})");
            if let Some(log) = &log {
                log.write(&attempt.record(Verdict::Denied, None, Some(message.clone())));
            }
            outbox.try_send(session, &refuse(DialRefusal::Invalid, message));
            return;
        };
        let channels = channels.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let target = host;
            let (stream, address) = match dial(&policy, &target, port).await {
                Ok(dialled) => dialled,
                Err(refusal) => {
                    let verdict = match refusal.kind {
                        DialRefusal::Denied | DialRefusal::EgressOff | DialRefusal::Invalid => {
                            Verdict::Denied
                        }
                        DialRefusal::Resolve | DialRefusal::Connect => Verdict::Failed,
                    };
                    // Each attempt is in the egress log; the relay's log (which does
                    // not rotate) gets it at debug level only.
                    tracing::debug!(host = %attempt.host, port, reason = %refusal.message, "egress refused");
                    if let Some(log) = &log {
                        let address = refusal.address.map(|a| a.to_string());
                        let reason = refusal.message.chars().take(REFUSAL_MAX_CHARS).collect();
                        log.write(&attempt.record(verdict, address, Some(reason)));
                    }
                    outbox
                        .send(session, &refuse(refusal.kind, refusal.message))
                        .await;
                    return;
                }
            };
            if outbox.session() != session {
                return;
            }
            let opened = match channels.open(channel) {
                Ok(opened) => opened,
                Err(error) => {
                    outbox
                        .send(session, &refuse(DialRefusal::Invalid, error.to_string()))
                        .await;
                    return;
                }
            };
            let connected = LinkFrame::Dialed {
                channel,
                outcome: DialOutcome::Connected {
                    address: address.to_string(),
                },
            };
            outbox.send(session, &connected).await;
            tracing::debug!(host = %attempt.host, port, %address, "egress connected");
            let counted = Counted::new(stream);
            let (bytes_in, bytes_out) = (counted.read.clone(), counted.written.clone());
            opened.splice(counted).await;
            if let Some(log) = &log {
                let mut line = attempt.record(Verdict::Allowed, Some(address.to_string()), None);
                line.bytes_in = bytes_in.load(Ordering::Relaxed);
                line.bytes_out = bytes_out.load(Ordering::Relaxed);
                log.write(&line);
            }
        });
    }
}

/// One dial, for its log line.
/// The first `max` characters of text from the guest, control characters shown as
/// `.`, so that it can neither forge log lines nor send terminal escapes.
fn printable(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { '.' } else { c })
        .collect()
}

struct Attempt {
    time_unix_ms: u64,
    started: Instant,
    host: String,
    port: u16,
}

impl Attempt {
    fn record(
        &self,
        verdict: Verdict,
        address: Option<String>,
        reason: Option<String>,
    ) -> EgressRecord {
        EgressRecord {
            time_unix_ms: self.time_unix_ms,
            host: self.host.clone(),
            port: self.port,
            address,
            verdict,
            reason,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A stream that counts the bytes read from and written to it.
struct Counted<S> {
    inner: S,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            read: Arc::default(),
            written: Arc::default(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = result {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_text_is_cut_and_shown_without_control_characters() {
        assert_eq!(printable("a\nb\x1b]52;c;x\x07", 64), "a.b.]52;c;x.");
        assert_eq!(printable("abcdef", 3), "abc");
    }
}
