//! What needs an agent process of its own on a Unix socket, so it cannot run in the
//! shared `suite`: agent flags (`--forget-after-secs`, `--token`, `--image-config`),
//! a new token from `reidentify`, and losing the agent altogether.

// Tests fail by panicking, with the error in the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sandbox_protocol::{
    ClientMsg, ErrorKind, ExecRequest, Hello, LogsRequest, ProcessState, ReidentifyRequest,
    Request, RequestId,
};
use sandbox_tests::raw::RawConnection;
use sandbox_tests::{
    eventually, exec_sh, ps_entry, shell, wait_exit, within, AgentOptions, TestAgent,
};
use sandbox_vmm::client::{Client, ClientError, ConnectOptions, ExecEvent};

#[tokio::test]
async fn exited_processes_are_forgotten_after_the_configured_delay() {
    let agent = TestAgent::start_with(AgentOptions {
        forget_after_secs: Some(1),
        ..AgentOptions::default()
    });
    let client = agent.client().await;
    let pid = client.spawn(shell("echo bye")).await.unwrap();
    wait_exit(&client, pid).await;
    let exited_at = Instant::now();
    // Still known right after exit.
    assert!(client.logs(pid, None).await.is_ok());
    let what = format!("pid {pid} to be forgotten (--forget-after-secs 1)");
    eventually(Duration::from_secs(5), &what, || async {
        ps_entry(&client, pid).await.is_none().then_some(())
    })
    .await;
    assert!(
        exited_at.elapsed() >= Duration::from_millis(900),
        "forgotten before its second was up"
    );
    let err = client.logs(pid, None).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
    let err = client.kill(pid, 15).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

#[tokio::test]
async fn running_processes_are_never_forgotten() {
    let agent = TestAgent::start_with(AgentOptions {
        forget_after_secs: Some(1),
        ..AgentOptions::default()
    });
    let client = agent.client().await;
    let pid = client.spawn(shell("sleep 1000")).await.unwrap();
    // The wait is the test: more than twice the forget delay passes while it runs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let entry = ps_entry(&client, pid)
        .await
        .expect("running process forgotten");
    assert_eq!(entry.state, ProcessState::Running);
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

#[tokio::test]
async fn tokens_are_required_when_configured() {
    let mut agent = TestAgent::start_with(AgentOptions {
        token: Some("s3cret".into()),
        ..AgentOptions::default()
    });
    for token in [None, Some("wrong".to_owned())] {
        let mut raw = RawConnection::unix(agent.socket()).await;
        raw.send(0, ClientMsg::Hello(Hello::new(token.clone())))
            .await;
        let (id, error) = raw.expect_error().await;
        assert_eq!(id, RequestId(0));
        assert_eq!(error.kind, ErrorKind::Unauthorized, "{token:?}: {error}");
        assert!(raw.read().await.is_none(), "connection left open");
    }

    // The client maps the refusal to a typed error.
    let url = agent.url().parse().unwrap();
    let err = Client::connect(&url, &Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized(_)), "{err:?}");
    assert!(!err.is_retryable());

    // The right token works (the harness passes it).
    agent.assert_alive();
    let client = agent.client().await;
    within(10, client.ps()).await.unwrap();
}

#[tokio::test]
async fn reidentify_makes_new_connections_need_the_new_token_and_keeps_old_ones() {
    let mut agent = TestAgent::start_with(AgentOptions {
        token: Some("s3cret".into()),
        ..AgentOptions::default()
    });
    let before = agent.client().await;
    let other = agent.client().await;
    let pid = before.spawn(shell("sleep 1000")).await.unwrap();

    // What is refused changes nothing: an empty token, and (the agent is not init)
    // a hostname, even together with a good token.
    for (request, kind) in [
        (
            ReidentifyRequest {
                hostname: None,
                token: Some(String::new()),
            },
            ErrorKind::BadRequest,
        ),
        (
            ReidentifyRequest {
                hostname: Some("fork-1".into()),
                token: Some("fresh".into()),
            },
            ErrorKind::PermissionDenied,
        ),
    ] {
        let err = before.reidentify(request).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(kind), "{err}");
    }
    within(10, agent.client().await.ps()).await.unwrap();

    let token = ReidentifyRequest {
        hostname: None,
        token: Some("fresh".into()),
    };
    within(10, before.reidentify(token)).await.unwrap();

    // Connections authenticated under the old token stay served, the sender too.
    for client in [&before, &other] {
        let listed = within(10, client.ps()).await.unwrap();
        assert!(listed.iter().any(|info| info.pid == pid), "{listed:?}");
    }
    // A new connection needs the new token.
    let url = agent.url().parse().unwrap();
    for token in [None, Some("s3cret".to_owned())] {
        let options = ConnectOptions {
            token: token.clone(),
            ..ConnectOptions::default()
        };
        let err = Client::connect(&url, &options).await.unwrap_err();
        assert!(
            matches!(err, ClientError::Unauthorized(_)),
            "{token:?}: {err:?}"
        );
    }
    agent.token_replaced("fresh");
    let after = agent.client().await;
    let listed = within(10, after.ps()).await.unwrap();
    assert!(listed.iter().any(|info| info.pid == pid), "{listed:?}");
    after.kill(pid, libc::SIGKILL).await.unwrap();
    agent.assert_alive();
}

