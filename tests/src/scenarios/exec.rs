//! exec: output order and caps, deadlines, exit status, stdin, environment, users,
//! cancellation.

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ErrorKind, ExecRequest, ProcessSpec, ProcessState, Stream, User};
use sandbox_vmm::client::ExecEvent;

use crate::transport::Target;
use crate::{eventually, exec_sh, ps_entry, sh, shell, wait_until_gone, within, CANARY_ENV};

const MIB: usize = 1024 * 1024;

/// A request for `spec` with no stdin and the default deadline.
fn exec_of(spec: ProcessSpec) -> ExecRequest {
    ExecRequest {
        spec,
        stdin: vec![],
        timeout_ms: None,
        stream: false,
    }
}

pub async fn collected_output_keeps_each_streams_order(target: Target) {
    let client = target.client();
    let reply = within(
        60,
        client.exec(exec_sh("echo a; echo b >&2; echo c; seq 1 20000")),
    )
    .await
    .unwrap();
    let expected: String = std::iter::once("a\nc\n".to_owned())
        .chain((1..=20000).map(|i| format!("{i}\n")))
        .collect();
    assert!(
        String::from_utf8(reply.stdout).unwrap() == expected,
        "stdout out of order"
    );
    assert_eq!(reply.stderr, b"b\n");
    assert!(!reply.stdout_truncated && !reply.stderr_truncated);
    assert_eq!(reply.exit.unwrap().code, Some(0));
    assert!(!reply.timed_out);
    assert!(reply.duration_us > 0);
}

pub async fn streamed_exec_sends_started_then_output_in_order_then_an_empty_reply(target: Target) {
    let client = target.client();
    // The pauses are the test: they make the three writes three separate chunks.
    let request = ExecRequest {
        stream: true,
        ..exec_sh("echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three")
    };
    let mut stream = client.exec_stream(request).unwrap();
    let first = within(20, stream.next()).await.unwrap();
    let ExecEvent::Started(pid) = first else {
        panic!("first event is not Started: {first:?}");
    };
    let mut seen = Vec::new();
    let reply = loop {
        match within(20, stream.next()).await.unwrap() {
            ExecEvent::Output(chunk) => seen.push((chunk.stream, chunk.data)),
            ExecEvent::Finished(reply) => break reply,
            ExecEvent::Started(again) => panic!("second Started({again})"),
        }
    };
    let merged: Vec<(Stream, Vec<u8>)> = seen.into_iter().fold(Vec::new(), |mut acc, (s, d)| {
        match acc.last_mut() {
            Some((last, data)) if *last == s => data.extend(d),
            _ => acc.push((s, d)),
        }
        acc
    });
    assert_eq!(
        merged,
        [
            (Stream::Stdout, b"one\n".to_vec()),
            (Stream::Stderr, b"two\n".to_vec()),
            (Stream::Stdout, b"three\n".to_vec()),
        ]
    );
    assert_eq!(reply.pid, pid);
    assert!(reply.stdout.is_empty() && reply.stderr.is_empty());
    assert_eq!(reply.exit.unwrap().code, Some(0));
}

/// `seq first inc last`'s output, as the guest's and the host's `seq` print it.
fn seq_output(first: u64, inc: u64, last: u64) -> Vec<u8> {
    (first..=last)
        .step_by(usize::try_from(inc).unwrap())
        .flat_map(|n| format!("{n}\n").into_bytes())
        .collect()
}

pub async fn a_streamed_exec_delivers_megabytes_of_both_streams_exactly(target: Target) {
    let client = target.client();
    // Both streams at once, big enough for many full chunks, each frame split
    // across the link's `Data` frames; every byte numbered by its line.
    let request = ExecRequest {
        stream: true,
        ..exec_sh("seq 1 200000 & seq 1 3 300000 >&2; wait")
    };
    let mut stream = client.exec_stream(request).unwrap();
    let (mut stdout, mut stderr, mut spans) = (Vec::new(), Vec::new(), Vec::new());
    let reply = loop {
        match within(120, stream.next()).await.unwrap() {
            ExecEvent::Started(_) => {}
            ExecEvent::Output(chunk) => {
                spans.push((chunk.offset, chunk.data.len() as u64));
                match chunk.stream {
                    Stream::Stdout => stdout.extend_from_slice(&chunk.data),
                    Stream::Stderr => stderr.extend_from_slice(&chunk.data),
                    Stream::Pty => panic!("a pty chunk from a pipe exec"),
                }
            }
            ExecEvent::Finished(reply) => break reply,
        }
    };
    assert_eq!(reply.exit.unwrap().code, Some(0), "{reply:?}");
    // Offsets count the process's output, both streams, from 0 (the two streams'
    // chunks may arrive in either order): together they tile it, nothing lost or
    // sent twice.
    spans.sort_unstable();
    let mut next = 0;
    for (offset, len) in spans {
        assert_eq!(offset, next, "a gap or an overlap at {next}");
        next = offset + len;
    }
    assert_eq!(next, (stdout.len() + stderr.len()) as u64);
    assert!(
        stdout == seq_output(1, 1, 200_000),
        "stdout differs ({} bytes)",
        stdout.len()
    );
    assert!(
        stderr == seq_output(1, 3, 300_000),
        "stderr differs ({} bytes)",
        stderr.len()
    );
}

