//! A session's stdout and stderr: one reader per pipe that cuts the stream into
//! evaluations.
//!
//! The interpreter's fd 1 and 2 stay the same pipes for its whole life, so what a
//! cell prints directly (`os.system`, a subprocess, `sys.__stdout__`) arrives the
//! way `print` does. An evaluation's output ends at a **marker**: 32 random hex
//! digits the agent makes for that evaluation and sends the driver only after the
//! code finished; the driver writes it to the pipe through a descriptor it saved
//! at start (so a cell that redirected or closed its fd 1 does not lose it). Every
//! byte before the marker belongs to the evaluation, nothing after it does, and
//! code cannot print the marker of an evaluation before that evaluation ended.
//!
//! Every byte except the markers also goes to the process's output ring, so `logs`
//! of a session shows all it printed, between evaluations too (a background job's
//! output, which belongs to no evaluation). The reader never stops draining, so such
//! a job never blocks on a full pipe.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sandbox_protocol::Stream;
use tokio::sync::{watch, Notify};

use crate::budget::{Budget, Charge, UNCHARGED_BYTES};
use crate::process::pump::DRAIN_IDLE_AFTER_EXIT;
use crate::process::source::Source;
use crate::process::table::ProcessRecord;

/// Finds a marker in a stream that arrives in pieces: holds back a tail that could
/// be the marker's beginning until the next piece says whether it is.
#[derive(Debug)]
pub struct Splitter {
    marker: Vec<u8>,
    held: Vec<u8>,
}

/// What [`Splitter::feed`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Fed {
    /// Bytes that are certainly before the marker (held bytes included).
    pub before: Vec<u8>,
    /// The bytes after the marker, once it was found.
    pub after: Option<Vec<u8>>,
}

impl Splitter {
    /// A splitter looking for `marker` (non-empty).
    pub fn new(marker: Vec<u8>) -> Self {
        Self {
            marker,
            held: Vec::new(),
        }
    }

    /// Feeds the next piece of the stream.
    pub fn feed(&mut self, data: &[u8]) -> Fed {
        let mut window = std::mem::take(&mut self.held);
        window.extend_from_slice(data);
        if let Some(at) = find(&window, &self.marker) {
            let after = window[at + self.marker.len()..].to_vec();
            window.truncate(at);
            return Fed {
                before: window,
                after: Some(after),
            };
        }
        let keep = longest_prefix_suffix(&window, &self.marker);
        self.held = window.split_off(window.len() - keep);
        Fed {
            before: window,
            after: None,
        }
    }

