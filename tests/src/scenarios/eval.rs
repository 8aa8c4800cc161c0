//! eval: interpreter sessions. State that persists, a cell's value and exception,
//! output by any route, a driver that user code cannot confuse, deadlines and
//! deaths, `ps`/`kill`/`close_session`, shell sessions, bad requests and caps.
//!
//! Each scenario uses sessions of its own names and closes them at the end: the
//! agent is shared, and its live sessions are capped. Python scenarios need
//! `python3` in the agent's machine (the host has it; the default microVM template
//! does not): without it they check that `eval` says so, and stop there.

use std::time::{Duration, Instant};

use sandbox_protocol::eval::{EVAL_VALUE_CAP_BYTES, MAX_EVAL_CODE_BYTES};
use sandbox_protocol::limits::EXEC_OUTPUT_CAP_BYTES;
use sandbox_protocol::{ErrorKind, EvalReply, EvalRequest, Language, ProcessKind, ProcessState};
use sandbox_vmm::client::{Client, ClientError};

use crate::transport::Target;
use crate::{eventually, ps_entry, sh, wait_exit, within};

/// A request for `code` in Python session `session`, with the default deadline.
fn python(session: &str, code: &str) -> EvalRequest {
    EvalRequest {
        session: session.to_owned(),
        language: Language::Python,
        code: code.to_owned(),
        timeout_ms: None,
        restart: false,
    }
}

/// The same in sh session `session`.
fn shell(session: &str, code: &str) -> EvalRequest {
    EvalRequest {
        language: Language::Shell,
        ..python(session, code)
    }
}

/// Evaluates `request`, which must be answered (whatever the code did).
async fn eval(client: &Client, request: EvalRequest) -> EvalReply {
    let shown = format!("{}: {:?}", request.session, request.code);
    within(60, client.eval(request))
        .await
        .unwrap_or_else(|error| panic!("{shown}: {error}"))
}

/// Evaluates `request`, which must fail at the agent; returns the error.
async fn refused(client: &Client, request: EvalRequest) -> ClientError {
    let shown = format!("{}: {:?}", request.session, request.code);
    match within(60, client.eval(request)).await {
        Ok(reply) => panic!("{shown} was evaluated: {reply:?}"),
        Err(error) => error,
    }
}