/// How long writing a few MiB past the cap may take: a blocked writer would take
/// forever, so the bound is loose enough for a guest under TCG on a loaded host.
const PAST_CAP_SECS: u64 = 15;

pub async fn output_past_one_mib_is_truncated_and_the_child_is_not_blocked(target: Target) {
    let client = target.client();
    let started = Instant::now();
    let reply = within(
        60,
        client.exec(exec_sh(
            "head -c 3145728 /dev/zero; head -c 2097152 /dev/zero >&2; echo done >&2",
        )),
    )
    .await
    .unwrap();
    assert_eq!(reply.stdout.len(), MIB);
    assert_eq!(reply.stderr.len(), MIB);
    assert!(reply.stdout_truncated);
    assert!(reply.stderr_truncated);
    // Had the agent stopped reading at the cap, head would block and never exit 0.
    assert_eq!(reply.exit.unwrap().code, Some(0));
    assert!(!reply.timed_out);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(PAST_CAP_SECS), "took {took:?}");

    // One stream past the cap does not truncate the other.
    let reply = within(
        60,
        client.exec(exec_sh("head -c 3000000 /dev/zero; echo done >&2")),
    )
    .await
    .unwrap();
    assert_eq!(reply.stdout.len(), MIB);
    assert!(reply.stdout_truncated && !reply.stderr_truncated);
    assert_eq!(reply.stderr, b"done\n");
    assert_eq!(reply.exit.unwrap().code, Some(0));
}

pub async fn exactly_one_mib_is_not_truncated(target: Target) {
    let reply = within(
        30,
        target.client().exec(exec_sh("head -c 1048576 /dev/zero")),
    )
    .await
    .unwrap();
    assert_eq!(reply.stdout.len(), MIB);
    assert!(!reply.stdout_truncated);
}

/// How much later than its 1 s deadline a timed-out exec may answer (a guest under
/// TCG on a loaded host is slow to kill and reap).
const TIMEOUT_SLACK_SECS: u64 = 10;

pub async fn timeout_kills_the_whole_process_group_including_grandchildren(target: Target) {
    let client = target.client();
    let request = ExecRequest {
        timeout_ms: Some(1000),
        ..exec_sh("sleep 1000 & echo $!; sleep 1000")
    };
    let started = Instant::now();
    let reply = within(30, client.exec(request)).await.unwrap();
    let elapsed = started.elapsed();
    assert!(reply.timed_out, "{reply:?}");
    assert!(
        elapsed < Duration::from_secs(1 + TIMEOUT_SLACK_SECS),
        "reply took {elapsed:?}, more than the deadline plus {TIMEOUT_SLACK_SECS} s"
    );
    let grandchild: i32 = String::from_utf8(reply.stdout)
        .unwrap()
        .trim()
        .parse()
        .expect("the shell printed the grandchild's pid first");
    // The grandchild was in the group; once killed it is reaped (the agent is a
    // subreaper or init).
    wait_until_gone(client, grandchild, "the timed-out exec's grandchild").await;
}

pub async fn exit_code_and_signal_are_separate_fields(target: Target) {
    let client = target.client();
    let exited = client.exec(exec_sh("exit 3")).await.unwrap();
    let status = exited.exit.unwrap();
    assert_eq!((status.code, status.signal), (Some(3), None));
    assert_eq!(status.shell_code(), 3);

    let killed = client.exec(exec_sh("kill -9 $$")).await.unwrap();
    let status = killed.exit.unwrap();
    assert_eq!((status.code, status.signal), (None, Some(9)));
    assert_eq!(status.shell_code(), 137);
    assert!(!killed.timed_out);
}

pub async fn stdin_bytes_reach_the_child_even_past_a_pipe_buffer(target: Target) {
    let client = target.client();
    let small = ExecRequest {
        stdin: b"hello\0world\n".to_vec(),
        ..exec_sh("cat")
    };
    let reply = within(20, client.exec(small)).await.unwrap();
    assert_eq!(reply.stdout, b"hello\0world\n");

    // Larger than a pipe buffer, so the agent must write while it reads.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let request = ExecRequest {
        stdin: big.clone(),
        ..exec_sh("cat")
    };
    let reply = within(60, client.exec(request)).await.unwrap();
    assert!(reply.stdout == big, "300 KB of stdin came back different");

    let none = within(20, client.exec(exec_sh("wc -c"))).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&none.stdout).trim(), "0");
}

