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
    if !request.follow {
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
        let (batch, progress) = record.read_logs(cursor)?;
        if progress.finished() {
            return Ok(LogsReply {
                batch,
                exit: progress.exit,
            });
        }
        cursor = Some(batch.end);
        if (!batch.chunks.is_empty() || batch.dropped > 0) && !events.send(Event::Logs(batch)).await
        {
            return Err(ProcessError::NotFound { pid: request.pid });
        }
        if changes.changed().await.is_err() {
            return Err(ProcessError::NotFound { pid: request.pid });
        }
    }
}