/// Evaluates `request`, which must end normally: no exception, no timeout, no death.
async fn clean(client: &Client, request: EvalRequest) -> EvalReply {
    let reply = eval(client, request).await;
    assert!(
        reply.exception.is_none() && !reply.timed_out && reply.died.is_none(),
        "not a clean evaluation: {reply:?}"
    );
    reply
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether the agent's machine has `python3`; when not, checks that a Python `eval`
/// says so (`NotFound`, naming it) and notes that the scenario stops there.
async fn has_python(target: &Target) -> bool {
    let client = target.client();
    if sh(
        client,
        "command -v python3 >/dev/null && echo yes || echo no",
    )
    .await
        == "yes\n"
    {
        return true;
    }
    let error = refused(client, python("no-python", "1")).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    assert!(error.to_string().contains("python3"), "{error}");
    eprintln!("no python3 in the agent's machine: checked that eval says so, and no more");
    false
}

async fn close(client: &Client, session: &str) {
    within(20, client.close_session(session))
        .await
        .unwrap_or_else(|error| panic!("close {session}: {error}"));
}

pub async fn python_state_persists_and_a_trailing_expression_is_its_value(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    let first = clean(client, python("state", "import math\nx = 41\nx + 1")).await;
    assert_eq!(first.value.as_deref(), Some("42"));
    assert!(first.session.started, "the first use starts the session");
    assert_eq!(first.session.evaluations, 1);
    assert_eq!(first.session.language, Language::Python);
    let second = clean(client, python("state", "def f(y):\n    return y * x\nf(2)")).await;
    assert_eq!(second.value.as_deref(), Some("82"));
    assert!(!second.session.started);
    assert_eq!(second.session.pid, first.session.pid);
    assert_eq!(second.session.evaluations, 2);
    // The repr of the value, like a notebook; `_` holds it; None shows no value.
    let repr = clean(client, python("state", "{'a': [1, 'two']}")).await;
    assert_eq!(repr.value.as_deref(), Some("{'a': [1, 'two']}"));
    let underscore = clean(client, python("state", "_['a'][1]")).await;
    assert_eq!(underscore.value.as_deref(), Some("'two'"));
    for code in ["None", "y = 3", "print('shown, not a value')", ""] {
        let reply = clean(client, python("state", code)).await;
        assert_eq!(reply.value, None, "{code:?}");
    }
    let imported = clean(client, python("state", "math.floor(x / 2)")).await;
    assert_eq!(imported.value.as_deref(), Some("20"));
    assert_eq!(imported.status, None, "status is for shell sessions");
    close(client, "state").await;
}

pub async fn python_exceptions_carry_type_message_and_the_cells_traceback(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    let reply = eval(client, python("raised", "1 / 0")).await;
    let exception = reply.exception.expect("no exception");
    assert_eq!(exception.type_name, "ZeroDivisionError");
    assert_eq!(exception.message, "division by zero");
    assert!(exception
        .traceback
        .starts_with("Traceback (most recent call last):\n"));
    assert!(exception.traceback.contains("File \"<cell 1>\", line 1"));
    assert!(exception
        .traceback
        .ends_with("ZeroDivisionError: division by zero\n"));
    // The driver's own frames are not shown: the cell's are, and the library's.
    let code = "import json\ndef parse(text):\n    return json.loads(text)\nparse('{')";
    let reply = eval(client, python("raised", code)).await;
    let exception = reply.exception.expect("no exception");
    assert_eq!(exception.type_name, "json.decoder.JSONDecodeError");
    let frames: Vec<&str> = exception
        .traceback
        .lines()
        .filter(|line| line.trim_start().starts_with("File "))
        .collect();
    assert!(
        frames[0].contains("\"<cell 2>\", line 4, in <module>"),
        "{frames:?}"
    );
    assert!(
        frames[1].contains("\"<cell 2>\", line 3, in parse"),
        "{frames:?}"
    );
    assert!(frames[2..].iter().all(|f| f.contains("json")), "{frames:?}");
    // A syntax error, a class of the cell's own, and output before the raise.
    let syntax = eval(client, python("raised", "1 +")).await;
    let syntax = syntax.exception.expect("no exception");
    assert_eq!(syntax.type_name, "SyntaxError");
    assert!(
        !syntax.traceback.contains("Traceback"),
        "{}",
        syntax.traceback
    );
    let own = "class Oops(Exception):\n    pass\nprint('before')\nraise Oops('mine')";
    let reply = eval(client, python("raised", own)).await;
    assert_eq!(reply.stdout, b"before\n");
    let exception = reply.exception.expect("no exception");
    assert_eq!(
        (exception.type_name.as_str(), exception.message.as_str()),
        ("Oops", "mine")
    );
    // The session survives every one of them.
    assert_eq!(
        eval(client, python("raised", "2 + 2"))
            .await
            .value
            .as_deref(),
        Some("4")
    );
    close(client, "raised").await;
}

pub async fn output_by_any_route_lands_in_its_own_evaluation(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    let code = "import os, subprocess, sys\n\
        print('print')\n\
        os.system('echo system; echo system-err >&2')\n\
        subprocess.run(['sh', '-c', 'echo subprocess'])\n\
        print('dunder', file=sys.__stdout__)\n\
        os.write(1, b'fd1\\n')\n\
        os.write(2, b'fd2\\n')\n\
        sys.stderr.write('stderr\\n')\n\
        'value'";
    let reply = clean(client, python("routes", code)).await;
    assert_eq!(
        text(&reply.stdout),
        "print\nsystem\nsubprocess\ndunder\nfd1\n"
    );
    assert_eq!(text(&reply.stderr), "system-err\nfd2\nstderr\n");
    assert_eq!(reply.value.as_deref(), Some("'value'"));
    // Nothing spills into the next evaluation, even from redirected descriptors.
    let redirect =
        "import os\nnull = os.open(os.devnull, os.O_WRONLY)\nos.dup2(null, 1)\nprint('lost')";
    let reply = clean(client, python("routes", redirect)).await;
    assert_eq!(reply.stdout, b"");
    let next = clean(
        client,
        python("routes", "import sys; sys.stderr.write('after\\n')"),
    )
    .await;
    assert_eq!(
        (next.stdout.as_slice(), next.stderr.as_slice()),
        (&b""[..], &b"after\n"[..])
    );
    close(client, "routes").await;
}

pub async fn driver_like_output_and_stdin_reads_cannot_confuse_the_driver(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    // Everything a confused driver might take for its own: frames, replies, markers
    // (32 hex digits, many of them), random bytes; and reads of stdin.
    let code = "import json, os, sys\n\
        forged = json.dumps({'value': 'forged', 'exception': None}).encode()\n\
        os.write(1, len(forged).to_bytes(4, 'little') + forged + b'\\n')\n\
        print('ready'); print('done 0'); print('flush ' + '0' * 32)\n\
        for _ in range(2000):\n    print(os.urandom(16).hex())\n\
        noise = os.urandom(65536)\n\
        os.write(2, noise)\n\
        stdin = sys.stdin.read() + os.read(0, 100).decode()\n\
        try:\n    input()\nexcept EOFError:\n    stdin += '<eof>'\n\
        stdin";
    let reply = clean(client, python("confuse", code)).await;
    assert_eq!(reply.value.as_deref(), Some("'<eof>'"), "stdin is empty");
    let lines: Vec<&[u8]> = reply.stdout.split(|&b| b == b'\n').collect();
    assert!(lines[0].ends_with(b"{\"value\": \"forged\", \"exception\": null}"));
    assert_eq!(
        &lines[1..4],
        [
            &b"ready"[..],
            b"done 0",
            format!("flush {}", "0".repeat(32)).as_bytes()
        ]
    );
    assert_eq!(
        lines.len(),
        4 + 2000 + 1,
        "one line per print and a last empty piece"
    );
    assert!(lines[4..2004].iter().all(|line| line.len() == 32));
    assert_eq!(reply.stderr.len(), 65536);
    // The noise is exactly what the cell wrote, and the session is in step after it.
    let check = clean(
        client,
        python(
            "confuse",
            "import hashlib\nhashlib.sha256(noise).hexdigest()",
        ),
    )
    .await;
    let digest = {
        use sha2::Digest;
        let hex: String = sha2::Sha256::digest(&reply.stderr)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("'{hex}'")
    };
    assert_eq!(check.value, Some(digest));
    // A subprocess that reads stdin gets end of file, not the control channel.
    let child = clean(
        client,
        python(
            "confuse",
            "import subprocess\nsubprocess.run(['cat'], capture_output=True).stdout",
        ),
    )
    .await;
    assert_eq!(child.value.as_deref(), Some("b''"));
    close(client, "confuse").await;
}

pub async fn a_timeout_interrupts_the_cell_and_the_session_keeps_its_state(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    clean(client, python("deadline", "kept = 'still here'")).await;
    let started = Instant::now();
    let request = EvalRequest {
        timeout_ms: Some(500),
        ..python("deadline", "import time\nprint('sleeping')\ntime.sleep(60)")
    };
    let reply = eval(client, request).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(reply.timed_out);
    assert_eq!(reply.died, None, "Python came back from the interrupt");
    assert_eq!(reply.stdout, b"sleeping\n");
    let exception = reply.exception.expect("no KeyboardInterrupt");
    assert_eq!(exception.type_name, "KeyboardInterrupt");
    assert!(
        exception.traceback.contains("time.sleep(60)"),
        "{}",
        exception.traceback
    );
    let after = clean(client, python("deadline", "kept")).await;
    assert_eq!(after.value.as_deref(), Some("'still here'"));
    assert_eq!(after.session.pid, reply.session.pid);
    close(client, "deadline").await;
}

pub async fn an_interpreter_that_ignores_the_interrupt_is_killed_and_reported_dead(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    let code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";
    let request = EvalRequest {
        timeout_ms: Some(300),
        ..python("stubborn", code)
    };
    let reply = eval(client, request).await;
    assert!(reply.timed_out);
    let died = reply.died.expect("not reported dead");
    assert_eq!((died.code, died.signal), (None, Some(libc::SIGKILL)));
    let error = refused(client, python("stubborn", "1")).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    assert!(error.to_string().contains("signal 9"), "{error}");
    close(client, "stubborn").await;
}

pub async fn exit_ends_the_session_and_only_restart_starts_a_fresh_one(target: Target) {
    if !has_python(&target).await {
        return;
    }
    let client = target.client();
    clean(client, python("exits", "state = 1")).await;
    let reply = eval(client, python("exits", "print('bye')\nexit(3)")).await;
    assert_eq!(reply.stdout, b"bye\n");
    assert_eq!(reply.died.and_then(|status| status.code), Some(3));
    assert!(!reply.timed_out && reply.exception.is_none());
    // The death is reported, never papered over with a fresh session.
    for _ in 0..2 {
        let error = refused(client, python("exits", "state")).await;
        assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
        assert!(error.to_string().contains("exited with code 3"), "{error}");
    }
    let fresh = eval(
        client,
        EvalRequest {
            restart: true,
            ..python("exits", "state")
        },
    )
    .await;
    assert!(fresh.session.started);
    assert_eq!(fresh.session.evaluations, 1);
    assert_ne!(fresh.session.pid, reply.session.pid);
    assert_eq!(
        fresh.exception.map(|e| e.type_name).as_deref(),
        Some("NameError")
    );
    close(client, "exits").await;
}

pub async fn sessions_are_listed_as_sessions_and_killed_like_any_process(target: Target) {
    let client = target.client();
    let reply = clean(client, shell("listed", "echo $$")).await;
    let pid = reply.session.pid;
    assert_eq!(
        text(&reply.stdout).trim(),
        pid.to_string(),
        "the shell is the tracked process"
    );
    let entry = ps_entry(client, pid).await.expect("not in ps");
    assert_eq!(entry.kind, ProcessKind::Session);
    assert_eq!(entry.state, ProcessState::Running);
    assert_eq!(entry.argv.last().map(String::as_str), Some("listed"));
    // Its output is in its ring, like any process's, without the markers.
    let logs = client.logs(pid, Some(0)).await.unwrap();
    assert_eq!(
        text(&super::chunk_bytes(&logs.batch.chunks)),
        format!("{pid}\n")
    );
    client.kill(pid, libc::SIGKILL).await.unwrap();
    let status = wait_exit(client, pid).await;
    assert_eq!(status.signal, Some(libc::SIGKILL));
    let error = refused(client, shell("listed", "echo")).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    let fresh = eval(
        client,
        EvalRequest {
            restart: true,
            ..shell("listed", "echo $$")
        },
    )
    .await;
    assert_ne!(fresh.session.pid, pid);
    close(client, "listed").await;
}

pub async fn close_session_kills_it_and_forgets_the_name(target: Target) {
    let client = target.client();
    let reply = clean(client, shell("closing", "X=1; sleep 1000 & echo started")).await;
    assert_eq!(reply.stdout, b"started\n");
    let pid = reply.session.pid;
    close(client, "closing").await;
    let entry = ps_entry(client, pid)
        .await
        .expect("a closed session is listed as exited");
    assert!(matches!(entry.state, ProcessState::Exited(_)), "{entry:?}");
    let error = within(20, client.close_session("closing"))
        .await
        .unwrap_err();
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    // The name is free: a new session starts, without `restart`.
    let fresh = clean(client, shell("closing", "echo \"[$X]\"")).await;
    assert!(fresh.session.started);
    assert_eq!(fresh.stdout, b"[]\n");
    close(client, "closing").await;
}

pub async fn shell_sessions_keep_cwd_variables_and_functions_and_report_status(target: Target) {
    let client = target.client();
    let dir = target.scratch("eval-shell").await;
    let setup = format!(
        "cd '{}'\nGREETING=hello\ngreet() {{ echo \"$GREETING, $1\"; }}\ntouch made-here",
        dir.display()
    );
    let first = clean(client, shell("shell", &setup)).await;
    assert_eq!(first.status, Some(0));
    assert_eq!(first.session.language, Language::Shell);
    let reply = clean(client, shell("shell", "pwd; greet world; ls; false")).await;
    assert_eq!(
        text(&reply.stdout),
        format!("{}\nhello, world\nmade-here\n", dir.display())
    );
    assert_eq!(reply.status, Some(1), "$? of the last command");
    // `$?` carries over, as at a prompt; multi-line code and stderr work.
    let reply = clean(
        client,
        shell(
            "shell",
            "echo \"prev=$?\"\nif true; then\n  echo err >&2\nfi",
        ),
    )
    .await;
    assert_eq!(
        (text(&reply.stdout), text(&reply.stderr)),
        ("prev=1\n".into(), "err\n".into())
    );
    let reply = clean(client, shell("shell", "(exit 7)")).await;
    assert_eq!(reply.status, Some(7));
    // Reading stdin gets end of file; a `break` or `continue` cannot derail the driver.
    let reply = clean(client, shell("shell", "cat; read line; echo \"read=$?\"")).await;
    assert_eq!(reply.stdout, b"read=1\n");
    for code in ["break", "continue", "for i in 1 2; do break 2; done"] {
        clean(client, shell("shell", code)).await;
        let reply = clean(client, shell("shell", "echo $GREETING")).await;
        assert_eq!(reply.stdout, b"hello\n", "after {code}");
    }
    // Driver-like output is just output.
    let reply = clean(
        client,
        shell(
            "shell",
            "printf 'ready\\ndone 0\\nflush %s\\n' 0123456789abcdef0123456789abcdef",
        ),
    )
    .await;
    assert_eq!(
        text(&reply.stdout),
        "ready\ndone 0\nflush 0123456789abcdef0123456789abcdef\n"
    );
    // A timeout interrupts the foreground command; the shell lives on.
    let request = EvalRequest {
        timeout_ms: Some(300),
        ..shell("shell", "sleep 60; echo next")
    };
    let started = Instant::now();
    let reply = eval(client, request).await;
    assert!(reply.timed_out && reply.died.is_none(), "{reply:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        clean(client, shell("shell", "echo $GREETING")).await.stdout,
        b"hello\n"
    );
    let reply = eval(client, shell("shell", "exit 4")).await;
    assert_eq!(reply.died.and_then(|status| status.code), Some(4));
    close(client, "shell").await;
}

pub async fn bad_requests_get_typed_errors(target: Target) {
    let client = target.client();
    let long_name = "n".repeat(sandbox_protocol::eval::MAX_SESSION_NAME_BYTES + 1);
    for name in ["", "has space", "a/b", long_name.as_str()] {
        let error = refused(client, shell(name, "true")).await;
        assert_eq!(
            error.wire_kind(),
            Some(ErrorKind::BadRequest),
            "{name:?}: {error}"
        );
        let error = within(10, client.close_session(name)).await.unwrap_err();
        assert_eq!(
            error.wire_kind(),
            Some(ErrorKind::BadRequest),
            "{name:?}: {error}"
        );
    }
    let error = refused(client, shell("bad", "echo \0")).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::BadRequest), "{error}");
    let huge = "#".repeat(MAX_EVAL_CODE_BYTES + 1);
    let error = refused(client, shell("bad", &huge)).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::TooLarge), "{error}");
    clean(client, shell("bad", "true")).await;
    let error = refused(client, python("bad", "1")).await;
    assert_eq!(error.wire_kind(), Some(ErrorKind::WrongType), "{error}");
    assert!(error.to_string().contains("sh session"), "{error}");
    let error = within(10, client.close_session("never-opened"))
        .await
        .unwrap_err();
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    close(client, "bad").await;
}

