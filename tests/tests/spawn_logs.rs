//! spawn and logs: detached processes, cursors, follow streams, ring wrap-around.

use std::time::Duration;

use sandbox_protocol::limits::RING_BYTES;
use sandbox_protocol::{ErrorKind, Pid, ProcessKind, ProcessState, Stream};
use sandbox_tests::{follow_to_end, ps_entry, shell, wait_exit, within, TestAgent};

/// `1\n2\n…n\n`
fn numbers(n: u32) -> Vec<u8> {
    (1..=n)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

/// A shell loop printing 1..=n one line per write, so output arrives in many chunks.
fn count_to(n: u32) -> String {
    format!("i=1; while [ $i -le {n} ]; do echo $i; i=$((i+1)); done")
}

#[tokio::test]
async fn spawn_returns_at_once_and_is_listed() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = within(5, client.spawn(shell("sleep 1000"))).await.unwrap();
    let entry = ps_entry(&client, pid).await.expect("spawned pid not in ps");
    assert_eq!(entry.kind, ProcessKind::Spawn);
    assert_eq!(entry.state, ProcessState::Running);
    assert_eq!(entry.argv, ["/bin/sh", "-c", "sleep 1000"]);
    assert!(entry.started_at_ms > 0);
    assert_eq!(entry.ended_at_ms, None);
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

#[tokio::test]
async fn spawn_survives_the_client_disconnecting() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client
        .spawn(shell("sleep 0.5; echo out; echo err >&2"))
        .await
        .unwrap();
    drop(client);
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let client = agent.client().await;
    let reply = client.logs(pid, None).await.unwrap();
    let status = reply.exit.expect("process should have exited");
    assert_eq!(status.code, Some(0));
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for chunk in &reply.batch.chunks {
        match chunk.stream {
            Stream::Stdout => stdout.extend_from_slice(&chunk.data),
            Stream::Stderr => stderr.extend_from_slice(&chunk.data),
            Stream::Pty => panic!("pty chunk from a spawn"),
        }
    }
    assert_eq!(stdout, b"out\n");
    assert_eq!(stderr, b"err\n");
    assert_eq!(reply.batch.dropped, 0);
    assert_eq!(reply.batch.end, 8);
}

#[tokio::test]
async fn logs_keep_the_order_of_chunks_across_streams() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client
        .spawn(shell(
            "echo 1; sleep 0.1; echo 2 >&2; sleep 0.1; echo 3; sleep 0.1; echo 4 >&2",
        ))
        .await
        .unwrap();
    wait_exit(&client, pid).await;
    let reply = client.logs(pid, Some(0)).await.unwrap();
    let tagged: Vec<(Stream, String)> = reply
        .batch
        .chunks
        .iter()
        .map(|c| (c.stream, String::from_utf8_lossy(&c.data).into_owned()))
        .collect();
    assert_eq!(
        tagged,
        [
            (Stream::Stdout, "1\n".to_owned()),
            (Stream::Stderr, "2\n".to_owned()),
            (Stream::Stdout, "3\n".to_owned()),
            (Stream::Stderr, "4\n".to_owned()),
        ]
    );
}

#[tokio::test]
async fn follow_from_zero_loses_nothing_and_duplicates_nothing() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client.spawn(shell(&count_to(20000))).await.unwrap();
    let followed = within(60, follow_to_end(&client, pid, 0)).await;
    let expected = numbers(20000);
    assert!(
        expected.len() < RING_BYTES,
        "the test must not wrap the ring"
    );
    assert_eq!(followed.dropped, 0);
    assert_eq!(followed.data.len(), expected.len());
    assert!(followed.data == expected, "followed output differs");
    assert_eq!(followed.end, expected.len() as u64);
    assert_eq!(followed.exit.unwrap().code, Some(0));
}

