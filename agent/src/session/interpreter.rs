//! One session: its interpreter (a tracked process of kind `session`, in a cgroup of
//! its own like any exec), the control channel to its driver, its output taps, and
//! the evaluation flow with its deadline.
//!
//! # An evaluation
//! 1. Both taps start collecting; the code goes to the driver.
//! 2. The driver runs it and replies (value, exception, `$?`) on the control
//!    channel.
//! 3. The agent sends a fresh marker; the driver writes it to stdout and stderr; the
//!    evaluation's output is everything before it (see [`super::tap`]).
//!
//! At the deadline (or when the request is cancelled) the interpreter is
//! interrupted with `SIGINT`: Python alone (as a notebook's kernel is: what the cell
//! started keeps running), a shell with its process group (as a terminal's Ctrl-C:
//! the foreground command dies; background jobs ignore it). Python raises
//! `KeyboardInterrupt` and the cell ends with it; the session lives on. An
//! interpreter that has not replied [`EVAL_INTERRUPT_GRACE_MS`] later is killed
//! with everything it started, and the session is dead. So is one whose driver
//! breaks the protocol: the agent never guesses where a broken channel resumes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_protocol::eval::EVAL_INTERRUPT_GRACE_MS;
use sandbox_protocol::limits::EXEC_OUTPUT_CAP_BYTES;
use sandbox_protocol::{ExitStatus, Language, ProcessKind, ProcessSpec, Stream};
use tokio::sync::{watch, Mutex, MutexGuard};

use super::control::{Control, ControlError};
use super::driver::{self, CellResult};
use super::tap::{Captured, Tap, MARKER_WAIT};
use super::{SessionError, DRIVER_START_SECS, REAP_WAIT_SECS};
use crate::process::launch::{self, ChildStdio};
use crate::process::source::Source;
use crate::process::table::{ProcessRecord, ProcessTable, Progress};
use crate::sys;

/// Where the driver is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Started; its driver not yet loaded.
    Starting,
    /// Loaded and waiting for messages.
    Ready,
    /// Killed, or its channel broke: no message goes to it again.
    Broken,
}

/// Resolves once the request that asked for an evaluation went away (its sender,
/// held by the request's handler, was dropped): once, then never again.
#[derive(Debug)]
pub struct Cancel(Option<tokio::sync::oneshot::Receiver<()>>);

impl Cancel {
    /// A cancel that fires when the returned sender is dropped.
    pub fn new() -> (tokio::sync::oneshot::Sender<()>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, Self(Some(rx)))
    }

    /// A cancel that never fires (the agent's own evaluations).
    pub fn never() -> Self {
        Self(None)
    }

    /// Resolves when the cancel fires; pending forever after that. Cancel-safe.
    pub async fn fired(&mut self) {
        match &mut self.0 {
            Some(rx) => {
                let _ = rx.await;
                self.0 = None;
            }
            None => std::future::pending().await,
        }
    }
}

/// What only the one evaluation (or reseed) in progress touches.
#[derive(Debug)]
pub struct Io {
    control: Control,
    phase: Phase,
}

/// One interpreter session.
#[derive(Debug)]
pub struct Session {
    /// Its name.
    pub name: String,
    /// Its language.
    pub language: Language,
    /// Its interpreter, as the process table tracks it.
    pub record: Arc<ProcessRecord>,
    evaluations: AtomicU64,
    stdout: Arc<Tap>,
    stderr: Arc<Tap>,
    /// Held for a whole evaluation: evaluations of one session run one at a time, in
    /// the order they asked (tokio's mutex is fair).
    io: Mutex<Io>,
}

/// What an evaluation produced.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// The driver's report; `None` when the interpreter died first.
    pub result: Option<CellResult>,
    /// Its share of stdout.
    pub stdout: Captured,
    /// Its share of stderr.
    pub stderr: Captured,
    /// The deadline passed and the interpreter was interrupted.
    pub timed_out: bool,
    /// The interpreter ended (or was killed) during the evaluation: how.
    pub died: Option<ExitStatus>,
    /// Wall time.
    pub duration: Duration,
}