pub async fn output_and_values_are_capped(target: Target) {
    let client = target.client();
    let over = EXEC_OUTPUT_CAP_BYTES + 4096;
    let code = format!("head -c {over} /dev/zero | tr '\\0' o; echo err >&2");
    let reply = clean(client, shell("caps", &code)).await;
    assert_eq!(reply.stdout.len(), EXEC_OUTPUT_CAP_BYTES);
    assert!(reply.stdout_truncated && !reply.stderr_truncated);
    assert_eq!(reply.stderr, b"err\n");
    // The session is in step after it.
    assert_eq!(
        clean(client, shell("caps", "echo ok")).await.stdout,
        b"ok\n"
    );
    close(client, "caps").await;
    if !has_python(&target).await {
        return;
    }
    let reply = clean(
        client,
        python("caps", &format!("'v' * {}", 2 * EVAL_VALUE_CAP_BYTES)),
    )
    .await;
    let value = reply.value.expect("no value");
    assert!(reply.value_truncated);
    assert!(value.len() <= EVAL_VALUE_CAP_BYTES && value.starts_with("'vvv"));
    let reply = clean(client, python("caps", "'é' * 3")).await;
    assert_eq!(reply.value.as_deref(), Some("'ééé'"));
    assert!(!reply.value_truncated);
    close(client, "caps").await;
}

