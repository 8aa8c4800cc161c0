//! `logs [-f]`: replay a process's output, optionally following it to the end.

use anyhow::Context;
use sandbox_protocol::{LogsBatch, Pid};

use sandbox_vmm::client::{Client, LogsEvent};

use crate::args::LogsArgs;
use crate::json::LogsView;
use crate::output::{self, print_json_line, write_chunk};

/// Prints output raw (stdout and stderr to ours) or as JSON.
pub(crate) async fn logs(client: &Client, args: &LogsArgs) -> anyhow::Result<u8> {
    let pid = Pid(args.pid);
    let failed = || format!("logs {pid} failed");
    if !args.follow {
        let reply = client.logs(pid, args.cursor).await.with_context(failed)?;
        if args.json {
            print_json_line(&LogsView::new(&reply.batch, true, reply.exit))?;
        } else {
            print_batch(&reply.batch)?;
        }
        return Ok(0);
    }
    let mut stream = client.logs_follow(pid, args.cursor).with_context(failed)?;
    let stdout_closed = output::stdout_closed();
    tokio::pin!(stdout_closed);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            closed = &mut stdout_closed => return Err(closed.into()),
        };
        match event.with_context(failed)? {
            LogsEvent::Batch(batch) if args.json => {
                print_json_line(&LogsView::new(&batch, false, None))?
            }
            LogsEvent::Batch(batch) => print_batch(&batch)?,
            LogsEvent::Finished(reply) if args.json => {
                print_json_line(&LogsView::new(&reply.batch, true, reply.exit))?;
                return Ok(0);
            }
            LogsEvent::Finished(reply) => {
                print_batch(&reply.batch)?;
                return Ok(0);
            }
        }
    }
}

/// Writes each chunk to its stream and reports bytes the ring no longer held.
fn print_batch(batch: &LogsBatch) -> anyhow::Result<()> {
    if batch.dropped > 0 {
        let at = batch.chunks.first().map_or(batch.end, |chunk| chunk.offset);
        eprintln!(
            "sandboxctl: {} bytes dropped before offset {at} (the ring keeps the newest {} KiB)",
            batch.dropped,
            sandbox_protocol::limits::RING_BYTES / 1024
        );
    }
    for chunk in &batch.chunks {
        write_chunk(chunk)?;
    }
    Ok(())
}
