//! kill and ps: signal semantics, process groups, forgetting exited processes.

use std::time::{Duration, Instant};

use sandbox_protocol::{ErrorKind, ExecRequest, Pid, ProcessKind, ProcessState};
use sandbox_tests::{exec_sh, ps_entry, shell, wait_exit, within, AgentOptions, TestAgent};
use sandbox_vmm::client::ExecEvent;

#[tokio::test]
async fn sigterm_to_a_running_spawn_ends_it_with_signal_15() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client.spawn(shell("sleep 1000")).await.unwrap();
    client.kill(pid, 15).await.unwrap();
    let status = wait_exit(&client, pid).await;
    assert_eq!((status.code, status.signal), (None, Some(15)));
    let entry = ps_entry(&client, pid)
        .await
        .expect("exited process still listed");
    assert_eq!(
        entry.state,
        ProcessState::Exited(status),
        "ps agrees with logs"
    );
    assert!(entry
        .ended_at_ms
        .is_some_and(|end| end >= entry.started_at_ms));
}

#[tokio::test]
async fn the_wire_refuses_signal_zero_and_sigkill_ends_a_term_ignorer() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client
        .spawn(shell("trap '' TERM; sleep 1000"))
        .await
        .unwrap();
    // The wire carries an explicit signal: 0 (a liveness probe in kill(2)) and numbers
    // past SIGRTMAX are bad requests, and the process is untouched.
    for bad in [0, -1, sandbox_protocol::MAX_SIGNAL + 1] {
        let err = client.kill(pid, bad).await.unwrap_err();
        assert_eq!(
            err.wire_kind(),
            Some(ErrorKind::BadRequest),
            "signal {bad}: {err}"
        );
    }
    assert!(matches!(
        ps_entry(&client, pid).await.map(|info| info.state),
        Some(ProcessState::Running)
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.kill(pid, libc::SIGKILL).await.unwrap();
    let status = wait_exit(&client, pid).await;
    assert_eq!(status.signal, Some(9));
}

#[tokio::test]
async fn kill_of_an_exited_process_is_a_no_op_success() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client.spawn(shell("exit 4")).await.unwrap();
    let status = wait_exit(&client, pid).await;
    assert_eq!(status.code, Some(4));
    client.kill(pid, 15).await.unwrap();
    client.kill(pid, libc::SIGKILL).await.unwrap();
    let entry = ps_entry(&client, pid).await.unwrap();
    assert_eq!(
        entry.state,
        ProcessState::Exited(status),
        "status unchanged"
    );
}

#[tokio::test]
async fn kill_of_an_unknown_pid_is_not_found() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    // Our own pid exists on this machine but is not tracked by the agent.
    let untracked = Pid(i32::try_from(std::process::id()).unwrap());
    for pid in [Pid(999_999), untracked] {
        let err = client.kill(pid, 15).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{pid}: {err}");
    }
}

#[tokio::test]
async fn kill_signals_the_whole_process_group() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client
        .spawn(shell("sleep 1000 & echo $!; wait"))
        .await
        .unwrap();
    // Wait for the grandchild's pid to show up in the ring.
    let grandchild = within(10, async {
        loop {
            let reply = client.logs(pid, Some(0)).await.unwrap();
            let text: String = reply
                .batch
                .chunks
                .iter()
                .map(|c| String::from_utf8_lossy(&c.data).into_owned())
                .collect();
            if let Ok(pid) = text.trim().parse::<i32>() {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    client.kill(pid, 15).await.unwrap();
    wait_exit(&client, pid).await;
    sandbox_tests::wait_until_gone(
        &client,
        grandchild.into(),
        "(the grandchild) survived a kill of its group",
    )
    .await;
}

#[tokio::test]
async fn ps_lists_a_running_exec_while_it_runs() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 2")
        })
        .unwrap();
    let ExecEvent::Started(pid) = within(10, stream.next()).await.unwrap() else {
        panic!("no Started event");
    };
    // A long exec does not block other requests on the same connection.
    let started = Instant::now();
    let entry = within(5, ps_entry(&client, pid))
        .await
        .expect("exec not listed");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(entry.kind, ProcessKind::Exec);
    assert_eq!(entry.state, ProcessState::Running);
    loop {
        if let ExecEvent::Finished(reply) = within(10, stream.next()).await.unwrap() {
            assert_eq!(reply.exit.unwrap().code, Some(0));
            break;
        }
    }
}

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
    let deadline = exited_at + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if ps_entry(&client, pid).await.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} still listed 5 s after exit with --forget-after-secs 1"
        );
    }
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
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let entry = ps_entry(&client, pid)
        .await
        .expect("running process forgotten");
    assert_eq!(entry.state, ProcessState::Running);
    client.kill(pid, libc::SIGKILL).await.unwrap();
}
