//! Waiting until a tracked process prints a text: its output ring, read from the
//! oldest byte held and then as its record's progress changes (the `watch` channel
//! `logs --follow` sleeps on), so the wait costs nothing while the process is quiet.
//!
//! Each stream has its own [`Scanner`]: a text written to stdout in two pieces with
//! stderr output between them is found, and a match never joins bytes of two
//! streams. Bytes the ring dropped before they were read break every stream (a match
//! across the gap would be made up). Once the process has exited and its output is
//! settled, the final batch is scanned and the wait fails at once.

use sandbox_protocol::{LogsBatch, Pid, Stream, TextFound};

use super::scan::{Hit, Scanner};
use super::{quoted, Limits, WaitError};
use crate::process::table::{ProcessTable, Progress};

/// One scanner per stream, and what they saw.
#[derive(Debug)]
struct Streams {
    scanners: [(Stream, Scanner); 3],
    /// Bytes the ring no longer held when read.
    dropped: u64,
}

impl Streams {
    fn new(limits: &Limits) -> Self {
        Self {
            scanners: [
                (Stream::Stdout, limits.scanner()),
                (Stream::Stderr, limits.scanner()),
                (Stream::Pty, limits.scanner()),
            ],
            dropped: 0,
        }
    }

    fn feed(&mut self, batch: &LogsBatch) {
        if batch.dropped > 0 {
            self.dropped += batch.dropped;
            for (_, scanner) in &mut self.scanners {
                scanner.reset();
            }
        }
        for chunk in &batch.chunks {
            if let Some((_, scanner)) = self.scanners.iter_mut().find(|(s, _)| *s == chunk.stream) {
                scanner.feed(chunk.offset, &chunk.data);
            }
        }
    }

    /// The earliest match of any stream.
    fn first_hit(&self) -> Option<(Stream, &Hit)> {
        self.scanners
            .iter()
            .filter_map(|(stream, scanner)| scanner.hit().map(|hit| (*stream, hit)))
            .min_by_key(|(_, hit)| hit.offset)
    }

    /// What the wait saw, for a timeout's message.
    fn describe(&self, pid: Pid, progress: &Progress) -> String {
        let scanned: u64 = self.scanners.iter().map(|(_, s)| s.fed()).sum();
        let state = match progress.exit {
            None => format!("process {pid} is still running"),
            Some(_) => format!("process {pid} exited; its output is not settled yet"),
        };
        let mut seen = format!("{state}; scanned {scanned} bytes of its output");
        if self.dropped > 0 {
            seen.push_str(&format!(
                " ({} earlier bytes were dropped from its ring)",
                self.dropped
            ));
        }
        seen
    }
}

