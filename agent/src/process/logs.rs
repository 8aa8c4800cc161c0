//! `logs`: replay a process's ring from a cursor, and optionally follow it.
//!
//! A follower reads from its cursor, sends what it got as an event, moves its cursor
//! to the batch's end and sleeps until the record's progress changes. Each byte is
//! therefore sent once; bytes the ring dropped before the follower got to them are
//! reported in `dropped`. The reply comes once the process has exited and its output
//! is drained, carrying whatever arrived last and the exit status.

use sandbox_protocol::{Event, LogsReply, LogsRequest};

use super::table::ProcessTable;
use super::ProcessError;
use crate::events::Events;

/// Handles one logs request.
pub async fn logs(
    table: &ProcessTable,
    request: LogsRequest,
    events: &Events,
) -> Result<LogsReply, ProcessError> {
    let record = table.get(request.pid)?;
    // Each batch is charged before it is copied out of the ring (see `crate::budget`).
    let charge_for = |cursor| {
        events
            .budget()
            .reserve_large(record.logs_bytes_from(cursor))
    };
    if !request.follow {
        events.hold(charge_for(request.cursor).await);
        let (batch, progress) = record.read_logs(request.cursor)?;
        return Ok(LogsReply {
            batch,
            exit: progress.exit,
        });
    }
    let mut changes = record.subscribe();
    let mut cursor = request.cursor;
    loop {
        changes.borrow_and_update();
        // The window first: a charge is never held while waiting for the client.
        if !events.room_for(record.logs_bytes_from(cursor) as u64).await {
            return Err(ProcessError::NotFound { pid: request.pid });
        }
        let charge = charge_for(cursor).await;
        let (batch, progress) = record.read_logs(cursor)?;
        if progress.finished() {
            events.hold(charge);
            return Ok(LogsReply {
                batch,
                exit: progress.exit,
            });
        }
        cursor = Some(batch.end);
        if (!batch.chunks.is_empty() || batch.dropped > 0)
            && !events.send_charged(Event::Logs(batch), charge).await
        {
            return Err(ProcessError::NotFound { pid: request.pid });
        }
        if changes.changed().await.is_err() {
            return Err(ProcessError::NotFound { pid: request.pid });
        }
    }
}