/// Waits until `path` exists in the agent's machine: an evaluation that creates it
/// has begun.
async fn wait_for_file(client: &Client, path: &std::path::Path, what: &str) {
    let script = format!("test -e '{}' && echo yes || echo no", path.display());
    eventually(Duration::from_secs(20), what, || async {
        (sh(client, &script).await == "yes\n").then_some(())
    })
    .await;
}

pub async fn evaluations_of_one_session_run_in_turn(target: Target) {
    let client = target.client();
    let other = target.connect().await;
    let begun = target.scratch("eval-turns").await.join("begun");
    clean(client, shell("turns", "order=")).await;
    let first = format!(
        "touch '{}'; sleep 1; order=\"${{order}}1\"",
        begun.display()
    );
    let slow = tokio::spawn({
        let client = client.clone();
        async move { clean(&client, shell("turns", &first)).await }
    });
    wait_for_file(client, &begun, "the first evaluation to begin").await;
    // The second, from another connection, waits for the first to end.
    let second = clean(&other, shell("turns", "order=\"${order}2\"; echo $order")).await;
    assert_eq!(second.stdout, b"12\n");
    assert!(
        second.duration_ms < 1000,
        "the wait is not the evaluation's time"
    );
    assert_eq!(second.session.evaluations, 3);
    slow.await.unwrap();
    close(client, "turns").await;
}

