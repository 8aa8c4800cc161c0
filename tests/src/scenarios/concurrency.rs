//! Many requests at once over one connection, and slow requests beside quick ones.

use sandbox_protocol::{ExecRequest, Request};

use crate::transport::Target;
use crate::{exec_sh, shell, within};

pub async fn two_hundred_concurrent_requests_on_one_connection_all_answer(target: Target) {
    let client = target.client();
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
    within(240, async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
}

/// How long one quick exec may take while slow requests are open (a guest under TCG
/// on a loaded host forks slowly; a blocked connection would take the full 3 s).
const QUICK_SECS: u64 = 2;

pub async fn a_long_exec_and_a_follow_do_not_block_other_requests(target: Target) {
    let client = target.client();
    // Their length is the test: they are still running while the quick ones go by.
    let slow = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 3")
        })
        .unwrap();
    let spawned = client.spawn(shell("sleep 3")).await.unwrap();
    let follow = client.logs_follow(spawned, Some(0)).unwrap();
    for i in 0..20 {
        let reply = within(QUICK_SECS, client.exec(exec_sh(&format!("echo {i}"))))
            .await
            .unwrap();
        assert_eq!(reply.stdout, format!("{i}\n").as_bytes());
    }
    within(QUICK_SECS, client.request(Request::Info))
        .await
        .unwrap();
    drop(slow);
    drop(follow);
    client.kill(spawned, libc::SIGKILL).await.unwrap();
}