#[tokio::test]
async fn losing_the_agent_fails_pending_requests_with_a_clear_error() {
    let mut agent = TestAgent::start();
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
    let pending = {
        let client = client.clone();
        let follow = Request::Logs(LogsRequest {
            pid,
            cursor: Some(0),
            follow: true,
        });
        tokio::spawn(async move { client.request(follow).await })
    };
    // On this one-thread runtime, yielding runs the task until it has queued its
    // request; a later round trip on the same connection then proves the agent has
    // it (instead of a fixed sleep).
    tokio::task::yield_now().await;
    within(10, client.ps()).await.unwrap();
    agent.kill_agent();
    // The agent cannot clean up after a SIGKILL; its child would outlive the test.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid.0),
        nix::sys::signal::Signal::SIGKILL,
    );
    let err = within(10, stream.next()).await.unwrap_err();
    assert!(
        matches!(err, ClientError::ConnectionLost { .. }),
        "streaming request: {err:?}"
    );
    let err = within(10, pending).await.unwrap().unwrap_err();
    assert!(
        matches!(err, ClientError::ConnectionLost { .. }),
        "unary request: {err:?}"
    );
    // And new requests fail at once instead of hanging.
    let err = within(5, client.ps()).await.unwrap_err();
    assert!(matches!(err, ClientError::ConnectionLost { .. }), "{err:?}");
    assert!(client.closed_reason().is_some());
}