pub async fn a_dropped_evaluation_is_interrupted_and_the_session_lives_on(target: Target) {
    let client = target.client();
    let begun = target.scratch("eval-dropped").await.join("begun");
    clean(client, shell("dropped", "KEPT=yes")).await;
    let code = format!("touch '{}'; sleep 60; KEPT=no", begun.display());
    let stream = client.eval_stream(shell("dropped", &code)).unwrap();
    wait_for_file(client, &begun, "the evaluation to begin").await;
    let started = Instant::now();
    drop(stream);
    let reply = clean(client, shell("dropped", "echo $KEPT")).await;
    assert!(started.elapsed() < Duration::from_secs(20));
    // The interrupt ended `sleep`; the rest of that code ran (a shell has no way to
    // abandon it), which is what a Ctrl-C at a prompt does too.
    assert_eq!(reply.stdout, b"no\n");
    close(client, "dropped").await;
}

pub async fn resumed_reseeds_the_sessions_generators(target: Target) {
    let client = target.client();
    // busybox sh and bash have a `$RANDOM`, seeded by assigning it; dash has none.
    let probe = "[ \"${RANDOM:-x}\" != \"${RANDOM:-x}\" ] && echo yes || echo no";
    let has_random = clean(client, shell("reseed", probe)).await.stdout == b"yes\n";
    let seeded = "RANDOM=1; echo $RANDOM $RANDOM $RANDOM";
    let first = clean(client, shell("reseed", seeded)).await.stdout;
    if has_random {
        assert_eq!(
            clean(client, shell("reseed", seeded)).await.stdout,
            first,
            "seeding repeats"
        );
    }
    clean(client, shell("reseed", "RANDOM=1")).await;
    // What a restore or a fork sends: here no clock and no entropy of the host's.
    let resumed = within(30, client.resumed(0, Vec::new(), false)).await;
    if !target.facts().is_pid1 {
        let error = resumed.unwrap_err();
        assert_eq!(
            error.wire_kind(),
            Some(ErrorKind::PermissionDenied),
            "{error}"
        );
    } else {
        resumed.unwrap();
        let after = clean(client, shell("reseed", "echo $RANDOM $RANDOM $RANDOM"))
            .await
            .stdout;
        if has_random {
            assert_ne!(
                after, first,
                "the session drew the seeded numbers after a reseed"
            );
        }
    }
    close(client, "reseed").await;
}

pub async fn a_death_is_reported_even_while_a_leftover_job_keeps_writing(target: Target) {
    let client = target.client();
    // Regression: the reply waited for the pipes to go quiet, which a job the shell
    // left behind (writing every 50 ms for 30 s) never let them do.
    let code = "i=0; while [ $i -lt 600 ]; do echo x; sleep 0.05; i=$((i+1)); done &\nexit 3";
    let started = Instant::now();
    let reply = eval(client, shell("leftover", code)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reply.died.and_then(|status| status.code), Some(3));
    close(client, "leftover").await;
}
