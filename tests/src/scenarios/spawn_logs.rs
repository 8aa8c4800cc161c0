//! spawn and logs: detached processes, cursors, follow streams, ring wrap-around.

use sandbox_protocol::limits::RING_BYTES;
use sandbox_protocol::{ErrorKind, Pid, ProcessKind, ProcessState, Stream};

use super::chunk_bytes;
use crate::transport::Target;
use crate::{exec_sh, follow_to_end, ps_entry, shell, wait_exit, within};

/// `from\n…to\n`
fn numbers(from: u32, to: u32) -> Vec<u8> {
    (from..=to)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

/// A shell loop printing 1..=n one line per write, so output arrives in many chunks.
fn count_to(n: u32) -> String {
    format!("i=1; while [ $i -le {n} ]; do echo $i; i=$((i+1)); done")
}

pub async fn spawn_returns_at_once_and_is_listed(target: Target) {
    let client = target.client();
    let pid = within(20, client.spawn(shell("sleep 1000"))).await.unwrap();
    let entry = ps_entry(client, pid).await.expect("spawned pid not in ps");
    assert_eq!(entry.kind, ProcessKind::Spawn);
    assert_eq!(entry.state, ProcessState::Running);
    assert_eq!(entry.argv, ["/bin/sh", "-c", "sleep 1000"]);
    assert!(entry.started_at_ms > 0);
    assert_eq!(entry.ended_at_ms, None);
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

pub async fn spawn_survives_the_client_disconnecting(target: Target) {
    let client = target.connect().await;
    // The pause is the test: the process is still running when its client goes.
    let pid = client
        .spawn(shell("sleep 0.5; echo out; echo err >&2"))
        .await
        .unwrap();
    drop(client);

    let client = target.connect().await;
    assert_eq!(wait_exit(&client, pid).await.code, Some(0));
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

pub async fn logs_keep_the_order_of_chunks_across_streams(target: Target) {
    let client = target.client();
    // The pauses are the test: they make each write a chunk of its own.
    let pid = client
        .spawn(shell(
            "echo 1; sleep 0.1; echo 2 >&2; sleep 0.1; echo 3; sleep 0.1; echo 4 >&2",
        ))
        .await
        .unwrap();
    wait_exit(client, pid).await;
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

pub async fn follow_from_zero_loses_nothing_and_duplicates_nothing(target: Target) {
    let client = target.client();
    let pid = client.spawn(shell(&count_to(20000))).await.unwrap();
    let followed = within(120, follow_to_end(client, pid, 0)).await;
    let expected = numbers(1, 20000);
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

pub async fn follow_of_bursts_then_a_replay_from_the_middle(target: Target) {
    let client = target.client();
    // The pauses are the test: the follower catches up between bursts.
    let script = "for i in 0 1 2 3 4; do seq $((i*2000+1)) $((i*2000+2000)); sleep 0.2; done";
    let pid = client.spawn(shell(script)).await.unwrap();
    let followed = within(60, follow_to_end(client, pid, 0)).await;
    let expected = numbers(1, 10000);
    assert_eq!(followed.dropped, 0);
    assert_eq!(followed.data.len(), expected.len());
    assert!(followed.data == expected, "followed output differs");
    assert_eq!(followed.end, expected.len() as u64);
    assert_eq!(followed.exit.unwrap().code, Some(0));
    // A replay from the middle starts exactly there.
    let reply = client.logs(pid, Some(12345)).await.unwrap();
    assert_eq!(reply.batch.chunks[0].offset, 12345);
    assert!(chunk_bytes(&reply.batch.chunks) == expected[12345..]);
}

pub async fn cursors_resume_exactly_where_they_point(target: Target) {
    let client = target.client();
    let pid = client.spawn(shell("seq 1 5000")).await.unwrap();
    wait_exit(client, pid).await;
    let expected = numbers(1, 5000);
    let total = expected.len() as u64;

    let all = client.logs(pid, Some(0)).await.unwrap();
    assert_eq!(all.batch.end, total);
    assert_eq!(chunk_bytes(&all.batch.chunks), expected);

    for cursor in [1u64, 100, 12345, total - 1, total] {
        let reply = client.logs(pid, Some(cursor)).await.unwrap();
        let from = usize::try_from(cursor).unwrap();
        assert_eq!(
            chunk_bytes(&reply.batch.chunks),
            &expected[from..],
            "from cursor {cursor}"
        );
        assert_eq!(reply.batch.dropped, 0);
        assert_eq!(reply.batch.end, total);
        if let Some(first) = reply.batch.chunks.first() {
            assert_eq!(first.offset, cursor);
        }
    }

    // Following from the middle of an exited process replays the rest and ends.
    let followed = within(20, follow_to_end(client, pid, 100)).await;
    assert_eq!(followed.data, &expected[100..]);
    assert_eq!(followed.exit.unwrap().code, Some(0));
}

pub async fn ring_wrap_reports_exactly_what_was_dropped(target: Target) {
    let client = target.client();
    let total: u64 = 600_000;
    let pid = client
        .spawn(shell(&format!("head -c {total} /dev/zero | tr '\\0' x")))
        .await
        .unwrap();
    // Followed while it writes: what the ring lost is counted, never hidden.
    let followed = within(60, follow_to_end(client, pid, 0)).await;
    assert_eq!(followed.dropped + followed.data.len() as u64, total);
    assert_eq!(followed.end, total);

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
        .all(|c| c.stream == Stream::Stdout && c.data.iter().all(|&b| b == b'x')));

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

pub async fn follow_of_a_fast_writer_accounts_for_every_byte(target: Target) {
    let client = target.client();
    let total: u64 = 4 * 1024 * 1024;
    let pid = client
        .spawn(shell(&format!("head -c {total} /dev/zero | tr '\\0' y")))
        .await
        .unwrap();
    // follow_to_end asserts offsets are contiguous given the reported drops.
    let followed = within(120, follow_to_end(client, pid, 0)).await;
    assert_eq!(followed.end, total);
    assert_eq!(followed.data.len() as u64 + followed.dropped, total);
    assert!(followed.data.iter().all(|&b| b == b'y'));
    assert_eq!(followed.exit.unwrap().code, Some(0));
}

pub async fn two_followers_of_one_process_see_the_same_bytes(target: Target) {
    let client = target.client();
    let pid = client.spawn(shell(&count_to(3000))).await.unwrap();
    let other = client.clone();
    let (a, b) = tokio::join!(
        within(60, follow_to_end(client, pid, 0)),
        within(60, follow_to_end(&other, pid, 0))
    );
    assert_eq!(a.data, numbers(1, 3000));
    assert_eq!(b.data, a.data);
}

pub async fn logs_of_an_unknown_pid_is_not_found(target: Target) {
    let client = target.client();
    let err = client.logs(Pid(999_999), None).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
    let mut follow = client.logs_follow(Pid(999_999), Some(0)).unwrap();
    let err = within(20, follow.next()).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

pub async fn exec_output_is_also_kept_in_its_ring(target: Target) {
    let client = target.client();
    let reply = client.exec(exec_sh("echo kept")).await.unwrap();
    let logs = client.logs(reply.pid, Some(0)).await.unwrap();
    assert_eq!(chunk_bytes(&logs.batch.chunks), b"kept\n");
    let entry = ps_entry(client, reply.pid).await.expect("exec not tracked");
    assert_eq!(entry.kind, ProcessKind::Exec);
}
