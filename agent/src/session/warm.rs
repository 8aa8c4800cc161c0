//! The template's boot sessions, and the sessions' part of a restore or fork.
//!
//! The agent starts each session of the image's config, loads its driver and runs
//! its setup code (`import numpy`) before it binds its listeners, so a template's
//! ready snapshot, taken once the agent answers, holds live interpreters that have
//! already imported what they need. A setup that fails is logged and the session
//! stays (a setup is a convenience, not a condition of the sandbox).
//!
//! Every VM restored from that snapshot then holds interpreters in the same state,
//! random generators included: after `resumed` each live session reseeds from the
//! kernel's freshly reseeded pool (see [`super::interpreter::Session::reseed`]), so
//! forked children never draw the same numbers.

use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::{is_valid_session_name, WarmSession};

use super::interpreter::{Cancel, Session};
use super::{Sessions, WARM_SETUP_SECS};
use crate::agent::Agent;

/// Starts every boot session of the agent's image config and waits until each is
/// ready and set up (or failed, which is logged).
pub async fn start_boot_sessions(agent: &Agent) {
    let mut warming = tokio::task::JoinSet::new();
    for warm in &agent.image.sessions {
        if !is_valid_session_name(&warm.name) {
            tracing::error!(session = %warm.name, "boot session skipped: invalid name");
            continue;
        }
        match agent
            .sessions
            .open(&agent.table, &warm.name, warm.language, false)
        {
            Ok((session, _started)) => {
                warming.spawn(warm_up(agent.sessions.clone(), session, warm.clone()));
            }
            Err(error) => {
                tracing::error!(session = %warm.name, error = %crate::init::ErrorChain(&error), "boot session not started");
            }
        }
    }
    while warming.join_next().await.is_some() {}
}

/// Loads the driver of `session` and runs its setup.
async fn warm_up(sessions: Arc<Sessions>, session: Arc<Session>, warm: WarmSession) {
    let mut never = Cancel::never();
    let mut io = match session.lock_ready(&mut never).await {
        Ok(Some(io)) => io,
        Ok(None) => return,
        Err(error) => {
            tracing::error!(session = %warm.name, error = %crate::init::ErrorChain(&error), "boot session did not start");
            sessions.bury(&session);
            return;
        }
    };
    if warm.setup.trim().is_empty() {
        tracing::info!(session = %warm.name, "boot session ready");
        return;
    }
    let deadline = Duration::from_secs(WARM_SETUP_SECS);
    let evaluation = match session
        .evaluate(&mut io, &warm.setup, deadline, &mut never, None)
        .await
    {
        Ok(evaluation) => evaluation,
        Err(error) => {
            tracing::error!(session = %warm.name, %error, "boot session setup refused");
            return;
        }
    };
    drop(io);
    let printed = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
    let stderr = printed(&evaluation.stderr.data);
    let ms = evaluation.duration.as_millis();
    match (&evaluation.died, &evaluation.result) {
        (Some(status), _) => {
            tracing::error!(session = %warm.name, ?status, timed_out = evaluation.timed_out, %stderr, "boot session died in its setup");
            sessions.bury(&session);
        }
        (None, Some(result)) => match (&result.exception, result.status) {
            (Some(raised), _) => tracing::error!(
                session = %warm.name,
                exception = %raised.type_name,
                message = %raised.message,
                timed_out = evaluation.timed_out,
                "boot session setup raised; the session stays"
            ),
            (None, Some(status)) if status != 0 => tracing::error!(
                session = %warm.name, status, %stderr, "boot session setup failed; the session stays"
            ),
            _ => tracing::info!(session = %warm.name, ms, "boot session ready and set up"),
        },
        (None, None) => {}
    }
}

/// Reseeds every live session after a restore or fork; a session busy evaluating
/// is reseeded as soon as that evaluation ends.
pub async fn reseed_all(sessions: &Sessions) {
    for session in sessions.live() {
        session.reseed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::Language;

    use crate::process::table::ProcessTable;

    /// The first draw of Python's `random` after `random.seed(1)`.
    const FIRST_DRAW_AFTER_SEED_1: &str = "0.13436424411240122";

    async fn draw_after(session: &Session, code: &str) -> Option<String> {
        let mut never = Cancel::never();
        let mut io = session.lock_ready(&mut never).await.unwrap().unwrap();
        let deadline = Duration::from_secs(30);
        let evaluation = session
            .evaluate(&mut io, code, deadline, &mut never, None)
            .await
            .unwrap();
        evaluation.result.and_then(|result| result.value)
    }

    // Guards the point of reseeding: without it, every VM forked from one snapshot
    // would draw the same numbers. (The host's python3; no reaper runs here, so the
    // interpreter is killed and left to this test process.)
    #[tokio::test]
    async fn a_reseed_gives_a_python_session_fresh_numbers() {
        let table = ProcessTable::new(Duration::from_secs(60));
        let sessions = Sessions::new();
        let (session, _) = sessions
            .open(&table, "reseed", Language::Python, false)
            .unwrap();
        let seeded = "import random\nrandom.seed(1)\nrandom.random()";
        assert_eq!(
            draw_after(&session, seeded).await.as_deref(),
            Some(FIRST_DRAW_AFTER_SEED_1)
        );
        draw_after(&session, "random.seed(1)").await;
        reseed_all(&sessions).await;
        let fresh = draw_after(&session, "random.random()").await;
        assert!(fresh.is_some());
        assert_ne!(fresh.as_deref(), Some(FIRST_DRAW_AFTER_SEED_1));
        session.record.kill_all_of_it().unwrap();
    }
}
