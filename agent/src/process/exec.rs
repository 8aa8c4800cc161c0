//! `exec` and `spawn`: start a command; for exec, wait for it and collect its output.
//!
//! An exec waits until the process has exited and its output is drained, or until
//! its deadline. At the deadline everything it started is killed: its whole cgroup
//! (background, double-forked and `setsid`'d children included) when the agent
//! confines in cgroups, else its process group; the reply (output so far,
//! `timed_out`) follows within [`EXEC_DEADLINE_GRACE_SECS`], once the cgroup is
//! empty. If the request is cancelled or its connection drops first, the same kill
//! happens: nobody is left to read the result. Spawned processes survive all of that.
//!
//! An exec that *finishes* may leave background children running (`sh -c 'server
//! &'`): they stay in its cgroup until the exec's deadline (its timeout, by default
//! the 5-minute maximum), when the cgroup is killed as for a timeout: an exec's
//! deadline bounds everything it started, and long-lived work belongs to `spawn`.
//! Until then its record stays listed (`ps_detail` counts them) and `kill` of its
//! pid ends them (see [`super::cgroup`]). Without cgroups they are left alone, as
//! they always were. A cancelled exec has its cgroup killed even when its own
//! process already exited.
//!
//! When the OOM killer struck in its cgroup, the reply shows `SIGKILL` and
//! `ps_detail` tells why (the reply cannot grow a field; see the protocol's
//! evolution rule).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_protocol::limits::{
    EXEC_DEADLINE_GRACE_SECS, EXEC_DEADLINE_SECS, EXEC_OUTPUT_CAP_BYTES,
};
use sandbox_protocol::{
    Event, ExecReply, ExecRequest, OutputChunk, Pid, ProcessKind, ProcessSpec, Stream,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::launch::{self, ChildPipes, ChildStdio};
use super::pump::pump;
use super::source::Source;
use super::table::{Capture, ProcessRecord, ProcessTable};
use super::ProcessError;
use crate::events::Events;

/// Chunks a streaming exec may have in flight before the child is made to wait.
/// They are not charged to the budget (they wait for the client's window before
/// they are), so keep them few: at most 4 reads of 64 KiB per streaming exec.
const STREAM_QUEUE_CHUNKS: usize = 4;

/// Runs `request` to completion (or its deadline).
pub async fn exec(
    table: &Arc<ProcessTable>,
    request: ExecRequest,
    events: &Events,
) -> Result<ExecReply, ProcessError> {
    let started = Instant::now();
    let deadline = exec_deadline(request.timeout_ms);
    let plan = launch::plan(&request.spec, false, table.defaults())?;
    let capture = (!request.stream)
        .then(|| Capture::new(EXEC_OUTPUT_CAP_BYTES, Some(events.budget().clone())));
    let stdio = ChildStdio::Pipes {
        stdin: !request.stdin.is_empty(),
    };
    let (record, pipes) = launch::start(table, plan, ProcessKind::Exec, stdio, capture)?;
    let kill_guard = KillOnDrop(Some(record.clone()));

    let (sink, mut chunks) = if request.stream {
        events.send(Event::Started(record.pid)).await;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE_CHUNKS);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let ChildPipes {
        stdin,
        stdout,
        stderr,
    } = pipes;
    start_pumps(&record, stdout, stderr, sink);
    // The request's charge is its stdin's: it goes when the child has it, so an
    // exec never holds it while its output waits for the budget.
    let stdin_charge = events.take_held();
    if let Some(mut stdin) = stdin {
        let bytes = request.stdin;
        tokio::spawn(async move {
            // The child may exit without reading; a broken pipe is not an error here.
            let _ = stdin.write_all(&bytes).await;
            drop(stdin_charge);
        });
    }

    let mut progress = record.subscribe();
    let timer = tokio::time::sleep(deadline);
    tokio::pin!(timer);
    let mut timed_out = false;
    loop {
        tokio::select! {
            Some(chunk) = recv(&mut chunks) => {
                // A reader that does not keep up must not hold off the deadline.
                tokio::select! {
                    _ = events.send(Event::Output(chunk)) => {}
                    () = &mut timer => { timed_out = true; break; }
                }
            }
            () = finished(&mut progress) => break,
            () = &mut timer => { timed_out = true; break; }
        }
    }
    if timed_out {
        if let Err(error) = record.kill_all_of_it() {
            tracing::warn!(pid = %record.pid, %error, "killing a timed-out exec failed");
        }
        let grace = Duration::from_secs(EXEC_DEADLINE_GRACE_SECS) - Duration::from_millis(500);
        let drained = async {
            loop {
                tokio::select! {
                    Some(chunk) = recv(&mut chunks) => { events.send(Event::Output(chunk)).await; }
                    () = finished(&mut progress) => break,
                }
            }
            cgroup_emptied(&record).await;
        };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(pid = %record.pid, "timed-out exec still not reaped after SIGKILL");
        }
    }
    // Everything the pumps sent before finishing is queued; forward the rest (after a
    // timeout only for as long as a reader keeps up: the ring still has it all).
    if let Some(rx) = chunks.as_mut() {
        let forward = async {
            while let Ok(chunk) = rx.try_recv() {
                events.send(Event::Output(chunk)).await;
            }
        };
        if timed_out {
            let _ = tokio::time::timeout(Duration::from_millis(500), forward).await;
        } else {
            forward.await;
        }
    }
    kill_guard.disarm();
    if !timed_out {
        kill_leftovers_at(table.clone(), record.clone(), started + deadline);
    }
    // The OOM killer's victims die of SIGKILL: no other exit is worth a read of
    // `memory.events` on the exec's path.
    let killed = record
        .progress()
        .exit
        .is_some_and(|exit| exit.signal == Some(libc::SIGKILL));
    if let Some(oom) = killed.then(|| record.oom_kill()).flatten() {
        tracing::info!(pid = %record.pid, kills = oom.kills, "exec hit the OOM killer");
    }

    let mut capture = record.take_capture();
    events.hold(std::mem::take(&mut capture.charge));
    Ok(ExecReply {
        pid: record.pid,
        stdout: capture.stdout,
        stderr: capture.stderr,
        stdout_truncated: capture.stdout_truncated,
        stderr_truncated: capture.stderr_truncated,
        exit: record.progress().exit,
        timed_out,
        duration_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    })
}

