//! pty: input and output, resize with SIGWINCH, re-attach with replay.

// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sandbox_protocol::{Pid, ProcessKind, ProcessSpec, PtyOpenRequest, WindowSize};
use sandbox_tests::screen::Screen;
use sandbox_tests::{argv, ps_entry, shell, within, TestAgent};
use sandbox_vmm::client::Client;

async fn open(client: &Client, spec: ProcessSpec, rows: u16, cols: u16) -> Pid {
    within(
        10,
        client.pty_open(PtyOpenRequest {
            spec,
            size: WindowSize { rows, cols },
        }),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn input_reaches_the_shell_and_output_comes_back() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = open(&client, argv(&["sh"]), 24, 80).await;
    let screen = Screen::follow(&client, pid, 0);
    client
        .pty_input(pid, b"echo $((6*7))\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("42").await;
    let entry = ps_entry(&client, pid).await.expect("pty not in ps");
    assert_eq!(entry.kind, ProcessKind::Pty);
    client.pty_input(pid, b"exit 7\n".to_vec()).await.unwrap();
    let exit = within(10, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(7));
}

#[tokio::test]
async fn resize_changes_the_size_and_signals_the_child() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let pid = open(&client, argv(&["sh"]), 24, 80).await;
    let screen = Screen::follow(&client, pid, 0);
    client
        .pty_input(pid, b"stty size\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("24 80").await;
    client
        .pty_input(pid, b"trap 'echo GOT-WINCH' WINCH\n".to_vec())
        .await
        .unwrap();
    client
        .pty_input(pid, b"echo trap-set\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("\ntrap-set").await;
    client
        .pty_resize(
            pid,
            WindowSize {
                rows: 40,
                cols: 100,
            },
        )
        .await
        .unwrap();
    // The trap runs when the shell next reads a command.
    client
        .pty_input(pid, b"stty size\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("40 100").await;
    screen.wait_for("GOT-WINCH").await;
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

#[tokio::test]
async fn a_terminal_survives_disconnect_and_replays_on_reattach() {
    let agent = TestAgent::start();
    let pid = {
        let client = agent.client().await;
        let pid = open(&client, argv(&["sh"]), 24, 80).await;
        let screen = Screen::follow(&client, pid, 0);
        client
            .pty_input(pid, b"echo before-$((6*7))\n".to_vec())
            .await
            .unwrap();
        screen.wait_for("before-42").await;
        pid
    };
    // The first client is gone; a new one replays what the terminal printed.
    let client = agent.client().await;
    let replay = client.logs(pid, None).await.unwrap();
    let text: String = replay
        .batch
        .chunks
        .iter()
        .map(|c| String::from_utf8_lossy(&c.data).into_owned())
        .collect();
    assert!(
        text.contains("before-42"),
        "replay lacks old output: {text}"
    );
    assert_eq!(replay.exit, None, "the shell should still run");

    let screen = Screen::follow(&client, pid, 0);
    screen.wait_for("before-42").await;
    client
        .pty_input(pid, b"echo after-$((6*7)); exit 5\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("after-42").await;
    let exit = within(10, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(5));
}

#[tokio::test]
async fn a_pty_command_with_env_and_cwd_runs_on_a_terminal() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let spec = ProcessSpec {
        env: vec![("GREETING".into(), "hi-there".into())],
        cwd: Some("/tmp".into()),
        ..shell("echo $GREETING; pwd; test -t 0 && echo is-a-tty")
    };
    let pid = open(&client, spec, 10, 50).await;
    let screen = Screen::follow(&client, pid, 0);
    let exit = within(10, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(0));
    let text = String::from_utf8_lossy(&screen.text.lock().unwrap()).into_owned();
    assert!(text.contains("hi-there"), "{text}");
    assert!(text.contains("/tmp"), "{text}");
    assert!(text.contains("is-a-tty"), "{text}");
}

#[tokio::test]
async fn input_to_an_unknown_terminal_is_not_found() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let err = client
        .pty_input(Pid(999_999), b"x".to_vec())
        .await
        .unwrap_err();
    assert_eq!(
        err.wire_kind(),
        Some(sandbox_protocol::ErrorKind::NotFound),
        "{err}"
    );
}

/// Regression: input requests in flight at once used to be written by separate
/// tasks, so their bytes could interleave on the terminal.
#[tokio::test]
async fn pipelined_input_reaches_the_terminal_in_order() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    // Raw mode and no echo: the terminal's output is exactly what cat read.
    let pid = open(&client, shell("stty raw -echo; echo READY; cat"), 24, 80).await;
    let screen = Screen::follow(&client, pid, 0);
    screen.wait_for("READY").await;
    // 4 KiB per request, 160 KiB in all: the terminal's buffer fills, so requests
    // need several writes each and have to wait for one another.
    let chunks: Vec<String> = (0..40)
        .map(|i| format!("<{i:02}{}>", "x".repeat(4090)))
        .collect();
    let sends: Vec<_> = chunks
        .iter()
        .map(|chunk| {
            let client = client.clone();
            let data = chunk.clone().into_bytes();
            tokio::spawn(async move { client.pty_input(pid, data).await })
        })
        .collect();
    for send in sends {
        send.await.unwrap().unwrap();
    }
    screen.wait_for("<39").await;
    let expected = chunks.concat();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while !screen.contents().contains(&expected) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "input arrived out of order or torn");
    client.kill(pid, libc::SIGKILL).await.unwrap();
}
