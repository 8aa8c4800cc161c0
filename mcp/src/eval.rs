//! The `eval_code` tool's checks and result: its arguments become an
//! [`EvalRequest`], and the agent's [`EvalReply`] an [`EvalCodeResult`] whose `error`
//! says what happened to the code or its session and what to do next.

use sandbox_protocol::{ErrorKind, EvalReply, EvalRequest, Language};
use sandbox_vmm::client::ClientError;

use sandbox_engine::node::TemplateEntry;

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

/// Whether `error` is the agent's refusal to start a Python session because the
/// sandbox has no `python3` (its `SessionError::Start`, "python3 not found in PATH").
pub fn is_missing_python(error: &ClientError) -> bool {
    match error {
        ClientError::Agent(wire) => {
            wire.kind == ErrorKind::NotFound && wire.message.contains("python3 not found")
        }
        _ => false,
    }
}

/// The templates among `entries` whose agent starts a Python session at boot, so
/// they surely have `python3`.
pub fn python_templates(entries: &[TemplateEntry]) -> Vec<String> {
    entries
        .iter()
        .filter(|entry| {
            entry
                .sessions
                .iter()
                .any(|session| session.ends_with(":python"))
        })
        .map(|entry| entry.name.clone())
        .collect()
}

/// What `eval_code` says on a sandbox of `template`, which has no `python3`, naming
/// a template that has it (`with_python`) and how to get a sandbox of it (`claim`,
/// given the template's name).
pub fn no_python(
    sandbox_id: &str,
    template: &str,
    with_python: &[String],
    claim: impl Fn(&str) -> String,
    otherwise: &str,
) -> ToolError {
    let next = match with_python.first() {
        Some(name) => format!(
            "Template {name:?} has it (it starts a Python session at boot): {}, or {otherwise}.",
            claim(name)
        ),
        None => format!(
            "No template on this host starts a Python session; {otherwise}, or ask for a \
             template built with python3."
        ),
    };
    ToolError::new(format!(
        "eval_code failed in sandbox {sandbox_id}: its template {template:?} has no python3, so \
         it cannot run Python. {next}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::WireError;

    #[test]
    fn a_missing_python3_is_told_from_other_failures() {
        let missing = ClientError::Agent(WireError::new(
            ErrorKind::NotFound,
            "Cannot start the python interpreter of session \"default\": Cannot start \
             python3: python3 not found in PATH",
        ));
        assert!(is_missing_python(&missing));
        let dead = ClientError::Agent(WireError::new(
            ErrorKind::NotFound,
            "Session \"default\" is dead: its interpreter exited",
        ));
        assert!(!is_missing_python(&dead));
    }

    /// Regression: the hint was "call eval_code again with restart: true", which
    /// cannot help a template without Python.
    #[test]
    fn no_python_names_a_template_that_has_it() {
        let error = no_python(
            "sbx-1",
            "default",
            &["python".to_owned()],
            |name| format!("create_sandbox with template: {name:?}"),
            "use language: \"sh\"",
        );
        assert!(
            error.message.contains("\"default\" has no python3"),
            "{}",
            error.message
        );
        assert!(
            error
                .message
                .contains("create_sandbox with template: \"python\""),
            "{}",
            error.message
        );
        assert!(!error.message.contains("restart"), "{}", error.message);
        let none = no_python(
            "sbx-1",
            "default",
            &[],
            |_| String::new(),
            "use language: \"sh\"",
        );
        assert!(none.message.contains("No template"), "{}", none.message);
    }
}
