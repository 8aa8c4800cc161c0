//! The process table: every tracked process, by pid, with its output ring and exit.
//!
//! A [`ProcessRecord`] publishes its [`Progress`] (output end, exit status, open output
//! streams) on a `watch` channel, so exec waiters and log followers sleep until
//! something changes instead of polling.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sandbox_protocol::limits::RING_BYTES;
use sandbox_protocol::{
    ExitStatus, LogsBatch, OomKill, Pid, ProcessDetail, ProcessInfo, ProcessKind, ProcessState,
    Stream,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use super::cgroup::{Confinement, ProcessCgroup};
use super::defaults::ProcessDefaults;
use super::gate::{ReapPermit, SpawnGate, SpawnPermit};
use super::ProcessError;
use crate::budget::{Budget, Charge, UNCHARGED_BYTES};
use crate::ring::{CursorAhead, OutputRing};
use crate::ring_pool::RingPool;
use crate::sys::unix_time_ms;

/// What waiters watch: enough to decide whether to read more or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The ring's end offset.
    pub end: u64,
    /// Set once the reaper collected the exit status.
    pub exit: Option<ExitStatus>,
    /// Output streams not yet settled: neither at end of file nor quiet since the
    /// process exited (see [`super::pump`]).
    pub unsettled_streams: u8,
}

impl Progress {
    /// Exited and every output stream settled: an exec can reply and a follower can
    /// stop. (Output a background grandchild writes later still lands in the ring.)
    pub fn finished(&self) -> bool {
        self.exit.is_some() && self.unsettled_streams == 0
    }
}

/// An exec's stdout and stderr, each kept up to a cap; past it bytes are counted
/// as truncated and dropped, but still read so the child never blocks.
///
/// Once it grows past [`UNCHARGED_BYTES`] it takes its whole size (both streams at
/// the cap) from the agent's [`Budget`] at once, before the bytes are kept: a capture
/// that holds a charge never waits for more, so captures waiting on the budget wait
/// only for others that run to their end.
#[derive(Debug, Default)]
pub struct Capture {
    /// Up to the cap of stdout.
    pub stdout: Vec<u8>,
    /// Up to the cap of stderr.
    pub stderr: Vec<u8>,
    /// Stdout went past the cap.
    pub stdout_truncated: bool,
    /// Stderr went past the cap.
    pub stderr_truncated: bool,
    /// What the kept bytes hold of the budget; goes with the reply.
    pub charge: Charge,
    cap: usize,
    budget: Option<Budget>,
    charged: Arc<tokio::sync::OnceCell<()>>,
}

impl Capture {
    /// An empty capture keeping at most `cap` bytes per stream, charged to `budget`
    /// once it is large.
    pub fn new(cap: usize, budget: Option<Budget>) -> Self {
        Self {
            cap,
            budget,
            ..Self::default()
        }
    }

    fn append(&mut self, stream: Stream, data: &[u8]) {
        let (buf, truncated) = match stream {
            Stream::Stdout | Stream::Pty => (&mut self.stdout, &mut self.stdout_truncated),
            Stream::Stderr => (&mut self.stderr, &mut self.stderr_truncated),
        };
        let room = self.cap.saturating_sub(buf.len());
        buf.extend_from_slice(&data[..room.min(data.len())]);
        *truncated |= data.len() > room;
    }
}

#[derive(Debug)]
struct RecordState {
    ring: OutputRing,
    capture: Option<Capture>,
    ended_at_ms: Option<u64>,
    exited_at: Option<Instant>,
}