/// How the first phase of an evaluation ended.
enum Outcome {
    Replied(CellResult),
    Broke(ControlError),
    Exited(ExitStatus),
    Killed,
}

impl Session {
    /// Starts the interpreter of a new session (its driver loads on first use, see
    /// [`Session::lock_ready`]). Its command is replaced; the template's defaults
    /// (environment, directory, user) apply as to every process.
    pub fn start(
        table: &ProcessTable,
        name: &str,
        language: Language,
        mut spec: ProcessSpec,
    ) -> Result<Arc<Self>, SessionError> {
        let starting = |error| SessionError::Start {
            name: name.to_owned(),
            language,
            error,
        };
        spec.command = Some(sandbox_protocol::Command::Argv(driver::argv(
            language, name,
        )));
        let plan = launch::plan(&spec, false, table.defaults()).map_err(starting)?;
        let (control, theirs) = Control::pair().map_err(|error| SessionError::Channel {
            name: name.to_owned(),
            error,
        })?;
        let (record, pipes) = launch::start(
            table,
            plan,
            ProcessKind::Session,
            ChildStdio::Channel { stdin: theirs },
            None,
        )
        .map_err(starting)?;
        let stdout = Tap::start(
            record.clone(),
            Stream::Stdout,
            pipes.stdout.map(Source::pipe),
        );
        let stderr = Tap::start(
            record.clone(),
            Stream::Stderr,
            pipes.stderr.map(Source::pipe),
        );
        tracing::info!(session = name, %language, pid = %record.pid, "session started");
        Ok(Arc::new(Self {
            name: name.to_owned(),
            language,
            record,
            evaluations: AtomicU64::new(0),
            stdout,
            stderr,
            io: Mutex::new(Io {
                control,
                phase: Phase::Starting,
            }),
        }))
    }

