//! The `eval_code` tool's checks and result: its arguments become an
//! [`EvalRequest`], and the agent's [`EvalReply`] an [`EvalCodeResult`] whose `error`
//! says what happened to the code or its session and what to do next.

use sandbox_protocol::{EvalReply, EvalRequest, Language};

use crate::error::ToolError;
use crate::params::{timeout_secs, EvalCodeParams};
use crate::render::{EvalCodeResult, ExceptionInfo};

/// The request `params` ask for, and its timeout in seconds.
pub fn request(params: EvalCodeParams) -> Result<(EvalRequest, u64), ToolError> {
    let Some(language) = Language::parse(&params.language) else {
        return Err(ToolError::new(format!(
            "language {:?} is not one eval_code runs: use \"python\" or \"sh\".",
            params.language
        )));
    };
    if !sandbox_protocol::is_valid_session_name(&params.session) {
        return Err(ToolError::new(format!(
            "session {:?} is not a session name: use 1 to {} letters, digits, '-', '_' or \
             '.', or omit it for \"default\".",
            params.session,
            sandbox_protocol::eval::MAX_SESSION_NAME_BYTES
        )));
    }
    let timeout_secs = timeout_secs(params.timeout_seconds)?;
    let request = EvalRequest {
        session: params.session,
        language,
        code: params.code,
        timeout_ms: Some(timeout_secs * 1000),
        restart: params.restart,
    };
    Ok((request, timeout_secs))
}

/// The `eval_code` result, with `error` set when the code raised, timed out or
/// the session died.
pub fn result(reply: EvalReply, timeout_secs: u64) -> EvalCodeResult {
    let name = reply.session.name.clone();
    let error = match (&reply.died, reply.timed_out, &reply.exception) {
        (Some(_), true, _) => Some(format!(
            "Interrupted after {timeout_secs} s and it did not come back, so session {name:?} \
             was killed: its state is gone. Call again with restart: true for a fresh session."
        )),
        (Some(status), false, _) => Some(format!(
            "Session {name:?} died during the evaluation (exit code {}): its state is gone. \
             Call again with restart: true for a fresh session.",
            status.shell_code()
        )),
        (None, true, _) => Some(format!(
            "Interrupted after {timeout_secs} s; session {name:?} keeps its state. Pass a \
             larger timeout_seconds (at most 300), or run long jobs with spawn and poll them \
             with logs."
        )),
        (None, false, Some(raised)) => Some(format!(
            "The code raised {}: {}",
            raised.type_name, raised.message
        )),
        (None, false, None) => None,
    };
    EvalCodeResult {
        session: name,
        language: reply.session.language.as_str().to_owned(),
        pid: reply.session.pid.0,
        started: reply.session.started,
        evaluations: reply.session.evaluations,
        stdout: String::from_utf8_lossy(&reply.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
        truncated: reply.stdout_truncated || reply.stderr_truncated,
        value: reply.value,
        value_truncated: reply.value_truncated,
        exception: reply.exception.map(|raised| ExceptionInfo {
            type_name: raised.type_name,
            message: raised.message,
            traceback: raised.traceback,
        }),
        status: reply.status,
        timed_out: reply.timed_out,
        died: reply.died.is_some(),
        exit_code: reply.died.map(|status| status.shell_code()),
        signal: reply.died.and_then(|status| status.signal),
        duration_ms: reply.duration_ms,
        error,
    }
}
