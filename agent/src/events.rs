//! The way a request handler sends progress events back on its connection, within
//! the request's stream window.

use sandbox_protocol::limits::STREAM_WINDOW_BYTES;
use sandbox_protocol::{AgentFrame, AgentMsg, Event, RequestId};
use tokio::sync::{mpsc, watch};

/// Sends [`Event`]s for one request to its connection's writer. Once the client has
/// reported consumption on the connection (`ClientMsg::Consumed`), events that carry
/// payload wait while more than [`STREAM_WINDOW_BYTES`] of it is unconsumed: a slow
/// reader of one stream slows that stream, and neither side buffers more than the
/// window for it.
#[derive(Debug, Clone)]
pub struct Events {
    id: RequestId,
    tx: mpsc::Sender<AgentFrame>,
    consumed: watch::Receiver<u64>,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Set on the connection's first `Consumed`: a client that never reports (one
    /// written before stream windows) is never held to one.
    windowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Events {
    /// Events for request `id`, written through `tx`; `consumed` follows the client's
    /// reports for this request, and `windowed` says whether its connection reports.
    pub fn new(
        id: RequestId,
        tx: mpsc::Sender<AgentFrame>,
        consumed: watch::Receiver<u64>,
        windowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self {
            id,
            tx,
            consumed,
            sent: std::sync::Arc::default(),
            windowed,
        }
    }

    /// Queues `event` once the window has room for it; false when the connection
    /// (or the request) is gone.
    pub async fn send(&self, event: Event) -> bool {
        use std::sync::atomic::Ordering;
        let size = event.payload_bytes();
        if size > 0 && self.windowed.load(Ordering::Relaxed) {
            let sent = self.sent.load(Ordering::Relaxed);
            // An event larger than the window goes once nothing is outstanding.
            let limit = STREAM_WINDOW_BYTES.saturating_sub(size);
            let mut consumed = self.consumed.clone();
            if consumed
                .wait_for(|consumed| sent.saturating_sub(*consumed) <= limit)
                .await
                .is_err()
            {
                return false;
            }
        }
        // Counted always, so a window that starts mid-stream starts from the truth.
        self.sent.fetch_add(size, Ordering::Relaxed);
        let frame = AgentFrame {
            id: self.id,
            msg: AgentMsg::Event(event),
        };
        self.tx.send(frame).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn payload_past_the_window_waits_for_the_clients_report() {
        let (tx, mut rx) = mpsc::channel(64);
        let (report, consumed) = watch::channel(0);
        let windowed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let events = Events::new(RequestId(1), tx, consumed, windowed);
        let chunk = || Event::Data(vec![0; 1024 * 1024]);
        for _ in 0..4 {
            assert!(events.send(chunk()).await);
        }
        // A fifth MiB would exceed the window: it waits.
        let blocked = tokio::time::timeout(Duration::from_millis(50), events.send(chunk())).await;
        assert!(blocked.is_err());
        // Events without payload never wait.
        assert!(events.send(Event::Acked(1)).await);
        report.send(1024 * 1024).unwrap();
        assert!(events.send(chunk()).await);
        let mut frames = 0;
        while rx.try_recv().is_ok() {
            frames += 1;
        }
        assert_eq!(frames, 6);
        // The request is gone: a waiting sender gives up.
        drop(report);
        assert!(!events.send(chunk()).await);
    }

    #[tokio::test]
    async fn a_connection_that_never_reports_is_never_held_to_the_window() {
        let (tx, mut rx) = mpsc::channel(64);
        let (_report, consumed) = watch::channel(0);
        let windowed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let events = Events::new(RequestId(1), tx, consumed, windowed.clone());
        for _ in 0..8 {
            assert!(events.send(Event::Data(vec![0; 1024 * 1024])).await);
        }
        // Its first report turns the window on, counted from everything sent.
        windowed.store(true, std::sync::atomic::Ordering::Relaxed);
        let blocked = tokio::time::timeout(
            Duration::from_millis(50),
            events.send(Event::Data(vec![0; 1024])),
        )
        .await;
        assert!(blocked.is_err());
        let mut frames = 0;
        while rx.try_recv().is_ok() {
            frames += 1;
        }
        assert_eq!(frames, 8);
    }
}