/// One tracked process.
#[derive(Debug)]
pub struct ProcessRecord {
    /// Its pid, which is also its process group id.
    pub pid: Pid,
    /// How it was started.
    pub kind: ProcessKind,
    /// What it runs.
    pub argv: Vec<String>,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// The terminal's master end, for pty processes.
    pub pty: Option<Arc<AsyncFd<OwnedFd>>>,
    /// Held while input is written to the terminal, so the bytes of two input
    /// requests in flight at once never interleave.
    pub input_order: tokio::sync::Mutex<()>,
    /// Its own cgroup, when the agent confines in cgroups (see [`super::cgroup`]).
    cgroup: Option<ProcessCgroup>,
    /// Its cgroup went to a later exec once it finished (see
    /// [`ProcessRecord::give_up_cgroup`]): nothing of it is left there.
    cgroup_given_up: AtomicBool,
    state: Mutex<RecordState>,
    progress: watch::Sender<Progress>,
}

impl ProcessRecord {
    /// A running process with `streams` outputs to drain.
    pub fn new(
        pid: Pid,
        kind: ProcessKind,
        argv: Vec<String>,
        streams: u8,
        capture: Option<Capture>,
        pty: Option<Arc<AsyncFd<OwnedFd>>>,
    ) -> Self {
        let (progress, _) = watch::channel(Progress {
            end: 0,
            exit: None,
            unsettled_streams: streams,
        });
        Self {
            pid,
            kind,
            argv,
            started_at_ms: unix_time_ms(),
            pty,
            input_order: tokio::sync::Mutex::new(()),
            cgroup: None,
            cgroup_given_up: AtomicBool::new(false),
            state: Mutex::new(RecordState {
                ring: OutputRing::new(RING_BYTES),
                capture,
                ended_at_ms: None,
                exited_at: None,
            }),
            progress,
        }
    }

    /// The same record, in `cgroup`.
    pub fn with_cgroup(mut self, cgroup: Option<ProcessCgroup>) -> Self {
        self.cgroup = cgroup;
        self
    }

    /// The same record, its output ring growing from `pool` (see [`RingPool`]).
    pub fn with_ring_pool(self, pool: &RingPool) -> Self {
        self.lock().ring = OutputRing::pooled(RING_BYTES, pool.clone());
        self
    }

    /// Its cgroup while it acts on it: `None` without one, and once the cgroup went
    /// to a later exec.
    pub fn live_cgroup(&self) -> Option<&ProcessCgroup> {
        self.cgroup
            .as_ref()
            .filter(|_| !self.cgroup_given_up.load(Ordering::Acquire))
    }

    /// For a finished exec: its cgroup, when a later exec may have it (empty, not
    /// frozen, and the process did not die of `SIGKILL`, the OOM killer's signal);
    /// from then on the record no longer acts on it. `None` otherwise, and the
    /// second time.
    pub fn give_up_cgroup(&self) -> Option<&ProcessCgroup> {
        let exit = self.progress().exit?;
        if exit.signal == Some(libc::SIGKILL) {
            return None;
        }
        let cgroup = self.live_cgroup()?;
        if !cgroup.reusable() {
            return None;
        }
        (!self.cgroup_given_up.swap(true, Ordering::AcqRel)).then_some(cgroup)
    }

    /// Whether its cgroup went to a later exec.
    fn gave_up_cgroup(&self) -> bool {
        self.cgroup_given_up.load(Ordering::Acquire)
    }

    /// Kills the process and everything it started: its whole cgroup when it has
    /// one, else its process group (a child that called `setsid` escapes that). After
    /// it exited, the group is signalled only while it has members: the kernel keeps
    /// the number of a group with members allocated, so it names no other process;
    /// an empty group's number may have been reused, so it is left alone.
    pub fn kill_all_of_it(&self) -> std::io::Result<()> {
        if self.gave_up_cgroup() {
            // It finished with its cgroup empty: nothing is left to kill.
            return Ok(());
        }
        match &self.cgroup {
            Some(cgroup) => cgroup.kill(),
            None if self.progress().exit.is_none() || self.group_members() > 0 => {
                crate::sys::kill_process_group(self.pid.0, libc::SIGKILL)
            }
            None => Ok(()),
        }
    }