    /// How the interpreter ended, once it has.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.record.progress().exit
    }

    /// Counts one more evaluation; returns the new count.
    pub fn count_evaluation(&self) -> u64 {
        self.evaluations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The session for one evaluation: waits for the one in progress (or resolves
    /// `None` when `cancelled` first), and loads the driver of a new interpreter.
    pub async fn lock_ready(
        &self,
        cancel: &mut Cancel,
    ) -> Result<Option<MutexGuard<'_, Io>>, SessionError> {
        let mut io = tokio::select! {
            io = self.io.lock() => io,
            () = cancel.fired() => return Ok(None),
        };
        match io.phase {
            Phase::Ready => Ok(Some(io)),
            Phase::Broken => Err(self.died()),
            Phase::Starting => {
                self.load_driver(&mut io).await?;
                Ok(Some(io))
            }
        }
    }

    /// The error of a session that is gone.
    pub fn died(&self) -> SessionError {
        SessionError::Died {
            name: self.name.clone(),
            how: describe_exit(self.exit()),
        }
    }

    /// Sends the driver and waits for it to say it runs; on failure the
    /// interpreter is killed, and the error carries what it printed on stderr.
    async fn load_driver(&self, io: &mut Io) -> Result<(), SessionError> {
        self.stderr.begin(EXEC_OUTPUT_CAP_BYTES, None);
        let mut exit = self.record.subscribe();
        let language = self.language;
        let load = async {
            io.control.send(&driver::payload(language)).await?;
            driver::read_ready(language, &mut io.control).await
        };
        let outcome = tokio::select! {
            ready = tokio::time::timeout(Duration::from_secs(DRIVER_START_SECS), load) => match ready {
                Ok(Ok(about)) => Ok(about),
                // The channel failed most likely because the interpreter ended: say how.
                Ok(Err(error)) => match ended(&mut exit, error).await {
                    Ok(status) => Err(format!("it {}", describe_exit(Some(status)))),
                    Err(error) => Err(crate::init::ErrorChain(&error).to_string()),
                },
                Err(_) => Err(format!("no answer within {DRIVER_START_SECS} s")),
            },
            status = exited(&mut exit) => Err(format!("it {}", describe_exit(Some(status)))),
        };
        match outcome {
            Ok(about) => {
                drop(self.stderr.finish());
                io.phase = Phase::Ready;
                tracing::debug!(session = %self.name, %about, "session driver loaded");
                Ok(())
            }
            Err(reason) => {
                io.phase = Phase::Broken;
                self.kill_and_reap().await;
                let _ = tokio::time::timeout(DRAIN_AFTER_DEATH, self.stderr.drained()).await;
                let printed = self.stderr.finish().data;
                let printed = String::from_utf8_lossy(&printed);
                let printed: String = printed.trim().chars().take(2000).collect();
                let reason = match printed.is_empty() {
                    true => reason,
                    false => format!("{reason}; it printed: {printed}"),
                };
                Err(SessionError::Driver {
                    name: self.name.clone(),
                    language,
                    reason,
                })
            }
        }
    }

    /// Runs `code` on a session locked with [`Session::lock_ready`], within
    /// `deadline`; `cancel` firing counts as the deadline (the requester went away:
    /// the cell is interrupted, and the session stays in step). Large output is
    /// charged to `budget` (see [`super::tap::Captured::charge`]).
    pub async fn evaluate(
        &self,
        io: &mut Io,
        code: &str,
        deadline: Duration,
        cancel: &mut Cancel,
        budget: Option<&crate::budget::Budget>,
    ) -> Result<Evaluation, SessionError> {
        let message = driver::eval_message(self.language, code)?;
        let started = Instant::now();
        for tap in [&self.stdout, &self.stderr] {
            tap.begin(EXEC_OUTPUT_CAP_BYTES, budget);
        }
        let mut exit = self.record.subscribe();
        let mut evaluation = Evaluation::default();
        // The code goes whole or not at all: a cut message would put the channel
        // out of step, so only the interpreter's end stops the sending.
        let sent = tokio::select! {
            sent = io.control.send(&message) => sent.map_err(ControlError::Io),
            status = exited(&mut exit) => Err(ControlError::Exited(status)),
        };
        let outcome = match sent {
            Ok(()) => {
                self.wait_result(io, &mut exit, deadline, cancel, &mut evaluation)
                    .await
            }
            Err(ControlError::Exited(status)) => Outcome::Exited(status),
            Err(error) => ended(&mut exit, error)
                .await
                .map_or_else(Outcome::Broke, Outcome::Exited),
        };
        match outcome {
            Outcome::Replied(result) => match self.end_output(io, &mut exit).await {
                Ok(()) => evaluation.result = Some(result),
                Err(reason) => {
                    tracing::error!(session = %self.name, %reason, "session output out of step; killing it");
                    evaluation.died = Some(self.break_off(io).await);
                }
            },
            Outcome::Broke(error) => {
                tracing::error!(session = %self.name, %error, "session driver broke the protocol; killing it");
                evaluation.died = Some(self.break_off(io).await);
            }
            Outcome::Exited(status) => {
                io.phase = Phase::Broken;
                evaluation.died = Some(status);
            }
            Outcome::Killed => evaluation.died = Some(self.break_off(io).await),
        }
        if evaluation.died.is_some() {
            // What the interpreter wrote before it died is in the pipes; a job it
            // left behind may write on forever, so the wait is bounded.
            let drained = async { tokio::join!(self.stdout.drained(), self.stderr.drained()) };
            let _ = tokio::time::timeout(DRAIN_AFTER_DEATH, drained).await;
        }
        evaluation.stdout = self.stdout.finish();
        evaluation.stderr = self.stderr.finish();
        evaluation.duration = started.elapsed();
        Ok(evaluation)
    }

    /// Waits for the driver's reply, interrupting at the deadline (or cancel) and
    /// killing at the end of the grace.
    async fn wait_result(
        &self,
        io: &mut Io,
        exit: &mut watch::Receiver<Progress>,
        deadline: Duration,
        cancel: &mut Cancel,
        evaluation: &mut Evaluation,
    ) -> Outcome {
        let timer = tokio::time::sleep(deadline);
        tokio::pin!(timer);
        let mut interrupted = false;
        // A shell that takes the interrupt between two commands only runs its trap
        // and starts the next one (`touch x; sleep 60`): during the grace it gets
        // the interrupt again until it answers.
        let mut again = tokio::time::interval_at(
            tokio::time::Instant::now() + REINTERRUPT_EVERY,
            REINTERRUPT_EVERY,
        );
        let shell = self.language == Language::Shell;
        loop {
            tokio::select! {
                biased;
                result = driver::read_result(self.language, &mut io.control) => return match result {
                    Ok(result) => Outcome::Replied(result),
                    Err(error) => ended(exit, error).await.map_or_else(Outcome::Broke, Outcome::Exited),
                },
                status = exited(exit) => return Outcome::Exited(status),
                () = &mut timer => {
                    if interrupted {
                        tracing::warn!(session = %self.name, "interpreter did not come back from the interrupt; killing it");
                        return Outcome::Killed;
                    }
                    evaluation.timed_out = true;
                    interrupted = true;
                    self.interrupt();
                    grace(timer.as_mut());
                    again.reset();
                }
                () = cancel.fired(), if !interrupted => {
                    interrupted = true;
                    self.interrupt();
                    grace(timer.as_mut());
                    again.reset();
                }
                _ = again.tick(), if interrupted && shell => self.interrupt(),
            }
        }
    }

    /// Step 3 of an evaluation: a fresh marker to the driver, and both streams read
    /// up to it.
    async fn end_output(
        &self,
        io: &mut Io,
        exit: &mut watch::Receiver<Progress>,
    ) -> Result<(), String> {
        let marker = sys::random_hex(16);
        for tap in [&self.stdout, &self.stderr] {
            tap.expect(marker.as_bytes());
        }
        let flushed = async {
            io.control
                .send(&driver::flush_message(self.language, &marker))
                .await
                .map_err(|error| format!("cannot send the marker: {error}"))?;
            tokio::join!(self.stdout.marker_or_end(), self.stderr.marker_or_end());
            Ok(())
        };
        tokio::select! {
            done = tokio::time::timeout(MARKER_WAIT, flushed) => match done {
                Ok(result) => result,
                Err(_) => Err(format!("the output markers did not come within {MARKER_WAIT:?}")),
            },
            status = exited(exit) => Err(format!("the interpreter {} while its output was read", describe_exit(Some(status)))),
        }
    }

    /// Interrupts the evaluation in progress (see the module docs for who gets the
    /// signal).
    fn interrupt(&self) {
        let pid = self.record.pid.0;
        let sent = match self.language {
            Language::Python => sys::kill_process(pid, libc::SIGINT),
            Language::Shell => sys::kill_process_group(pid, libc::SIGINT),
        };
        match sent {
            Ok(()) => tracing::info!(session = %self.name, %pid, "evaluation interrupted"),
            Err(error) if error.raw_os_error() == Some(libc::ESRCH) => {}
            Err(error) => tracing::warn!(session = %self.name, %pid, %error, "cannot interrupt"),
        }
    }

    /// Kills the session for good: nothing will be sent to it again. Its status,
    /// or `SIGKILL` for one not reaped in time.
    async fn break_off(&self, io: &mut Io) -> ExitStatus {
        io.phase = Phase::Broken;
        self.kill_and_reap().await.unwrap_or(ExitStatus {
            code: None,
            signal: Some(libc::SIGKILL),
        })
    }

    /// Kills the interpreter and everything it started; its status once reaped
    /// (within [`REAP_WAIT_SECS`]).
    pub async fn kill_and_reap(&self) -> Option<ExitStatus> {
        if let Err(error) = self.record.kill_all_of_it() {
            tracing::warn!(session = %self.name, pid = %self.record.pid, %error, "cannot kill a session");
        }
        let mut exit = self.record.subscribe();
        tokio::time::timeout(Duration::from_secs(REAP_WAIT_SECS), exited(&mut exit))
            .await
            .ok()
    }

    /// Reseeds the language's generators from fresh kernel entropy (after a restore
    /// or fork). A session busy evaluating is reseeded right after, in the background.
    pub async fn reseed(self: &Arc<Self>) {
        match self.io.try_lock() {
            Ok(mut io) => self.reseed_locked(&mut io).await,
            Err(_busy) => {
                let session = self.clone();
                tokio::spawn(async move {
                    let mut io = session.io.lock().await;
                    session.reseed_locked(&mut io).await;
                });
            }
        }
    }

    async fn reseed_locked(&self, io: &mut Io) {
        // A driver not loaded yet has drawn no number: it seeds itself when it loads.
        if io.phase != Phase::Ready || self.exit().is_some() {
            return;
        }
        let mut seed = [0u8; 4];
        if let Err(error) = sys::random_bytes(&mut seed) {
            tracing::warn!(%error, "no entropy for a session's reseed");
        }
        let language = self.language;
        let reseed = async {
            let message = driver::reseed_message(language, u32::from_le_bytes(seed) >> 1);
            io.control.send(&message).await?;
            driver::read_reseeded(language, &mut io.control).await
        };
        match tokio::time::timeout(Duration::from_secs(REAP_WAIT_SECS), reseed).await {
            Ok(Ok(reseeded)) => {
                tracing::info!(session = %self.name, ?reseeded, "session reseeded");
            }
            Ok(Err(error)) => {
                tracing::error!(session = %self.name, %error, "session reseed failed; killing it");
                self.break_off(io).await;
            }
            Err(_) => {
                tracing::error!(session = %self.name, "session reseed got no answer; killing it");
                self.break_off(io).await;
            }
        }
    }
}