/// Starts `spec` detached: its output goes only to its ring.
pub fn spawn(table: &ProcessTable, spec: &ProcessSpec) -> Result<Pid, ProcessError> {
    let plan = launch::plan(spec, false, table.defaults())?;
    let (record, pipes) = launch::start(
        table,
        plan,
        ProcessKind::Spawn,
        ChildStdio::Pipes { stdin: false },
        None,
    )?;
    start_pumps(&record, pipes.stdout, pipes.stderr, None);
    Ok(record.pid)
}

/// The requested deadline, capped at the maximum; `None` means the maximum. (An
/// `eval`'s deadline follows the same rule.)
pub fn exec_deadline(timeout_ms: Option<u64>) -> Duration {
    let max = Duration::from_secs(EXEC_DEADLINE_SECS);
    timeout_ms.map_or(max, |ms| Duration::from_millis(ms).min(max))
}

/// Starts one pump per output pipe; a missing pipe counts as already drained.
pub(super) fn start_pumps(
    record: &Arc<ProcessRecord>,
    stdout: Option<tokio::net::unix::pipe::Receiver>,
    stderr: Option<tokio::net::unix::pipe::Receiver>,
    sink: Option<mpsc::Sender<OutputChunk>>,
) {
    for (pipe, stream) in [(stdout, Stream::Stdout), (stderr, Stream::Stderr)] {
        match pipe {
            Some(pipe) => {
                tokio::spawn(pump(
                    record.clone(),
                    Source::pipe(pipe),
                    stream,
                    sink.clone(),
                ));
            }
            None => record.settle_stream(),
        }
    }
}

async fn recv(rx: &mut Option<mpsc::Receiver<OutputChunk>>) -> Option<OutputChunk> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves once the process exited and its output is drained (or can never be).
async fn finished(progress: &mut tokio::sync::watch::Receiver<super::table::Progress>) {
    let _ = progress.wait_for(|p| p.finished()).await;
}

/// Kills what a finished exec left in its cgroup (unconfined: its process group)
/// once its deadline `at` passes (see the module docs). Without leftovers its
/// cgroup goes to a later exec instead (see [`super::cgroup`]).
fn kill_leftovers_at(table: Arc<ProcessTable>, record: Arc<ProcessRecord>, at: Instant) {
    tokio::spawn(async move {
        // Look for leftovers only once the reply is on its way: reading
        // `cgroup.events` costs about 0.4 ms in a TCG guest, which the client should
        // not wait for. (A yield waits until every task ready now, the ones that
        // queue and write the reply included, has run.)
        tokio::task::yield_now().await;
        if let Some(cgroup) = record.give_up_cgroup() {
            table.confinement().recycle(cgroup);
            return;
        }
        if !record.has_leftovers() {
            return;
        }
        tokio::time::sleep_until(at.into()).await;
        if record.has_leftovers() {
            tracing::info!(pid = %record.pid, "killing what a finished exec left at its deadline");
            if let Err(error) = record.kill_all_of_it() {
                tracing::warn!(pid = %record.pid, %error, "killing an exec's leftovers failed");
            }
        }
    });
}

/// How often a timed-out exec looks whether its cgroup emptied. `cgroup.kill` has
/// sent every member `SIGKILL` at once; a few go in milliseconds, the thousands of a
/// fork bomb in seconds on an emulated CPU (about 2.5 ms per task under TCG).
const CGROUP_EMPTY_POLL: Duration = Duration::from_millis(5);

/// Resolves once the record's cgroup holds no process (at once without a cgroup), so
/// the reply to a timed-out exec means "nothing of it is left".
async fn cgroup_emptied(record: &ProcessRecord) {
    let Some(cgroup) = record.live_cgroup() else {
        return;
    };
    while cgroup.populated() {
        tokio::time::sleep(CGROUP_EMPTY_POLL).await;
    }
}

/// Kills the process and all it started (see [`ProcessRecord::kill_all_of_it`]) when
/// dropped before [`Self::disarm`]: the exec's request was cancelled or its
/// connection dropped. Its cgroup goes even when the process itself already exited
/// (the cancel came while its output was drained): nobody is left to want it.
struct KillOnDrop(Option<Arc<ProcessRecord>>);

impl KillOnDrop {
    /// The exec ran to its end: what it left is for its deadline to deal with.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            if let Err(error) = record.kill_all_of_it() {
                tracing::debug!(pid = %record.pid, %error, "killing an abandoned exec failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_defaults_to_and_is_capped_at_the_maximum() {
        let max = Duration::from_secs(EXEC_DEADLINE_SECS);
        assert_eq!(exec_deadline(None), max);
        assert_eq!(exec_deadline(Some(u64::MAX)), max);
        assert_eq!(exec_deadline(Some(1500)), Duration::from_millis(1500));
    }
}
