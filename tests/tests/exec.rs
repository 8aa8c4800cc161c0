//! exec: output order and caps, deadlines, exit status, stdin, environment, users.

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ErrorKind, ExecRequest, ProcessSpec, Stream, User};
use sandbox_tests::{exec_sh, shell, within, TestAgent, CANARY_ENV};
use sandbox_vmm::client::ExecEvent;

const MIB: usize = 1024 * 1024;

#[tokio::test]
async fn collected_exec_keeps_each_streams_order() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let reply = within(
        30,
        client.exec(exec_sh("echo a; echo b >&2; echo c; seq 1 20000")),
    )
    .await
    .unwrap();
    let expected: String = std::iter::once("a\nc\n".to_owned())
        .chain((1..=20000).map(|i| format!("{i}\n")))
        .collect();
    assert_eq!(String::from_utf8(reply.stdout).unwrap(), expected);
    assert_eq!(reply.stderr, b"b\n");
    assert!(!reply.stdout_truncated && !reply.stderr_truncated);
    assert_eq!(reply.exit.unwrap().code, Some(0));
    assert!(!reply.timed_out);
    assert!(reply.duration_us > 0);
}

#[tokio::test]
async fn streamed_exec_sends_started_then_output_in_order_then_an_empty_reply() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let request = ExecRequest {
        stream: true,
        ..exec_sh("echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three")
    };
    let mut stream = client.exec_stream(request).unwrap();
    let first = within(10, stream.next()).await.unwrap();
    let ExecEvent::Started(pid) = first else {
        panic!("first event is not Started: {first:?}");
    };
    let mut seen = Vec::new();
    let reply = loop {
        match within(10, stream.next()).await.unwrap() {
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

#[tokio::test]
async fn output_past_one_mib_is_truncated_and_the_child_is_not_blocked() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let started = Instant::now();
    let reply = within(
        30,
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
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn exactly_one_mib_is_not_truncated() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let reply = within(30, client.exec(exec_sh("head -c 1048576 /dev/zero")))
        .await
        .unwrap();
    assert_eq!(reply.stdout.len(), MIB);
    assert!(!reply.stdout_truncated);
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group_including_grandchildren() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let request = ExecRequest {
        timeout_ms: Some(1000),
        ..exec_sh("sleep 1000 & echo $!; sleep 1000")
    };
    let started = Instant::now();
    let reply = within(15, client.exec(request)).await.unwrap();
    let elapsed = started.elapsed();
    assert!(reply.timed_out, "{reply:?}");
    assert!(
        elapsed < Duration::from_secs(1 + 5),
        "reply took {elapsed:?}, more than the deadline plus 5 s"
    );
    let grandchild: i32 = String::from_utf8(reply.stdout)
        .unwrap()
        .trim()
        .parse()
        .expect("the shell printed the grandchild's pid first");
    // The grandchild was in the group; once killed it is reaped (the agent is a
    // subreaper), so `kill -0` fails. Poll briefly for the reaping.
    sandbox_tests::wait_until_gone(
        &client,
        grandchild.into(),
        "(the grandchild) still alive after the timeout",
    )
    .await;
}

#[tokio::test]
async fn exit_code_and_signal_are_separate_fields() {
    let agent = TestAgent::start();
    let client = agent.client().await;
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

#[tokio::test]
async fn stdin_bytes_reach_the_child_even_past_a_pipe_buffer() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let small = ExecRequest {
        stdin: b"hello\0world\n".to_vec(),
        ..exec_sh("cat")
    };
    let reply = within(10, client.exec(small)).await.unwrap();
    assert_eq!(reply.stdout, b"hello\0world\n");

    // Larger than a pipe buffer, so the agent must write while it reads.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let request = ExecRequest {
        stdin: big.clone(),
        ..exec_sh("cat")
    };
    let reply = within(20, client.exec(request)).await.unwrap();
    assert_eq!(reply.stdout, big);

    let none = within(10, client.exec(exec_sh("wc -c"))).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&none.stdout).trim(), "0");
}

#[tokio::test]
async fn env_and_cwd_apply_on_a_clean_environment() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let spec = ProcessSpec {
        env: vec![
            ("FOO".into(), "first".into()),
            ("FOO".into(), "bar baz".into()),
        ],
        cwd: Some("/tmp".into()),
        ..shell("echo \"$FOO\"; pwd; env")
    };
    let reply = client
        .exec(ExecRequest {
            spec,
            stdin: vec![],
            timeout_ms: None,
            stream: false,
        })
        .await
        .unwrap();
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
    assert!(
        !env.iter().any(|l| l.starts_with(CANARY_ENV)),
        "the agent's own environment leaked into the child: {env:?}"
    );
}

#[tokio::test]
async fn a_missing_cwd_or_program_is_an_error_not_a_hang() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let spec = ProcessSpec {
        cwd: Some("/nonexistent/dir".into()),
        ..shell("true")
    };
    let request = ExecRequest {
        spec,
        stdin: vec![],
        timeout_ms: None,
        stream: false,
    };
    let err = within(10, client.exec(request)).await.unwrap_err();
    // The agent checks the cwd up front and calls a bad one a bad request.
    assert!(
        matches!(
            err.wire_kind(),
            Some(ErrorKind::BadRequest | ErrorKind::NotFound)
        ),
        "{err}"
    );

    let missing = ExecRequest {
        spec: ProcessSpec::new(Command::Argv(vec!["/no/such/program".into()])),
        stdin: vec![],
        timeout_ms: None,
        stream: false,
    };
    let err = within(10, client.exec(missing)).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

#[tokio::test]
async fn user_switch_runs_as_that_user_or_is_refused() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let request = |user| ExecRequest {
        spec: ProcessSpec {
            user: Some(user),
            ..shell("id -u")
        },
        stdin: vec![],
        timeout_ms: None,
        stream: false,
    };
    let by_name = client.exec(request(User::Name("nobody".into()))).await;
    let by_uid = client.exec(request(User::Uid(65534))).await;
    if nix::unistd::geteuid().is_root() {
        for reply in [by_name, by_uid] {
            let reply = reply.unwrap();
            assert_eq!(String::from_utf8_lossy(&reply.stdout).trim(), "65534");
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

#[tokio::test]
async fn dropping_a_streamed_exec_cancels_it_and_kills_the_group() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 1000")
        })
        .unwrap();
    let ExecEvent::Started(pid) = within(10, stream.next()).await.unwrap() else {
        panic!("no Started event");
    };
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let entry = sandbox_tests::ps_entry(&client, pid).await;
        match entry.map(|e| e.state) {
            Some(sandbox_protocol::ProcessState::Running) => {}
            _ => break,
        }
        assert!(
            Instant::now() < deadline,
            "exec {pid} still running after its stream was dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn explicit_cancel_gets_a_final_frame() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 1000")
        })
        .unwrap();
    assert!(matches!(
        within(10, stream.next()).await.unwrap(),
        ExecEvent::Started(_)
    ));
    within(10, stream.cancel()).await.unwrap();
    // The connection is still good for other work.
    let reply = client.exec(exec_sh("echo ok")).await.unwrap();
    assert_eq!(reply.stdout, b"ok\n");
}