#[tokio::test]
async fn cursors_resume_exactly_where_they_point() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client.spawn(shell("seq 1 5000")).await.unwrap();
    wait_exit(&client, pid).await;
    let expected = numbers(5000);
    let total = expected.len() as u64;

    let all = client.logs(pid, Some(0)).await.unwrap();
    assert_eq!(all.batch.end, total);
    let data: Vec<u8> = all
        .batch
        .chunks
        .iter()
        .flat_map(|c| c.data.clone())
        .collect();
    assert_eq!(data, expected);

    for cursor in [1u64, 100, 12345, total - 1, total] {
        let reply = client.logs(pid, Some(cursor)).await.unwrap();
        let data: Vec<u8> = reply
            .batch
            .chunks
            .iter()
            .flat_map(|c| c.data.clone())
            .collect();
        let from = usize::try_from(cursor).unwrap();
        assert_eq!(data, &expected[from..], "from cursor {cursor}");
        assert_eq!(reply.batch.dropped, 0);
        assert_eq!(reply.batch.end, total);
        if let Some(first) = reply.batch.chunks.first() {
            assert_eq!(first.offset, cursor);
        }
    }

    // Following from the middle of an exited process replays the rest and ends.
    let followed = within(10, follow_to_end(&client, pid, 100)).await;
    assert_eq!(followed.data, &expected[100..]);
    assert_eq!(followed.exit.unwrap().code, Some(0));
}

#[tokio::test]
async fn ring_wrap_reports_exactly_what_was_dropped() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let total: u64 = 600_000;
    let pid = client
        .spawn(shell(&format!("head -c {total} /dev/zero | tr '\\0' x")))
        .await
        .unwrap();
    wait_exit(&client, pid).await;

    let reply = client.logs(pid, Some(0)).await.unwrap();
    let held: u64 = reply.batch.chunks.iter().map(|c| c.data.len() as u64).sum();
    assert!(
        reply.batch.dropped > 0,
        "600 KB must overflow a 256 KiB ring"
    );
    assert_eq!(reply.batch.dropped + held, reply.batch.end);
    assert_eq!(reply.batch.end, total);
    assert!(held <= RING_BYTES as u64);
    assert_eq!(reply.batch.chunks[0].offset, reply.batch.dropped);
    assert!(reply
        .batch
        .chunks
        .iter()
        .all(|c| c.data.iter().all(|&b| b == b'x')));

    // Without a cursor: the newest window; what was lost before it is reported.
    let newest = client.logs(pid, None).await.unwrap();
    let held_now: u64 = newest
        .batch
        .chunks
        .iter()
        .map(|c| c.data.len() as u64)
        .sum();
    assert_eq!(newest.batch.end, total);
    assert_eq!(newest.batch.chunks[0].offset + held_now, total);
    assert_eq!(newest.batch.dropped, newest.batch.chunks[0].offset);
}

#[tokio::test]
async fn follow_of_a_fast_writer_accounts_for_every_byte() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let total: u64 = 4 * 1024 * 1024;
    let pid = client
        .spawn(shell(&format!("head -c {total} /dev/zero | tr '\\0' y")))
        .await
        .unwrap();
    // follow_to_end asserts offsets are contiguous given the reported drops.
    let followed = within(60, follow_to_end(&client, pid, 0)).await;
    assert_eq!(followed.end, total);
    assert_eq!(followed.data.len() as u64 + followed.dropped, total);
    assert!(followed.data.iter().all(|&b| b == b'y'));
    assert_eq!(followed.exit.unwrap().code, Some(0));
}

#[tokio::test]
async fn two_followers_of_one_process_see_the_same_bytes() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = client.spawn(shell(&count_to(3000))).await.unwrap();
    let other = client.clone();
    let (a, b) = tokio::join!(
        within(60, follow_to_end(&client, pid, 0)),
        within(60, follow_to_end(&other, pid, 0))
    );
    assert_eq!(a.data, numbers(3000));
    assert_eq!(b.data, a.data);
}

#[tokio::test]
async fn logs_of_an_unknown_pid_is_not_found() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let err = client.logs(Pid(999_999), None).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
    let mut follow = client.logs_follow(Pid(999_999), Some(0)).unwrap();
    let err = within(5, follow.next()).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

#[tokio::test]
async fn exec_output_is_also_kept_in_its_ring() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let reply = client
        .exec(sandbox_tests::exec_sh("echo kept"))
        .await
        .unwrap();
    let logs = client.logs(reply.pid, Some(0)).await.unwrap();
    let data: Vec<u8> = logs
        .batch
        .chunks
        .iter()
        .flat_map(|c| c.data.clone())
        .collect();
    assert_eq!(data, b"kept\n");
    let entry = ps_entry(&client, reply.pid)
        .await
        .expect("exec not tracked");
    assert_eq!(entry.kind, ProcessKind::Exec);
}
