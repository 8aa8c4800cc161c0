//! Many requests at once over one connection; connection loss.

use std::time::Duration;

use sandbox_protocol::{ExecRequest, LogsRequest, Request};
use sandbox_tests::{exec_sh, within, TestAgent};
use sandbox_vmm::client::{ClientError, ExecEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_on_one_connection_all_answer_correctly() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            if i % 5 == 0 {
                let list = client.ps().await.unwrap();
                // ps works mid-flight; the list is consistent with itself.
                assert!(list.iter().all(|p| p.pid.0 > 0));
            } else {
                let reply = client.exec(exec_sh(&format!("echo {i}"))).await.unwrap();
                assert_eq!(reply.stdout, format!("{i}\n").as_bytes(), "request {i}");
                assert_eq!(reply.exit.unwrap().code, Some(0));
            }
        }));
    }
    within(120, async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn a_long_exec_and_a_follow_do_not_block_other_requests() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let slow = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 3")
        })
        .unwrap();
    let spawned = client.spawn(sandbox_tests::shell("sleep 3")).await.unwrap();
    let follow = client.logs_follow(spawned, Some(0)).unwrap();
    for i in 0..20 {
        let reply = within(2, client.exec(exec_sh(&format!("echo {i}"))))
            .await
            .unwrap();
        assert_eq!(reply.stdout, format!("{i}\n").as_bytes());
    }
    within(2, client.request(Request::Info)).await.unwrap();
    drop(slow);
    drop(follow);
    client.kill(spawned, libc::SIGKILL).await.unwrap();
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
    tokio::time::sleep(Duration::from_millis(200)).await;
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