pub async fn env_and_cwd_apply_on_a_clean_environment(target: Target) {
    let spec = ProcessSpec {
        env: vec![
            ("FOO".into(), "first".into()),
            ("FOO".into(), "bar baz".into()),
        ],
        cwd: Some("/tmp".into()),
        ..shell("echo \"$FOO\"; pwd; env")
    };
    let reply = target.client().exec(exec_of(spec)).await.unwrap();
    let out = String::from_utf8(reply.stdout).unwrap();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("bar baz"), "later env entries win");
    assert_eq!(lines.next(), Some("/tmp"));
    let env: Vec<&str> = lines.collect();
    assert!(
        env.iter().any(|l| l.starts_with("PATH=")),
        "no default PATH: {env:?}"
    );
    assert!(
        env.iter().any(|l| l.starts_with("HOME=")),
        "no default HOME: {env:?}"
    );
    // The Unix-socket agent runs with this variable set; no agent may pass its own
    // environment on.
    assert!(
        !env.iter().any(|l| l.starts_with(CANARY_ENV)),
        "the agent's own environment leaked into the child: {env:?}"
    );
}

pub async fn a_missing_cwd_or_program_is_an_error_not_a_hang(target: Target) {
    let client = target.client();
    let spec = ProcessSpec {
        cwd: Some("/nonexistent/dir".into()),
        ..shell("true")
    };
    let err = within(20, client.exec(exec_of(spec))).await.unwrap_err();
    // The agent checks the cwd up front and calls a bad one a bad request.
    assert!(
        matches!(
            err.wire_kind(),
            Some(ErrorKind::BadRequest | ErrorKind::NotFound)
        ),
        "{err}"
    );

    let missing = ProcessSpec::new(Command::Argv(vec!["/no/such/program".into()]));
    let err = within(20, client.exec(exec_of(missing))).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

pub async fn user_switch_runs_as_that_user_or_is_refused(target: Target) {
    let client = target.client();
    let request = |user| {
        exec_of(ProcessSpec {
            user: Some(user),
            ..shell("id -u")
        })
    };
    let agent_is_root = sh(client, "id -u").await.trim() == "0";
    // A minimal guest may have no `nobody` in its /etc/passwd; its uid still works.
    let has_nobody = sh(client, "grep -c '^nobody:' /etc/passwd; true")
        .await
        .trim()
        != "0";
    let by_name = client.exec(request(User::Name("nobody".into()))).await;
    let by_uid = client.exec(request(User::Uid(65534))).await;
    if agent_is_root {
        let reply = by_uid.unwrap();
        assert_eq!(String::from_utf8_lossy(&reply.stdout).trim(), "65534");
        if has_nobody {
            let reply = by_name.unwrap();
            assert_eq!(String::from_utf8_lossy(&reply.stdout).trim(), "65534");
        } else {
            let err = by_name.unwrap_err();
            assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
        }
    } else {
        // An unprivileged agent cannot switch users and must say so.
        for reply in [by_name, by_uid] {
            let err = reply.unwrap_err();
            assert_eq!(err.wire_kind(), Some(ErrorKind::PermissionDenied), "{err}");
        }
    }
    let unknown = client
        .exec(request(User::Name("no-such-user-xyz".into())))
        .await
        .unwrap_err();
    assert_eq!(unknown.wire_kind(), Some(ErrorKind::NotFound), "{unknown}");
}

pub async fn dropping_a_streamed_exec_cancels_it_and_kills_the_group(target: Target) {
    let client = target.client();
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 1000")
        })
        .unwrap();
    let ExecEvent::Started(pid) = within(20, stream.next()).await.unwrap() else {
        panic!("no Started event");
    };
    drop(stream);
    let what = format!("exec {pid} to end after its stream was dropped");
    eventually(Duration::from_secs(10), &what, || async {
        let state = ps_entry(client, pid).await.map(|e| e.state);
        (!matches!(state, Some(ProcessState::Running))).then_some(())
    })
    .await;
}

pub async fn explicit_cancel_gets_a_final_frame(target: Target) {
    let client = target.client();
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 1000")
        })
        .unwrap();
    assert!(matches!(
        within(20, stream.next()).await.unwrap(),
        ExecEvent::Started(_)
    ));
    within(20, stream.cancel()).await.unwrap();
    // The connection is still good for other work.
    let reply = client.exec(exec_sh("echo ok")).await.unwrap();
    assert_eq!(reply.stdout, b"ok\n");
}