    /// The held-back bytes: the stream ended without the marker, so they are output.
    pub fn into_held(self) -> Vec<u8> {
        self.held
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The length of the longest suffix of `data` that is a proper prefix of `marker`.
fn longest_prefix_suffix(data: &[u8], marker: &[u8]) -> usize {
    let longest = marker.len().saturating_sub(1).min(data.len());
    (1..=longest)
        .rev()
        .find(|&len| data[data.len() - len..] == marker[..len])
        .unwrap_or(0)
}

/// One evaluation's share of a stream, kept up to a cap.
#[derive(Debug, Default)]
pub struct Captured {
    /// The first bytes, up to the cap.
    pub data: Vec<u8>,
    /// More came than the cap.
    pub truncated: bool,
    /// What `data` holds of the agent's budget: once it would grow past
    /// [`UNCHARGED_BYTES`], its whole cap is charged before it grows (the reader
    /// waits for the budget, and the interpreter for the reader), as for an exec.
    pub charge: Charge,
    cap: usize,
    budget: Option<Budget>,
}

impl Captured {
    fn append(&mut self, data: &[u8]) {
        let room = self.cap.saturating_sub(self.data.len());
        self.data.extend_from_slice(&data[..room.min(data.len())]);
        self.truncated |= data.len() > room;
    }
}

#[derive(Debug, Default)]
struct TapState {
    /// Set while an evaluation collects this stream.
    capture: Option<Captured>,
    /// Set once the evaluation's marker is known, until it is seen.
    splitter: Option<Splitter>,
    marker_seen: bool,
    eof: bool,
}

/// One output stream of a session: shared by its reader task and the evaluations.
#[derive(Debug)]
pub struct Tap {
    stream: Stream,
    record: Arc<ProcessRecord>,
    state: Mutex<TapState>,
    /// Bumped on every change, for waiters.
    changed: watch::Sender<u64>,
    /// Told when an evaluation's code has finished (its marker is on its way): the
    /// reader then stops gathering output (see [`read`]).
    marker_expected: Notify,
}

impl Tap {
    /// Starts reading `source` into a new tap of `record`'s `stream`.
    pub fn start(record: Arc<ProcessRecord>, stream: Stream, source: Option<Source>) -> Arc<Self> {
        let tap = Arc::new(Self {
            stream,
            record,
            state: Mutex::new(TapState::default()),
            changed: watch::channel(0).0,
            marker_expected: Notify::new(),
        });
        match source {
            Some(source) => {
                tokio::spawn(read(tap.clone(), source));
            }
            None => {
                tap.lock().eof = true;
                tap.record.settle_stream();
            }
        }
        tap
    }

    fn lock(&self) -> MutexGuard<'_, TapState> {
        // Every update below leaves the state whole before anything can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// An evaluation starts: collect everything from now on, up to `cap` bytes,
    /// charged to `budget` once large (see [`Captured::charge`]).
    pub fn begin(&self, cap: usize, budget: Option<&Budget>) {
        let mut state = self.lock();
        state.capture = Some(Captured {
            cap,
            budget: budget.cloned(),
            ..Captured::default()
        });
        state.splitter = None;
        state.marker_seen = false;
    }

    /// The evaluation's code finished; its output ends at `marker`.
    pub fn expect(&self, marker: &[u8]) {
        self.lock().splitter = Some(Splitter::new(marker.to_vec()));
        self.marker_expected.notify_one();
    }

    /// An evaluation waits for its marker.
    fn expecting(&self) -> bool {
        self.lock().splitter.is_some()
    }

    /// Resolves once the marker was seen, or the stream ended.
    pub async fn marker_or_end(&self) {
        let mut changed = self.changed.subscribe();
        loop {
            {
                let state = self.lock();
                if state.marker_seen || state.eof {
                    return;
                }
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Resolves once the stream ended, or stayed quiet for [`DRAIN_IDLE_AFTER_EXIT`]
    /// (a background job that outlived the interpreter keeps the pipe open).
    pub async fn drained(&self) {
        let mut changed = self.changed.subscribe();
        loop {
            if self.lock().eof {
                return;
            }
            match tokio::time::timeout(DRAIN_IDLE_AFTER_EXIT, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// The evaluation is over: what it collected. Bytes held back as a possible
    /// marker (the marker never came) are output after all.
    pub fn finish(&self) -> Captured {
        let mut state = self.lock();
        let mut captured = state.capture.take().unwrap_or_default();
        if let Some(splitter) = state.splitter.take() {
            let held = splitter.into_held();
            captured.append(&held);
            self.record.push_output(self.stream, &held);
        }
        captured
    }

    /// Before `incoming` more bytes are accepted: when they would take the
    /// evaluation's capture past the uncharged size, waits for its charge.
    async fn charge_for(&self, incoming: usize) {
        let (budget, cap) = {
            let state = self.lock();
            match &state.capture {
                Some(capture)
                    if !state.marker_seen
                        && capture.charge.bytes() == 0
                        && capture.data.len() + incoming >= UNCHARGED_BYTES =>
                {
                    match &capture.budget {
                        Some(budget) => (budget.clone(), capture.cap),
                        None => return,
                    }
                }
                _ => return,
            }
        };
        let charge = budget.reserve(cap).await;
        // The capture may have ended meanwhile (then the charge just drops), or the
        // next evaluation's begun: a charge of the same size serves it as well.
        if let Some(capture) = self.lock().capture.as_mut() {
            capture.charge.merge(charge);
        }
    }

    /// A piece of the stream arrived: the evaluation's share to its capture,
    /// everything but the marker to the ring, in order (under the lock).
    fn accept(&self, data: &[u8]) {
        let mut state = self.lock();
        let state = &mut *state;
        let ring = match (&mut state.capture, &mut state.splitter) {
            (Some(capture), Some(splitter)) if !state.marker_seen => {
                let fed = splitter.feed(data);
                capture.append(&fed.before);
                let mut ring = fed.before;
                if let Some(after) = fed.after {
                    state.marker_seen = true;
                    state.splitter = None;
                    ring.extend_from_slice(&after);
                }
                ring
            }
            (Some(capture), None) if !state.marker_seen => {
                capture.append(data);
                data.to_vec()
            }
            _ => data.to_vec(),
        };
        if !ring.is_empty() {
            self.record.push_output(self.stream, &ring);
        }
        self.bump();
    }

    fn end(&self) {
        self.lock().eof = true;
        self.bump();
    }
}

/// Reads `source` until end of file. Like [`crate::process::pump`], the stream
/// settles for `logs` followers at end of file or once quiet after the exit.
///
/// Chatty output is gathered like an exec's ([`Source::read_chunk`]: a pipe read
/// again soon after its last read waits a moment for more), except while an
/// evaluation waits for its marker: a wait under way is cut short when the code
/// finishes, so an evaluation never ends later for it.
async fn read(tap: Arc<Tap>, mut source: Source) {
    let mut progress = tap.record.subscribe();
    let mut settled = false;
    let mut last_read = None;
    loop {
        let exited = progress.borrow_and_update().exit.is_some();
        let next = if settled || !exited {
            let gather = last_read.filter(|_| !tap.expecting());
            tokio::select! {
                next = source.read_chunk(crate::process::pump::READ_BYTES, gather) => next,
                () = tap.marker_expected.notified(), if gather.is_some() => {
                    last_read = None;
                    continue;
                }
                _ = progress.changed(), if !settled && !exited => continue,
            }
        } else {
            match tokio::time::timeout(
                DRAIN_IDLE_AFTER_EXIT,
                source.read_chunk(crate::process::pump::READ_BYTES, None),
            )
            .await
            {
                Ok(next) => next,
                Err(_idle) => {
                    tap.record.settle_stream();
                    settled = true;
                    continue;
                }
            }
        };
        match next {
            Ok(Some(data)) => {
                last_read = Some(Instant::now());
                tap.charge_for(data.len()).await;
                tap.accept(&data);
            }
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(pid = %tap.record.pid, stream = ?tap.stream, %error, "reading session output failed");
                break;
            }
        }
    }
    tap.end();
    if !settled {
        tap.record.settle_stream();
    }
}

/// How long [`Tap::marker_or_end`] may take after the driver was told the marker:
/// the driver writes it at once, and the reader never stops draining.
pub const MARKER_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(marker: &str, pieces: &[&str]) -> (String, Option<String>) {
        let mut splitter = Splitter::new(marker.as_bytes().to_vec());
        let mut before = Vec::new();
        for piece in pieces {
            let fed = splitter.feed(piece.as_bytes());
            before.extend_from_slice(&fed.before);
            if let Some(after) = fed.after {
                return (
                    String::from_utf8(before).unwrap(),
                    Some(String::from_utf8(after).unwrap()),
                );
            }
        }
        before.extend_from_slice(&splitter.into_held());
        (String::from_utf8(before).unwrap(), None)
    }

    #[test]
    fn a_marker_in_one_piece_splits_the_piece() {
        assert_eq!(
            split_all("MARK", &["abcMARKdef"]),
            ("abc".into(), Some("def".into()))
        );
        assert_eq!(split_all("MARK", &["MARK"]), ("".into(), Some("".into())));
    }

    #[test]
    fn a_marker_cut_across_pieces_is_still_found() {
        assert_eq!(
            split_all("MARK", &["ab", "cM", "A", "RKx"]),
            ("abc".into(), Some("x".into()))
        );
        assert_eq!(
            split_all("MARK", &["M", "A", "R", "K"]),
            ("".into(), Some("".into()))
        );
    }

    #[test]
    fn near_misses_are_output_not_swallowed() {
        // A prefix that turns out not to be the marker is released with what follows.
        assert_eq!(
            split_all("MARK", &["xMA", "Rx", "MAMARK"]),
            ("xMARxMA".into(), Some("".into()))
        );
        // A stream that ends on a marker's beginning keeps those bytes.
        assert_eq!(split_all("MARK", &["abcMAR"]), ("abcMAR".into(), None));
    }

    #[test]
    fn only_a_possible_marker_beginning_is_held_back() {
        let mut splitter = Splitter::new(b"MARK".to_vec());
        assert_eq!(splitter.feed(b"hello").before, b"hello");
        assert_eq!(splitter.feed(b"hi M").before, b"hi ");
        assert_eq!(longest_prefix_suffix(b"xxMAR", b"MARK"), 3);
        assert_eq!(longest_prefix_suffix(b"MARK", b"MARK"), 0);
        assert_eq!(longest_prefix_suffix(b"", b"MARK"), 0);
    }

    #[test]
    fn captures_keep_their_first_bytes_and_flag_the_rest() {
        let mut captured = Captured {
            cap: 4,
            ..Captured::default()
        };
        captured.append(b"abc");
        captured.append(b"def");
        assert_eq!(captured.data, b"abcd");
        assert!(captured.truncated);
    }
}
