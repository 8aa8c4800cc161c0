//! Which connections are served when too many are open.
//!
//! One table of connections with a cap; the server keeps two (see
//! `connection::Admissions`): those still without a `Hello`, and served ones, so a
//! peer without the token only ever displaces another such peer.
//!
//! The agent serves at most [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) connections.
//! An idle one (no request in flight, or no `Hello` yet) costs next to nothing, so
//! idle connections are not refused or timed out while there is room; but they must
//! never lock out a newcomer (the host's own control connection, say). So when the
//! table is full, a new connection takes the place of the oldest idle one, which is
//! told why and closed. Only when every connection has a request in flight is the
//! newcomer refused, at once and with a clear error, instead of waiting unaccepted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, Semaphore};

/// The connections being served, oldest first.
#[derive(Debug)]
pub struct Admission {
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// By admission order, so the first idle entry is the oldest idle connection.
    open: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// The connection's request slots: all free means idle.
    slots: Arc<Semaphore>,
    slot_count: usize,
    evict: Arc<Notify>,
}

/// Every connection is busy: the newcomer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// The limit in force.
    pub max: usize,
}

/// A served connection's place in the table; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    admission: Arc<Admission>,
    evict: Arc<Notify>,
}

impl Admission {
    /// A table of at most `max` connections.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            state: Mutex::default(),
        })
    }

    /// Admits a connection whose request slots are `slots` (`slot_count` in all),
    /// evicting the oldest idle connection if the table is full.
    pub fn admit(
        self: &Arc<Self>,
        slots: Arc<Semaphore>,
        slot_count: usize,
    ) -> Result<Ticket, Full> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open.len() >= self.max {
            let idle = state
                .open
                .iter()
                .find(|(_, entry)| entry.slots.available_permits() >= entry.slot_count)
                .map(|(id, _)| *id);
            let Some(idle) = idle else {
                return Err(Full { max: self.max });
            };
            if let Some(entry) = state.open.remove(&idle) {
                // A stored permit: the connection sees it even if not waiting yet.
                entry.evict.notify_one();
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let evict = Arc::new(Notify::new());
        state.open.insert(
            id,
            Entry {
                slots,
                slot_count,
                evict: evict.clone(),
            },
        );
        Ok(Ticket {
            id,
            admission: self.clone(),
            evict,
        })
    }

    /// Connections being served.
    pub fn open(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .len()
    }
}

impl Ticket {
    /// Resolves when this connection was evicted to make room for a newer one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(2))
    }

    #[tokio::test]
    async fn a_full_table_evicts_the_oldest_idle_connection() {
        let admission = Admission::new(3);
        let busy_slots = slots();
        let _busy_permit = busy_slots.clone().try_acquire_owned().unwrap();
        let busy = admission.admit(busy_slots, 2).unwrap();
        let oldest_idle = admission.admit(slots(), 2).unwrap();
        let newer_idle = admission.admit(slots(), 2).unwrap();
        assert_eq!(admission.open(), 3);

        let newcomer = admission.admit(slots(), 2).unwrap();
        assert_eq!(admission.open(), 3);
        tokio::time::timeout(std::time::Duration::from_secs(1), oldest_idle.evicted())
            .await
            .unwrap();
        // The others were not told to go.
        for ticket in [&busy, &newer_idle, &newcomer] {
            let told =
                tokio::time::timeout(std::time::Duration::from_millis(20), ticket.evicted()).await;
            assert!(told.is_err());
        }
        // Dropping an evicted ticket does not free someone else's place.
        drop(oldest_idle);
        assert_eq!(admission.open(), 3);
        drop(newer_idle);
        assert_eq!(admission.open(), 2);
    }

    #[test]
    fn when_every_connection_is_busy_the_newcomer_is_refused() {
        let admission = Admission::new(1);
        let busy_slots = slots();
        let _permit = busy_slots.clone().try_acquire_owned().unwrap();
        let _busy = admission.admit(busy_slots, 2).unwrap();
        assert_eq!(admission.admit(slots(), 2).unwrap_err(), Full { max: 1 });
    }
}