/// Waits until process `pid` prints the text, exits without it, or the deadline.
pub async fn wait(table: &ProcessTable, pid: Pid, limits: &Limits) -> Result<TextFound, WaitError> {
    let record = table.get(pid).map_err(|_| WaitError::UnknownPid { pid })?;
    let mut changes = record.subscribe();
    let mut streams = Streams::new(limits);
    let mut cursor = 0;
    let mut at_once = true;
    loop {
        changes.borrow_and_update();
        let (batch, progress) = match record.read_logs(Some(cursor)) {
            Ok(read) => read,
            // Cannot happen (the cursor is an end the ring reported); start over.
            Err(ahead) => {
                tracing::warn!(%pid, %ahead, "wait_for_text cursor past the output");
                cursor = 0;
                streams = Streams::new(limits);
                continue;
            }
        };
        streams.feed(&batch);
        if let Some((stream, hit)) = streams.first_hit() {
            return Ok(limits.found(hit, Some(stream), at_once));
        }
        cursor = batch.end;
        if let (true, Some(status)) = (progress.finished(), progress.exit) {
            return Err(WaitError::Exited {
                pid,
                status,
                text: quoted(&limits.text),
                dropped: streams.dropped,
            });
        }
        at_once = false;
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(limits.deadline) => {
                let seen = streams.describe(pid, &progress);
                return Err(limits.timed_out(format!("the output of process {pid}"), seen));
            }
            changed = changes.changed() => {
                // The record owns the sender and is held here: this cannot fail.
                if changed.is_err() {
                    return Err(WaitError::UnknownPid { pid });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::table::ProcessRecord;
    use sandbox_protocol::{ErrorKind, ExitStatus, ProcessKind, WaitForTextRequest, WaitTarget};
    use std::sync::Arc;
    use std::time::Duration;

    fn limits(text: &str, timeout_ms: u64) -> Limits {
        Limits::check(&WaitForTextRequest {
            target: WaitTarget::Output(Pid(0)),
            text: text.into(),
            timeout_ms: Some(timeout_ms),
        })
        .unwrap()
    }

    fn table_with(pid: i32) -> (ProcessTable, Arc<ProcessRecord>) {
        let table = ProcessTable::new(Duration::from_secs(60));
        let record = Arc::new(ProcessRecord::new(
            Pid(pid),
            ProcessKind::Spawn,
            vec!["x".into()],
            2,
            None,
            None,
        ));
        table.insert(record.clone());
        (table, record)
    }

    fn exit(record: &ProcessRecord, code: i32) {
        record.mark_exited(ExitStatus {
            code: Some(code),
            signal: None,
        });
        record.settle_stream();
        record.settle_stream();
    }

    #[tokio::test]
    async fn output_already_there_is_found_without_waiting() {
        let (table, record) = table_with(5);
        record.push_output(Stream::Stdout, b"booting\n");
        record.push_output(Stream::Stderr, b"warn: listening on :80\n");
        let found = wait(&table, Pid(5), &limits("listening on", 1000))
            .await
            .unwrap();
        assert_eq!(found.offset, 14);
        assert_eq!(found.stream, Some(Stream::Stderr));
        assert_eq!(found.line, "warn: listening on :80");
        assert_eq!(found.waited_ms, 0);
    }

    #[tokio::test]
    async fn a_text_split_by_the_other_stream_is_found_in_its_own() {
        let (table, record) = table_with(6);
        let waiter = tokio::spawn(async move {
            let limits = limits("ready now", 10_000);
            wait(&table, Pid(6), &limits).await
        });
        tokio::task::yield_now().await;
        record.push_output(Stream::Stdout, b"rea");
        record.push_output(Stream::Stderr, b"noise\n");
        tokio::task::yield_now().await;
        record.push_output(Stream::Stdout, b"dy now\n");
        let found = waiter.await.unwrap().unwrap();
        assert_eq!((found.offset, found.stream), (0, Some(Stream::Stdout)));
        assert_eq!(found.line, "ready now");
    }

    #[tokio::test]
    async fn an_exit_without_the_text_fails_at_once_after_the_last_output() {
        let (table, record) = table_with(7);
        let waiter = tokio::spawn(async move {
            let limits = limits("never", 60_000);
            wait(&table, Pid(7), &limits).await
        });
        record.push_output(Stream::Stdout, b"bye\n");
        exit(&record, 3);
        let error = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait outlived the process")
            .unwrap()
            .unwrap_err();
        let wire = error.to_wire();
        assert_eq!(wire.kind, ErrorKind::NotFound);
        assert_eq!(
            wire.message,
            "Process 7 exited (code 3) without printing \"never\""
        );
        // The last output before the exit still counts.
        let (table, record) = table_with(8);
        record.push_output(Stream::Stdout, b"last words\n");
        exit(&record, 0);
        let found = wait(&table, Pid(8), &limits("words", 100)).await.unwrap();
        assert_eq!(found.offset, 5);
    }

    #[tokio::test]
    async fn unknown_pids_and_deadlines_are_typed() {
        let (table, record) = table_with(9);
        let error = wait(&table, Pid(10), &limits("x", 100)).await.unwrap_err();
        assert_eq!(error.to_wire().kind, ErrorKind::NotFound);
        assert_eq!(error.to_string(), "No tracked process with pid 10");
        record.push_output(Stream::Stdout, b"abc");
        let error = wait(&table, Pid(9), &limits("x", 50)).await.unwrap_err();
        assert_eq!(error.to_wire().kind, ErrorKind::TimedOut);
        assert!(
            error
                .to_string()
                .contains("process 9 is still running; scanned 3 bytes"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_terminals_line_comes_without_its_carriage_return() {
        let (table, record) = table_with(12);
        record.push_output(Stream::Pty, b"$ server\r\nready\r\n$ ");
        let found = wait(&table, Pid(12), &limits("ready", 100)).await.unwrap();
        assert_eq!(found.stream, Some(Stream::Pty));
        assert_eq!((found.offset, found.line.as_str()), (10, "ready"));
    }

    #[tokio::test]
    async fn bytes_the_ring_dropped_break_a_match() {
        let (table, record) = table_with(11);
        record.push_output(Stream::Stdout, b"half");
        let waiter = tokio::spawn(async move {
            let limits = limits("halfway", 300);
            wait(&table, Pid(11), &limits).await
        });
        tokio::task::yield_now().await;
        // More than the ring holds arrives at once: "half" and the filler go.
        let mut flood = vec![b'.'; sandbox_protocol::limits::RING_BYTES];
        flood.extend_from_slice(b"way");
        record.push_output(Stream::Stdout, &flood);
        let error = waiter.await.unwrap().unwrap_err();
        assert!(
            error.to_string().contains("earlier bytes were dropped"),
            "{error}"
        );
    }
}
