//! The way a request handler sends progress events back on its connection.

use sandbox_protocol::{AgentFrame, AgentMsg, Event, RequestId};
use tokio::sync::mpsc;

/// Sends [`Event`]s for one request to its connection's writer.
#[derive(Debug, Clone)]
pub struct Events {
    id: RequestId,
    tx: mpsc::Sender<AgentFrame>,
}

impl Events {
    /// Events for request `id`, written through `tx`.
    pub fn new(id: RequestId, tx: mpsc::Sender<AgentFrame>) -> Self {
        Self { id, tx }
    }

    /// Queues `event`; false when the connection is gone.
    pub async fn send(&self, event: Event) -> bool {
        let frame = AgentFrame {
            id: self.id,
            msg: AgentMsg::Event(event),
        };
        self.tx.send(frame).await.is_ok()
    }
}