/// The longest wait for a dead interpreter's last output (each stream also stops
/// waiting at end of file, or once quiet for 100 ms).
const DRAIN_AFTER_DEATH: Duration = Duration::from_secs(1);

/// How long a driver whose channel failed has to show that its interpreter ended
/// (the reaper runs on `SIGCHLD`, a moment after the socket closed).
const EXIT_AFTER_CLOSE: Duration = Duration::from_secs(1);

/// A channel that failed because the interpreter ended (code that called `exit()`)
/// is a death; any other failure (a message out of protocol; a socket closed by
/// code while its interpreter lives on) breaks the protocol.
async fn ended(
    exit: &mut watch::Receiver<Progress>,
    error: ControlError,
) -> Result<ExitStatus, ControlError> {
    // A socket pair fails (end of file, EPIPE, ECONNRESET) when its other end closed.
    if matches!(error, ControlError::Closed | ControlError::Io(_)) {
        if let Ok(status) = tokio::time::timeout(EXIT_AFTER_CLOSE, exited(exit)).await {
            return Ok(status);
        }
    }
    Err(error)
}

/// How often a shell that has not answered an interrupt gets it again (see
/// `Session::wait_result`); its driver clears a stale one before the next code.
const REINTERRUPT_EVERY: Duration = Duration::from_millis(500);

/// Moves `timer` to the end of the interrupt's grace.
fn grace(timer: std::pin::Pin<&mut tokio::time::Sleep>) {
    let end = tokio::time::Instant::now() + Duration::from_millis(EVAL_INTERRUPT_GRACE_MS);
    timer.reset(end);
}

/// Resolves with the exit status once the process has been reaped. Cancel-safe.
async fn exited(exit: &mut watch::Receiver<Progress>) -> ExitStatus {
    loop {
        if let Some(status) = exit.borrow_and_update().exit {
            return status;
        }
        if exit.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// "exited with code 3", "was killed by signal 9", for messages.
pub fn describe_exit(status: Option<ExitStatus>) -> String {
    match status.map(|status| (status.code, status.signal)) {
        Some((Some(code), _)) => format!("exited with code {code}"),
        Some((None, Some(signal))) => format!("was killed by signal {signal}"),
        _ => "was killed".to_owned(),
    }
}
