//! The way a request handler sends progress events back on its connection, within
//! the request's stream window and the agent's [`Budget`].

use std::sync::{Arc, Mutex, PoisonError};

use sandbox_protocol::limits::STREAM_WINDOW_BYTES;
use sandbox_protocol::{AgentFrame, AgentMsg, Event, RequestId};
use tokio::sync::{mpsc, watch};

use crate::budget::{Budget, Charge};

/// A frame on its way to the connection's writer, with the budget its bytes hold
/// until they are written.
#[derive(Debug)]
pub struct Outgoing {
    /// The frame.
    pub frame: AgentFrame,
    /// What its bytes are charged; given back once written (or dropped).
    pub charge: Charge,
}

impl Outgoing {
    /// A frame that holds no budget (small ones).
    pub fn uncharged(frame: AgentFrame) -> Self {
        Self {
            frame,
            charge: Charge::none(),
        }
    }
}

/// Sends [`Event`]s for one request to its connection's writer. Once the client has
/// reported consumption on the connection (`ClientMsg::Consumed`), events that carry
/// payload wait while more than [`STREAM_WINDOW_BYTES`] of it is unconsumed: a slow
/// reader of one stream slows that stream, and neither side buffers more than the
/// window for it.
///
/// Bytes a handler holds for its final reply (an exec's output, a file's content)
/// are charged through [`Events::hold`] before they are produced; the connection
/// sends the reply with that charge ([`Events::take_held`]).
#[derive(Debug, Clone)]
pub struct Events {
    id: RequestId,
    tx: mpsc::Sender<Outgoing>,
    budget: Budget,
    held: Arc<Mutex<Charge>>,
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
        tx: mpsc::Sender<Outgoing>,
        budget: Budget,
        consumed: watch::Receiver<u64>,
        windowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self {
            id,
            tx,
            budget,
            held: Arc::default(),
            consumed,
            sent: std::sync::Arc::default(),
            windowed,
        }
    }

    /// The agent's budget, for handlers that charge before they read.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Keeps `charge` with this request until its final reply is written.
    pub fn hold(&self, charge: Charge) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .merge(charge);
    }

    /// Everything [`Self::hold`] collected, for the final frame to carry.
    pub fn take_held(&self) -> Charge {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Queues `event` once the window has room for it and the budget for its payload;
    /// false when the connection (or the request) is gone.
    pub async fn send(&self, event: Event) -> bool {
        let payload = event.payload_bytes();
        // The window first: a charge is never held while waiting for the client,
        // whose reports may sit behind a frame that waits for the budget.
        if !self.room_for(payload).await {
            return false;
        }
        let charge = self
            .budget
            .reserve_large(usize::try_from(payload).unwrap_or(usize::MAX))
            .await;
        self.queue(event, charge).await
    }

    /// Waits until the stream window has room for `size` payload bytes (at once for
    /// a connection that does not report); false when the request is gone. Callers
    /// that charge before they read wait here first, so that they never hold a charge
    /// while waiting for the client.
    pub async fn room_for(&self, size: u64) -> bool {
        use std::sync::atomic::Ordering;
        if size == 0 || !self.windowed.load(Ordering::Relaxed) {
            return true;
        }
        let sent = self.sent.load(Ordering::Relaxed);
        // An event larger than the window goes once nothing is outstanding.
        let limit = STREAM_WINDOW_BYTES.saturating_sub(size);
        let mut consumed = self.consumed.clone();
        let room = consumed
            .wait_for(|consumed| sent.saturating_sub(*consumed) <= limit)
            .await
            .is_ok();
        room
    }

    /// [`Self::send`] for an event whose bytes were charged before they were read
    /// (`charge` goes with the frame), after [`Self::room_for`].
    pub async fn send_charged(&self, event: Event, charge: Charge) -> bool {
        if !self.room_for(event.payload_bytes()).await {
            return false;
        }
        self.queue(event, charge).await
    }

    /// Queues `event` with `charge`, counting its payload as sent.
    async fn queue(&self, event: Event, charge: Charge) -> bool {
        use std::sync::atomic::Ordering;
        // Counted always, so a window that starts mid-stream starts from the truth.
        self.sent
            .fetch_add(event.payload_bytes(), Ordering::Relaxed);
        let frame = AgentFrame {
            id: self.id,
            msg: AgentMsg::Event(event),
        };
        self.tx.send(Outgoing { frame, charge }).await.is_ok()
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
        let events = Events::new(RequestId(1), tx, Budget::default(), consumed, windowed);
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
        let events = Events::new(
            RequestId(1),
            tx,
            Budget::default(),
            consumed,
            windowed.clone(),
        );
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
