//! The `eval` and `close_session` handlers.
//!
//! An evaluation runs in a task of its own, not in the request's: when the request
//! goes away (a cancel, a dropped connection, which abort the request's task) the
//! evaluation still ends properly (interrupted, its output read to its marker), so
//! the session stays in step for the next one.

use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::eval::MAX_EVAL_CODE_BYTES;
use sandbox_protocol::{
    is_valid_session_name, CloseSessionRequest, EvalReply, EvalRequest, Language, SessionInfo,
    WireError,
};

use super::interpreter::{Cancel, Evaluation, Session};
use super::{SessionError, Sessions};
use crate::agent::Agent;
use crate::budget::{Budget, Charge};
use crate::events::Events;
use crate::process::exec::exec_deadline;

/// Handles `eval`: opens (or starts) the session and runs the code in it. What its
/// large output holds of the agent's budget stays held (through `events`) until the
/// reply is written.
pub async fn eval(
    agent: &Agent,
    request: EvalRequest,
    events: &Events,
) -> Result<EvalReply, WireError> {
    let (reply, charge) = evaluate(agent, request)
        .await
        .map_err(|error| error.to_wire())?;
    events.hold(charge);
    Ok(reply)
}

/// Handles `close_session`: kills a live session's interpreter and all it started
/// (and waits, briefly, for it to be reaped), or forgets a dead one.
pub async fn close(agent: &Agent, request: CloseSessionRequest) -> Result<(), WireError> {
    let name = request.session;
    if !is_valid_session_name(&name) {
        return Err(SessionError::invalid_name(&name).to_wire());
    }
    match agent.sessions.close(&name) {
        Ok(Some(session)) => {
            let status = session.kill_and_reap().await;
            tracing::info!(session = %name, ?status, "session closed");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(error) => Err(error.to_wire()),
    }
}

/// Everything about a request that can be refused before a session is touched.
fn check(request: &EvalRequest) -> Result<(), SessionError> {
    if !is_valid_session_name(&request.session) {
        return Err(SessionError::invalid_name(&request.session));
    }
    if request.code.len() > MAX_EVAL_CODE_BYTES {
        return Err(SessionError::CodeTooLarge {
            len: request.code.len(),
        });
    }
    if request.language == Language::Shell && request.code.contains('\0') {
        return Err(SessionError::NulInShellCode);
    }
    Ok(())
}

async fn evaluate(
    agent: &Agent,
    request: EvalRequest,
) -> Result<(EvalReply, Charge), SessionError> {
    check(&request)?;
    let (session, started) = agent.sessions.open(
        &agent.table,
        &request.session,
        request.language,
        request.restart,
    )?;
    let deadline = exec_deadline(request.timeout_ms);
    // Dropped with this future when the request goes away: that cancels.
    let (_requester, cancel) = Cancel::new();
    let job = tokio::spawn(run(
        agent.sessions.clone(),
        session,
        request.code,
        deadline,
        cancel,
        started,
        agent.budget.clone(),
    ));
    match job.await {
        Ok(result) => result,
        Err(error) => Err(SessionError::Task(error.to_string())),
    }
}

/// The evaluation's own task.
async fn run(
    sessions: Arc<Sessions>,
    session: Arc<Session>,
    code: String,
    deadline: Duration,
    mut cancel: Cancel,
    started: bool,
    budget: Budget,
) -> Result<(EvalReply, Charge), SessionError> {
    let mut io = match session.lock_ready(&mut cancel).await {
        Ok(Some(io)) => io,
        Ok(None) => return Err(SessionError::Cancelled),
        Err(error) => {
            sessions.bury(&session);
            return Err(error);
        }
    };
    let evaluations = session.count_evaluation();
    let evaluation = session
        .evaluate(&mut io, &code, deadline, &mut cancel, Some(&budget))
        .await?;
    drop(io);
    if evaluation.died.is_some() {
        sessions.bury(&session);
    }
    Ok(reply(&session, started, evaluations, evaluation))
}

fn reply(
    session: &Session,
    started: bool,
    evaluations: u64,
    mut evaluation: Evaluation,
) -> (EvalReply, Charge) {
    let mut charge = std::mem::take(&mut evaluation.stdout.charge);
    charge.merge(std::mem::take(&mut evaluation.stderr.charge));
    let result = evaluation.result.unwrap_or_default();
    let reply = EvalReply {
        session: SessionInfo {
            name: session.name.clone(),
            language: session.language,
            pid: session.record.pid,
            started,
            evaluations,
        },
        stdout: evaluation.stdout.data,
        stderr: evaluation.stderr.data,
        stdout_truncated: evaluation.stdout.truncated,
        stderr_truncated: evaluation.stderr.truncated,
        value: result.value,
        value_truncated: result.value_truncated,
        exception: result.exception,
        status: result.status,
        timed_out: evaluation.timed_out,
        died: evaluation.died,
        duration_ms: u64::try_from(evaluation.duration.as_millis()).unwrap_or(u64::MAX),
    };
    (reply, charge)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(session: &str, language: Language, code: &str) -> EvalRequest {
        EvalRequest {
            session: session.into(),
            language,
            code: code.into(),
            timeout_ms: None,
            restart: false,
        }
    }

    #[test]
    fn bad_requests_are_refused_before_any_session() {
        let long = "x".repeat(MAX_EVAL_CODE_BYTES + 1);
        let refused = [
            (request("", Language::Python, "1"), "name"),
            (request("a b", Language::Python, "1"), "name"),
            (request(&"n".repeat(65), Language::Python, "1"), "name"),
            (request("s", Language::Python, &long), "bytes"),
            (request("s", Language::Shell, "echo\0"), "NUL"),
        ];
        for (request, says) in refused {
            let error = check(&request).unwrap_err();
            assert!(error.to_string().contains(says), "{error}");
        }
        // Python code may hold a NUL (in a string literal, say); the driver decides.
        assert!(check(&request("s", Language::Python, "'\0'")).is_ok());
    }
}
