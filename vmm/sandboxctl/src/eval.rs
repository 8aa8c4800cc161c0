//! `eval` and `close-session`: code in an interpreter session whose state persists
//! between runs.
//!
//! `eval` prints what the code wrote to stdout and stderr on ours, then the value
//! of a trailing Python expression on stdout and an exception's traceback on
//! stderr. Exit codes: 0; a shell session's `$?`; 1 when the Python code raised;
//! 124 when the deadline interrupted it; when the interpreter died, 128+N for a
//! signal N, else its exit code (at least 1). Ctrl-C interrupts the evaluation (the
//! session lives on) and exits 130.

use std::io::Read;
use std::time::Duration;

use anyhow::{bail, Context};
use sandbox_protocol::{EvalReply, EvalRequest, ExitStatus, Reply};
use sandbox_vmm::client::{Client, Step};
use tokio::signal::unix::{signal, SignalKind};

use crate::args::EvalArgs;
use crate::json::EvalView;
use crate::output::{self, print_json_line};
use crate::run::{exit_byte, seconds, EXIT_TIMED_OUT};

/// How long to wait for the agent to confirm a cancel after Ctrl-C.
const CANCEL_WAIT_SECS: u64 = 5;

/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// Evaluates the code of `args`; returns the exit code (see the module docs).
pub(crate) async fn eval(client: &Client, args: &EvalArgs) -> anyhow::Result<u8> {
    let timeout = args
        .timeout
        .map(|secs| seconds("--timeout", secs))
        .transpose()?;
    let code = if args.code == "-" {
        let mut code = String::new();
        std::io::stdin()
            .read_to_string(&mut code)
            .context("Cannot read the code from stdin (it must be UTF-8)")?;
        code
    } else {
        args.code.clone()
    };
    let request = EvalRequest {
        session: args.session.clone(),
        language: args.language,
        code,
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        restart: args.restart,
    };
    let mut interrupt = signal(SignalKind::interrupt()).context("Cannot watch for Ctrl-C")?;
    let mut stream = client.eval_stream(request)?;
    let reply = loop {
        tokio::select! {
            step = stream.next() => match step.context("eval failed")? {
                Step::Reply(Reply::Eval(reply)) => break reply,
                Step::Reply(other) => bail!("eval got an unexpected reply: {other:?}"),
                Step::Event(_) => {}
            },
            _ = interrupt.recv() => {
                let cancel = stream.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(CANCEL_WAIT_SECS), cancel).await;
                eprintln!("sandboxctl: interrupted; the evaluation was interrupted (the session lives on)");
                return Ok(EXIT_INTERRUPTED);
            }
        }
    };
    if args.json {
        print_json_line(&EvalView::from(&reply))?;
    } else {
        show(&reply, timeout)?;
    }
    Ok(exit_code(&reply))
}

/// Ends session `name`.
pub(crate) async fn close_session(client: &Client, name: &str) -> anyhow::Result<u8> {
    client
        .close_session(name)
        .await
        .with_context(|| format!("close-session {name} failed"))?;
    Ok(0)
}

/// Prints a reply for people: the streams, the value, the traceback, and what
/// happened to the session.
fn show(reply: &EvalReply, timeout: Option<Duration>) -> anyhow::Result<()> {
    output::stdout(&reply.stdout)?;
    output::stderr(&reply.stderr)?;
    if let Some(value) = &reply.value {
        output::print(&format!("{value}\n"))?;
    }
    if let Some(exception) = &reply.exception {
        output::stderr(exception.traceback.as_bytes())?;
    }
    for note in notes(reply, timeout) {
        output::stderr(format!("sandboxctl: {note}\n").as_bytes())?;
    }
    Ok(())
}

/// What the reply says beyond the output, one line each.
fn notes(reply: &EvalReply, timeout: Option<Duration>) -> Vec<String> {
    let mut notes = Vec::new();
    let cap = sandbox_protocol::limits::EXEC_OUTPUT_CAP_BYTES >> 20;
    for (name, cut) in [
        ("stdout", reply.stdout_truncated),
        ("stderr", reply.stderr_truncated),
    ] {
        if cut {
            notes.push(format!("{name} was cut at {cap} MiB"));
        }
    }
    if reply.value_truncated {
        notes.push("the value was cut".to_owned());
    }
    let name = &reply.session.name;
    if reply.timed_out {
        let limit = timeout.map_or_else(
            || format!("{}s", sandbox_protocol::limits::EXEC_DEADLINE_SECS),
            |t| format!("{}s", t.as_secs_f64()),
        );
        notes.push(match reply.died {
            None => format!("interrupted after {limit}; session {name} lives on"),
            Some(_) => format!("interrupted after {limit}, and it did not come back"),
        });
    }
    if let Some(status) = reply.died {
        notes.push(format!(
            "session {name} died ({}); its state is gone: --restart starts a fresh one",
            how(status)
        ));
    }
    notes
}

fn how(status: ExitStatus) -> String {
    match (status.code, status.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "killed".to_owned(),
    }
}

/// The exit code for a reply (see the module docs).
fn exit_code(reply: &EvalReply) -> u8 {
    if reply.timed_out {
        return EXIT_TIMED_OUT;
    }
    if let Some(status) = reply.died {
        return exit_byte(status.shell_code()).max(1);
    }
    if reply.exception.is_some() {
        return 1;
    }
    reply.status.map_or(0, exit_byte)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::{EvalException, Language, Pid, SessionInfo};

    fn reply() -> EvalReply {
        EvalReply {
            session: SessionInfo {
                name: "default".into(),
                language: Language::Python,
                pid: Pid(7),
                started: false,
                evaluations: 1,
            },
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            value: None,
            value_truncated: false,
            exception: None,
            status: None,
            timed_out: false,
            died: None,
            duration_ms: 1,
        }
    }

    #[test]
    fn exit_codes_say_how_the_evaluation_ended() {
        assert_eq!(exit_code(&reply()), 0);
        let shell = EvalReply {
            status: Some(3),
            ..reply()
        };
        assert_eq!(exit_code(&shell), 3);
        let raised = EvalReply {
            exception: Some(EvalException {
                type_name: "ValueError".into(),
                message: "x".into(),
                traceback: "ValueError: x\n".into(),
            }),
            ..reply()
        };
        assert_eq!(exit_code(&raised), 1);
        let died = |code, signal| EvalReply {
            died: Some(ExitStatus { code, signal }),
            ..reply()
        };
        assert_eq!(
            exit_code(&died(Some(0), None)),
            1,
            "a death is never success"
        );
        assert_eq!(exit_code(&died(Some(4), None)), 4);
        assert_eq!(exit_code(&died(None, Some(9))), 137);
        let interrupted = EvalReply {
            timed_out: true,
            ..died(None, Some(9))
        };
        assert_eq!(exit_code(&interrupted), EXIT_TIMED_OUT);
    }

    #[test]
    fn notes_name_the_session_and_what_to_do() {
        let notes = notes(
            &EvalReply {
                timed_out: true,
                died: Some(ExitStatus {
                    code: None,
                    signal: Some(9),
                }),
                stdout_truncated: true,
                ..reply()
            },
            Some(Duration::from_secs(2)),
        );
        assert_eq!(
            notes,
            [
                "stdout was cut at 1 MiB",
                "interrupted after 2s, and it did not come back",
                "session default died (killed by signal 9); its state is gone: --restart starts a fresh one"
            ]
        );
    }
}