    /// Processes still alive in its cgroup (without one: its process group) after it
    /// exited (what a finished exec left behind); such a record is not forgotten, so
    /// they stay listed and killable.
    pub fn has_leftovers(&self) -> bool {
        self.progress().exit.is_some()
            && !self.gave_up_cgroup()
            && match &self.cgroup {
                Some(cgroup) => cgroup.populated(),
                None => self.group_members() > 0,
            }
    }

    /// Live members of its process group (unconfined mode: each child leads one).
    fn group_members(&self) -> usize {
        crate::sys::proc::process_group_members(self.pid.0)
    }

    /// The OOM killer's kills in its cgroup, if any.
    pub fn oom_kill(&self) -> Option<OomKill> {
        self.live_cgroup()?.oom_kill(self.pid)
    }

    /// The `ps_detail` row.
    pub fn detail(&self) -> ProcessDetail {
        let live = match (&self.cgroup, self.gave_up_cgroup()) {
            (Some(_), true) => 0,
            (Some(cgroup), false) => cgroup.pids().len(),
            (None, _) => match self.progress().exit {
                None => 1,
                Some(_) => self.group_members(),
            },
        };
        ProcessDetail {
            info: self.info(),
            cgroup: self.cgroup.as_ref().map(|c| c.relative().to_owned()),
            live_pids: u32::try_from(live).unwrap_or(u32::MAX),
            oom: self.oom_kill(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RecordState> {
        // A panic while holding this lock cannot leave the state half-updated in a
        // way that matters more than losing the process, so recover from poisoning.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many bytes the next read of an output pipe may take. Once the capture
    /// would grow large, it first takes its charge (see [`Capture`]; both pumps of a
    /// process wait for the one charge); until then reads stop at the uncharged
    /// size, so an exec waiting for the budget holds only that much. `max` when
    /// there is no capture or it is charged.
    pub async fn next_read_bytes(&self, max: usize) -> usize {
        let due = {
            let state = self.lock();
            match state.capture.as_ref() {
                Some(capture) if !capture.charged.initialized() => {
                    let kept = capture.stdout.len() + capture.stderr.len();
                    match (capture.budget.clone(), UNCHARGED_BYTES.saturating_sub(kept)) {
                        (None, _) => return max,
                        (Some(_), room) if room > 0 => return room.min(max),
                        (Some(budget), _) => (capture.charged.clone(), budget, 2 * capture.cap),
                    }
                }
                _ => return max,
            }
        };
        let (charged, budget, bytes) = due;
        charged
            .get_or_init(|| async {
                let charge = budget.reserve(bytes).await;
                // The capture may be gone (a timed-out exec replied): then the charge
                // just drops.
                if let Some(capture) = self.lock().capture.as_mut() {
                    capture.charge.merge(charge);
                }
            })
            .await;
        max
    }

    /// Appends output; returns the absolute offset of its first byte.
    pub fn push_output(&self, stream: Stream, data: &[u8]) -> u64 {
        let mut state = self.lock();
        let offset = state.ring.end();
        state.ring.push(stream, data);
        if let Some(capture) = state.capture.as_mut() {
            capture.append(stream, data);
        }
        let end = state.ring.end();
        self.progress.send_modify(|p| p.end = end);
        offset
    }

    /// One output stream settled: it reached its end, or stayed quiet after the exit.
    pub fn settle_stream(&self) {
        let _state = self.lock();
        self.progress
            .send_modify(|p| p.unsettled_streams = p.unsettled_streams.saturating_sub(1));
    }

    /// Frees the ring's memory; its bytes count as dropped from now on.
    fn discard_output(&self) -> usize {
        let mut state = self.lock();
        let freed = state.ring.reserved_bytes();
        state.ring.discard_all();
        freed
    }

    /// The reaper collected this status.
    pub fn mark_exited(&self, status: ExitStatus) {
        let mut state = self.lock();
        state.ended_at_ms = Some(unix_time_ms());
        state.exited_at = Some(Instant::now());
        self.progress.send_modify(|p| p.exit = Some(status));
    }

    /// A receiver that wakes on every change of [`Progress`].
    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// The current progress.
    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    /// Output from `cursor`, with the progress at the same instant.
    pub fn read_logs(&self, cursor: Option<u64>) -> Result<(LogsBatch, Progress), CursorAhead> {
        let state = self.lock();
        let batch = state.ring.read_from(cursor)?;
        Ok((batch, *self.progress.borrow()))
    }

    /// Bytes a `logs` read from `cursor` would return now, to charge them first.
    pub fn logs_bytes_from(&self, cursor: Option<u64>) -> usize {
        let state = self.lock();
        let from = cursor.unwrap_or(0).max(state.ring.start());
        usize::try_from(state.ring.end().saturating_sub(from)).unwrap_or(usize::MAX)
    }

    /// Takes the exec capture (empty if there was none).
    pub fn take_capture(&self) -> Capture {
        self.lock().capture.take().unwrap_or_default()
    }

    /// The `ps` row.
    pub fn info(&self) -> ProcessInfo {
        let state = self.lock();
        let exit = self.progress.borrow().exit;
        ProcessInfo {
            pid: self.pid,
            kind: self.kind,
            argv: self.argv.clone(),
            state: exit.map_or(ProcessState::Running, ProcessState::Exited),
            started_at_ms: self.started_at_ms,
            ended_at_ms: state.ended_at_ms,
        }
    }

    fn exited_before(&self, cutoff: Instant) -> bool {
        self.lock().exited_at.is_some_and(|at| at <= cutoff)
    }
}

/// Every tracked process, by pid.
#[derive(Debug)]
pub struct ProcessTable {
    records: Mutex<HashMap<Pid, Arc<ProcessRecord>>>,
    ring_pool: RingPool,
    gate: SpawnGate,
    forget_after: Duration,
    confinement: Confinement,
    defaults: ProcessDefaults,
}

impl ProcessTable {
    /// An empty table that forgets exited processes `forget_after` their exit, and
    /// confines by process group.
    pub fn new(forget_after: Duration) -> Self {
        Self::with_confinement(
            forget_after,
            Confinement::process_groups("no cgroup tree was set up"),
        )
    }

    /// An empty table whose processes are confined as `confinement` says.
    pub fn with_confinement(forget_after: Duration, confinement: Confinement) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            ring_pool: RingPool::default(),
            gate: SpawnGate::new(),
            forget_after,
            confinement,
            defaults: ProcessDefaults::default(),
        }
    }

    /// The same table, its rings growing from `pool`.
    pub fn with_ring_pool(mut self, pool: RingPool) -> Self {
        self.ring_pool = pool;
        self
    }

    /// The same table, starting processes with the template's `defaults`.
    pub fn with_defaults(mut self, defaults: ProcessDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// How processes are confined.
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// What a process gets when its request leaves a setting out.
    pub fn defaults(&self) -> &ProcessDefaults {
        &self.defaults
    }

    fn records(&self) -> MutexGuard<'_, HashMap<Pid, Arc<ProcessRecord>>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Held while a child is started and inserted; see [`super::gate`].
    pub fn spawn_gate(&self) -> SpawnPermit<'_> {
        self.gate.spawn()
    }

    /// Held by the reaper around `waitpid`; see [`super::gate`].
    pub fn reap_gate(&self) -> ReapPermit<'_> {
        self.gate.reap()
    }

    /// Starts tracking a process.
    pub fn insert(&self, record: Arc<ProcessRecord>) {
        self.records().insert(record.pid, record);
    }

    /// The record for `pid`.
    pub fn get(&self, pid: Pid) -> Result<Arc<ProcessRecord>, ProcessError> {
        self.records()
            .get(&pid)
            .cloned()
            .ok_or(ProcessError::NotFound { pid })
    }

    /// Every tracked process, oldest first.
    pub fn list(&self) -> Vec<ProcessInfo> {
        let records: Vec<_> = self.records().values().cloned().collect();
        let mut rows: Vec<_> = records.iter().map(|r| r.info()).collect();
        // Pids are the map's keys, so no two rows tie: an unstable sort, smaller code.
        rows.sort_unstable_by_key(|row| (row.started_at_ms, row.pid));
        rows
    }

    /// Every tracked process with its cgroup's state, oldest first.
    pub fn list_detail(&self) -> Vec<ProcessDetail> {
        let records: Vec<_> = self.records().values().cloned().collect();
        let mut rows: Vec<_> = records.iter().map(|r| r.detail()).collect();
        rows.sort_unstable_by_key(|row| (row.info.started_at_ms, row.info.pid));
        rows
    }

    /// Counts of (running, exited) tracked processes.
    pub fn counts(&self) -> (u32, u32) {
        let records: Vec<_> = self.records().values().cloned().collect();
        let exited = records
            .iter()
            .filter(|r| r.progress().exit.is_some())
            .count();
        let running = records.len() - exited;
        (
            u32::try_from(running).unwrap_or(u32::MAX),
            u32::try_from(exited).unwrap_or(u32::MAX),
        )
    }

    /// Hands an exit status to its record. Returns false for untracked pids (orphans
    /// re-parented to the agent, or descendants of tracked processes).
    pub fn on_exit(&self, pid: Pid, status: ExitStatus) -> bool {
        let record = self.records().get(&pid).cloned();
        match record {
            Some(record) => {
                record.mark_exited(status);
                true
            }
            None => false,
        }
    }

    /// Forgets processes that exited more than `forget_after` ago, except those whose
    /// cgroup still holds processes they left behind, and has the cgroups of the
    /// forgotten removed (on the cgroup remover's thread); returns how many were forgotten.
    pub fn forget_expired(&self, now: Instant) -> usize {
        let Some(cutoff) = now.checked_sub(self.forget_after) else {
            return 0;
        };
        let expired: Vec<_> = self
            .records()
            .values()
            .filter(|record| record.exited_before(cutoff) && !record.has_leftovers())
            .cloned()
            .collect();
        let mut records = self.records();
        for record in &expired {
            records.remove(&record.pid);
        }
        drop(records);
        for record in &expired {
            if let Some(cgroup) = record.live_cgroup() {
                self.confinement.discard(cgroup);
            }
        }
        expired.len()
    }

    /// The memory all rings grow from.
    pub fn ring_pool(&self) -> &RingPool {
        &self.ring_pool
    }

    /// When the ring pool has less than an eighth of itself free, discards the
    /// output of exited processes, oldest exits first (their cursors then report it
    /// as dropped), until it has that much again or no exited output is left: the
    /// output of running processes outranks theirs. Returns the bytes freed.
    pub fn reclaim_exited_rings(&self) -> usize {
        let target = isize::try_from(self.ring_pool.total() / 8).unwrap_or(isize::MAX);
        if self.ring_pool.available() >= target {
            return 0;
        }
        let mut exited: Vec<_> = self
            .records()
            .values()
            .filter(|r| r.progress().finished())
            .cloned()
            .collect();
        // One lock per record (and one copy of the sort), not two per comparison.
        exited.sort_by_cached_key(|r| r.lock().exited_at);
        let mut freed = 0;
        for record in exited {
            if self.ring_pool.available() >= target {
                break;
            }
            freed += record.discard_output();
        }
        freed
    }

    /// Kills every running tracked process (with its cgroup, when it has one) and
    /// what exited ones left behind.
    pub fn kill_all(&self) {
        let records: Vec<_> = self.records().values().cloned().collect();
        for record in &records {
            if record.progress().exit.is_none() || record.has_leftovers() {
                let _ = record.kill_all_of_it();
            }
        }
    }

    /// How often the sweeper should look for expired processes.
    pub fn sweep_interval(&self) -> Duration {
        (self.forget_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: i32) -> Arc<ProcessRecord> {
        Arc::new(ProcessRecord::new(
            Pid(pid),
            ProcessKind::Spawn,
            vec!["x".into()],
            2,
            None,
            None,
        ))
    }

    #[test]
    fn finished_needs_exit_and_drained_streams() {
        let rec = record(10);
        rec.mark_exited(ExitStatus {
            code: Some(0),
            signal: None,
        });
        assert!(!rec.progress().finished());
        rec.settle_stream();
        rec.settle_stream();
        assert!(rec.progress().finished());
    }

    #[test]
    fn capture_keeps_the_first_bytes_and_flags_truncation() {
        let mut capture = Capture::new(4, None);
        capture.append(Stream::Stdout, b"abc");
        capture.append(Stream::Stdout, b"def");
        capture.append(Stream::Stderr, b"xy");
        assert_eq!(capture.stdout, b"abcd");
        assert!(capture.stdout_truncated);
        assert_eq!(capture.stderr, b"xy");
        assert!(!capture.stderr_truncated);
    }

    #[test]
    fn a_short_ring_pool_takes_back_the_oldest_exited_output_first() {
        let table =
            ProcessTable::new(Duration::from_secs(60)).with_ring_pool(RingPool::new(600_000));
        let pooled = |pid| {
            Arc::new(
                ProcessRecord::new(Pid(pid), ProcessKind::Exec, vec![], 0, None, None)
                    .with_ring_pool(table.ring_pool()),
            )
        };
        for pid in [1, 2, 3] {
            let rec = pooled(pid);
            rec.push_output(Stream::Stdout, &vec![b'x'; 100_000]);
            rec.mark_exited(ExitStatus {
                code: Some(0),
                signal: None,
            });
            table.insert(rec);
            std::thread::sleep(Duration::from_millis(2));
        }
        let running = pooled(4);
        running.push_output(Stream::Stdout, &vec![b'y'; 100_000]);
        table.insert(running.clone());
        assert_eq!(table.ring_pool().available(), 200_000);
        assert_eq!(table.reclaim_exited_rings(), 0, "the pool is not short");

        // The running process grows to 250 kB: 50 kB are left, less than an eighth.
        running.push_output(Stream::Stdout, &vec![b'y'; 150_000]);
        assert_eq!(table.ring_pool().available(), 50_000);
        assert_eq!(table.reclaim_exited_rings(), 100_000);
        assert_eq!(table.ring_pool().available(), 150_000);
        // The oldest exit lost its output, reported as dropped; the newer ones kept it.
        let (batch, _) = table.get(Pid(1)).unwrap().read_logs(Some(0)).unwrap();
        assert_eq!((batch.dropped, batch.chunks.len()), (100_000, 0));
        let dropped = |pid| {
            table
                .get(Pid(pid))
                .unwrap()
                .read_logs(Some(0))
                .unwrap()
                .0
                .dropped
        };
        assert_eq!(dropped(3), 0);
        // Running processes are never trimmed.
        assert_eq!(running.read_logs(Some(0)).unwrap().0.dropped, 0);
        // A forgotten process gives its ring back.
        drop(running);
        table.records().clear();
        assert_eq!(table.ring_pool().available(), 600_000);
    }

    #[test]
    fn exited_processes_are_forgotten_after_the_delay_only() {
        let table = ProcessTable::new(Duration::from_secs(60));
        table.insert(record(1));
        table.insert(record(2));
        assert!(table.on_exit(
            Pid(1),
            ExitStatus {
                code: Some(0),
                signal: None
            }
        ));
        assert!(!table.on_exit(
            Pid(99),
            ExitStatus {
                code: Some(0),
                signal: None
            }
        ));
        assert_eq!(table.forget_expired(Instant::now()), 0);
        assert_eq!(
            table.forget_expired(Instant::now() + Duration::from_secs(61)),
            1
        );
        assert!(matches!(
            table.get(Pid(1)),
            Err(ProcessError::NotFound { .. })
        ));
        assert!(table.get(Pid(2)).is_ok());
        assert_eq!(table.counts(), (1, 0));
    }

    #[test]
    fn a_record_with_leftovers_is_kept_and_its_cgroup_removed_once_forgotten() {
        // A plain directory stands in for the cgroup: `cgroup.events` says populated.
        let dir = std::env::temp_dir().join(format!("sbx-forget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let events = dir.join("cgroup.events");
        std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
        let table = ProcessTable::new(Duration::from_secs(60));
        let rec = ProcessRecord::new(Pid(7), ProcessKind::Exec, vec![], 0, None, None)
            .with_cgroup(Some(ProcessCgroup::at(&dir)));
        let rec = Arc::new(rec);
        rec.mark_exited(ExitStatus {
            code: Some(0),
            signal: None,
        });
        table.insert(rec.clone());
        let later = Instant::now() + Duration::from_secs(61);
        assert!(rec.has_leftovers());
        assert_eq!(table.forget_expired(later), 0);
        assert!(table.get(Pid(7)).is_ok());
        // Its last process gone (no events file, no cgroup.procs: empty), it goes,
        // and so does its directory.
        std::fs::remove_file(&events).unwrap();
        assert!(!rec.has_leftovers());
        assert_eq!(table.forget_expired(later), 1);
        assert!(table.get(Pid(7)).is_err());
        assert!(!dir.exists());
    }

    /// A plain directory standing in for a cgroup whose `cgroup.events` says `events`,
    /// and an exec record in it that exited as `exit`.
    fn exec_in_cgroup(
        name: &str,
        events: &str,
        exit: ExitStatus,
    ) -> (std::path::PathBuf, Arc<ProcessRecord>) {
        let dir = std::env::temp_dir().join(format!("sbx-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.events"), events).unwrap();
        let rec = ProcessRecord::new(Pid(9), ProcessKind::Exec, vec![], 0, None, None)
            .with_cgroup(Some(ProcessCgroup::at(&dir)));
        rec.mark_exited(exit);
        (dir, Arc::new(rec))
    }

    const EXITED: ExitStatus = ExitStatus {
        code: Some(0),
        signal: None,
    };

    #[test]
    fn a_finished_execs_empty_cgroup_is_given_up_once_and_no_longer_acted_on() {
        let (dir, rec) = exec_in_cgroup("give-up", "populated 0\nfrozen 0\n", EXITED);
        assert!(rec.give_up_cgroup().is_some());
        assert!(rec.give_up_cgroup().is_none(), "given up twice");
        assert!(rec.live_cgroup().is_none());
        // Another exec runs there now: this record sees nothing of it.
        std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(!rec.has_leftovers());
        assert!(rec.kill_all_of_it().is_ok());
        let detail = rec.detail();
        assert_eq!(detail.live_pids, 0);
        assert_eq!(
            detail.cgroup.as_deref(),
            Some(dir.display().to_string().as_str())
        );
        // Forgetting the record leaves the directory to its new user.
        let table = ProcessTable::new(Duration::from_secs(1));
        table.insert(rec);
        assert_eq!(
            table.forget_expired(Instant::now() + Duration::from_secs(2)),
            1
        );
        assert!(dir.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cgroup_with_processes_frozen_or_after_a_sigkill_is_kept() {
        let killed = ExitStatus {
            code: None,
            signal: Some(libc::SIGKILL),
        };
        for (name, events, exit) in [
            ("populated", "populated 1\nfrozen 0\n", EXITED),
            ("frozen", "populated 0\nfrozen 1\n", EXITED),
            ("killed", "populated 0\nfrozen 0\n", killed),
        ] {
            let (dir, rec) = exec_in_cgroup(name, events, exit);
            assert!(rec.give_up_cgroup().is_none(), "{name}");
            assert!(rec.live_cgroup().is_some(), "{name}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // Still running: not yet.
        let dir = std::env::temp_dir().join(format!("sbx-running-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        let rec = ProcessRecord::new(Pid(10), ProcessKind::Exec, vec![], 0, None, None)
            .with_cgroup(Some(ProcessCgroup::at(&dir)));
        assert!(rec.give_up_cgroup().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