/// The template's defaults (`--image-config`, the file the builder writes into an
/// image) apply to what a request leaves out, and the request wins where it says.
#[tokio::test]
async fn image_config_defaults_apply_to_execs_spawns_and_terminals_and_requests_override_them() {
    let scratch = sandbox_tests::TempDir::new("image-config");
    let workdir = scratch.path().join("work dir");
    std::fs::create_dir(&workdir).unwrap();
    // Reachable by the image's user below, which is not the test's.
    for dir in [scratch.path(), workdir.as_path()] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    // As root the agent can switch users: the image names `nobody`'s uid with a group
    // of its own. Unprivileged it cannot, so the image names no one.
    let root = nix::unistd::Uid::effective().is_root();
    let config = serde_json::json!({
        "env": [["IMAGE_VAR", "from the image"], ["BOTH", "image"], ["PATH", "/image/bin:/usr/bin:/bin"]],
        "cwd": workdir,
        "user": root.then_some("65534:4242"),
    });
    let path = scratch.path().join("image.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let agent = TestAgent::start_with(AgentOptions {
        image_config: Some(path),
        ..AgentOptions::default()
    });
    let client = agent.client().await;
    let probe = r#"echo "$IMAGE_VAR|$BOTH|$PATH|$(pwd)|$(id -u):$(id -g)""#;
    let me = format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid());
    let image_user = if root { "65534:4242" } else { me.as_str() };
    let expected = format!(
        "from the image|image|/image/bin:/usr/bin:/bin|{}|{image_user}\n",
        workdir.display()
    );
    let reply = within(20, client.exec(exec_sh(probe))).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reply.stdout),
        expected,
        "exec; stderr: {}",
        String::from_utf8_lossy(&reply.stderr)
    );
    // A spawn's and a terminal's output, from their rings once they exited.
    let output_of = |pid| {
        let client = client.clone();
        async move {
            wait_exit(&client, pid).await;
            let logs = client.logs(pid, None).await.unwrap();
            let bytes: Vec<u8> = logs
                .batch
                .chunks
                .iter()
                .flat_map(|c| c.data.clone())
                .collect();
            String::from_utf8_lossy(&bytes).replace("\r\n", "\n")
        }
    };
    let pid = client.spawn(shell(probe)).await.unwrap();
    assert_eq!(output_of(pid).await, expected, "spawn");
    let pid = client
        .pty_open(sandbox_protocol::PtyOpenRequest {
            spec: shell(probe),
            size: sandbox_protocol::WindowSize {
                rows: 24,
                cols: 200,
            },
        })
        .await
        .unwrap();
    assert_eq!(output_of(pid).await, expected, "pty");

    // The request's variables, directory and user win.
    let mut request = exec_sh(probe);
    request.spec.env = vec![("BOTH".into(), "request".into())];
    request.spec.cwd = Some("/".into());
    if root {
        request.spec.user = Some(sandbox_protocol::User::Uid(0));
    }
    let reply = within(20, client.exec(request)).await.unwrap();
    let own_user = if root { "0:0" } else { me.as_str() };
    assert_eq!(
        String::from_utf8_lossy(&reply.stdout),
        format!("from the image|request|/image/bin:/usr/bin:/bin|/|{own_user}\n"),
        "overridden; stderr: {}",
        String::from_utf8_lossy(&reply.stderr)
    );
}

/// Regression (issue 22, item 14): without cgroups (the agent as an ordinary
/// process) a finished exec's leftovers were never killed: `sh --timeout 2 'sleep
/// 1004 &'` returned 0, `ps` showed a plain `exited 0`, and the sleep outlived the
/// deadline. Its process group now stands in for the cgroup: shown as `exited+1`,
/// killed at the deadline.
#[tokio::test]
async fn an_unconfined_execs_leftovers_are_listed_and_killed_at_its_deadline() {
    let agent = TestAgent::start_with(AgentOptions::default());
    let client = agent.client().await;
    let mut request = exec_sh("sleep 1004 & echo $!");
    request.timeout_ms = Some(2000);
    let reply = within(30, client.exec(request)).await.unwrap();
    let sleep: u32 = String::from_utf8_lossy(&reply.stdout)
        .trim()
        .parse()
        .unwrap();
    let details = client.ps_detail().await.unwrap().expect("ps_detail");
    let row = details
        .iter()
        .find(|d| d.info.pid == reply.pid)
        .expect("the exec is listed");
    assert!(
        matches!(row.info.state, ProcessState::Exited(_)) && row.live_pids == 1,
        "{row:?}"
    );
    let what = format!("the leftover sleep {sleep} to be killed at the exec's deadline");
    eventually(Duration::from_secs(20), &what, || async {
        let stat = std::fs::read_to_string(format!("/proc/{sleep}/stat")).unwrap_or_default();
        let gone = stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'));
        gone.then_some(())
    })
    .await;
}
