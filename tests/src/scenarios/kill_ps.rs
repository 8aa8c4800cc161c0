//! kill and ps: signal semantics, process groups, what `ps` lists.

use std::time::{Duration, Instant};

use sandbox_protocol::{ErrorKind, ExecRequest, Pid, ProcessKind, ProcessState};
use sandbox_vmm::client::ExecEvent;

use crate::transport::Target;
use crate::{argv, eventually, exec_sh, ps_entry, sh, shell, wait_exit, wait_until_gone, within};

pub async fn sigterm_to_a_running_spawn_ends_it_with_signal_15(target: Target) {
    let client = target.client();
    let pid = client.spawn(shell("sleep 1000")).await.unwrap();
    client.kill(pid, 15).await.unwrap();
    let status = wait_exit(client, pid).await;
    assert_eq!((status.code, status.signal), (None, Some(15)));
    let entry = ps_entry(client, pid)
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

pub async fn the_wire_refuses_signal_zero_and_sigkill_ends_a_term_ignorer(target: Target) {
    let client = target.client();
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
        ps_entry(client, pid).await.map(|info| info.state),
        Some(ProcessState::Running)
    ));
    client.kill(pid, libc::SIGKILL).await.unwrap();
    let status = wait_exit(client, pid).await;
    assert_eq!(status.signal, Some(9));
}

pub async fn kill_of_an_exited_process_is_a_no_op_success(target: Target) {
    let client = target.client();
    let pid = client.spawn(shell("exit 4")).await.unwrap();
    let status = wait_exit(client, pid).await;
    assert_eq!(status.code, Some(4));
    client.kill(pid, 15).await.unwrap();
    client.kill(pid, libc::SIGKILL).await.unwrap();
    let entry = ps_entry(client, pid).await.unwrap();
    assert_eq!(
        entry.state,
        ProcessState::Exited(status),
        "status unchanged"
    );
}

pub async fn kill_of_an_unknown_or_untracked_pid_is_not_found(target: Target) {
    let client = target.client();
    // Processes that exist in the agent's machine but are not the agent's to signal:
    // the agent itself (the shell's parent; in a microVM that is PID 1) and init.
    let agent: i32 = sh(client, "echo $PPID").await.trim().parse().unwrap();
    if target.facts().is_pid1 {
        assert_eq!(agent, 1, "the agent is not PID 1");
    }
    for pid in [Pid(999_999), Pid(1), Pid(agent)] {
        let err = client.kill(pid, 15).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{pid}: {err}");
    }
}

pub async fn kill_signals_the_whole_process_group(target: Target) {
    let client = target.client();
    let pid = client
        .spawn(shell("sleep 1000 & echo $!; wait"))
        .await
        .unwrap();
    // Wait for the grandchild's pid to show up in the ring.
    let grandchild = eventually(Duration::from_secs(20), "the grandchild's pid", || async {
        let reply = client.logs(pid, Some(0)).await.unwrap();
        let text = String::from_utf8_lossy(&super::chunk_bytes(&reply.batch.chunks)).into_owned();
        text.trim().parse::<i32>().ok()
    })
    .await;
    client.kill(pid, 15).await.unwrap();
    wait_exit(client, pid).await;
    wait_until_gone(client, grandchild, "a kill of its group").await;
}

pub async fn ps_lists_a_running_exec_while_it_runs(target: Target) {
    let client = target.client();
    // The exec's length is the test: it must still run while `ps` is asked.
    let mut stream = client
        .exec_stream(ExecRequest {
            stream: true,
            ..exec_sh("sleep 2")
        })
        .unwrap();
    let ExecEvent::Started(pid) = within(20, stream.next()).await.unwrap() else {
        panic!("no Started event");
    };
    // A long exec does not block other requests on the same connection.
    let started = Instant::now();
    let entry = within(5, ps_entry(client, pid))
        .await
        .expect("exec not listed");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(entry.kind, ProcessKind::Exec);
    assert_eq!(entry.state, ProcessState::Running);
    loop {
        if let ExecEvent::Finished(reply) = within(20, stream.next()).await.unwrap() {
            assert_eq!(reply.exit.unwrap().code, Some(0));
            break;
        }
    }
}

pub async fn ps_lists_running_and_exited_spawns(target: Target) {
    let client = target.client();
    let sleeper = client.spawn(shell("sleep 1000")).await.unwrap();
    let quick = client.spawn(argv(&["echo", "quick"])).await.unwrap();
    assert_eq!(wait_exit(client, quick).await.code, Some(0));

    let listed = client.ps().await.unwrap();
    let entry = listed
        .iter()
        .find(|p| p.pid == sleeper)
        .expect("not listed");
    assert_eq!(
        (entry.kind, entry.state),
        (ProcessKind::Spawn, ProcessState::Running)
    );
    let entry = listed.iter().find(|p| p.pid == quick).expect("not listed");
    assert_eq!(entry.kind, ProcessKind::Spawn);
    assert_eq!(entry.argv, ["echo", "quick"]);
    assert!(matches!(entry.state, ProcessState::Exited(_)), "{entry:?}");
    client.kill(sleeper, libc::SIGKILL).await.unwrap();
    eventually(Duration::from_secs(20), "the sleeper to exit", || async {
        let state = ps_entry(client, sleeper).await.map(|e| e.state);
        matches!(state, Some(ProcessState::Exited(_))).then_some(())
    })
    .await;
}
