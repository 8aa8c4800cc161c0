//! pty: input and output, resize with SIGWINCH, re-attach with replay, ordering of
//! pipelined input.
//!
//! The shell is sent arithmetic (`$((6*7))`) and the screen awaited for the result:
//! the terminal's echo of the typed line cannot match it, and nothing is assumed
//! about where the prompt lands (typed-ahead input may be echoed before it).

use std::time::Duration;

use sandbox_protocol::{
    ErrorKind, Pid, ProcessKind, ProcessSpec, PtyInputRequest, PtyOpenRequest, Request, WindowSize,
};
use sandbox_vmm::client::Client;

use super::chunk_bytes;
use crate::screen::Screen;
use crate::transport::Target;
use crate::{argv, ps_entry, shell, within};

async fn open(client: &Client, spec: ProcessSpec, rows: u16, cols: u16) -> Pid {
    within(
        20,
        client.pty_open(PtyOpenRequest {
            spec,
            size: WindowSize { rows, cols },
        }),
    )
    .await
    .unwrap()
}

async fn input(client: &Client, pid: Pid, text: &str) {
    client
        .pty_input(pid, text.as_bytes().to_vec())
        .await
        .unwrap();
}

pub async fn input_reaches_the_shell_and_output_comes_back(target: Target) {
    let client = target.client();
    let pid = open(client, argv(&["sh"]), 24, 80).await;
    let screen = Screen::follow(client, pid, 0);
    input(client, pid, "echo $((6*7))\n").await;
    screen.wait_for("42").await;
    let entry = ps_entry(client, pid).await.expect("pty not in ps");
    assert_eq!(entry.kind, ProcessKind::Pty);
    input(client, pid, "exit 7\n").await;
    let exit = within(20, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(7));
}

pub async fn resize_changes_the_size_and_signals_the_child(target: Target) {
    let client = target.client();
    let pid = open(client, argv(&["sh"]), 24, 80).await;
    let screen = Screen::follow(client, pid, 0);
    input(client, pid, "stty size\n").await;
    screen.wait_for("24 80").await;
    input(client, pid, "trap 'echo GOT-WINCH' WINCH\n").await;
    // Computed, so the echo of the typed line cannot match.
    input(client, pid, "echo trap-$((1+1))-set\n").await;
    screen.wait_for("trap-2-set").await;
    let size = WindowSize {
        rows: 40,
        cols: 100,
    };
    client.pty_resize(pid, size).await.unwrap();
    // The trap runs when the shell next reads a command.
    input(client, pid, "stty size\n").await;
    screen.wait_for("40 100").await;
    screen.wait_for("GOT-WINCH").await;
    screen.task.abort();
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

pub async fn a_terminal_survives_disconnect_and_replays_on_reattach(target: Target) {
    let pid = {
        let client = target.connect().await;
        let pid = open(&client, argv(&["sh"]), 24, 80).await;
        let screen = Screen::follow(&client, pid, 0);
        input(&client, pid, "echo before-$((6*7))\n").await;
        screen.wait_for("before-42").await;
        screen.task.abort();
        pid
    };
    // The first client is gone; a new one replays what the terminal printed.
    let client = target.connect().await;
    let replay = client.logs(pid, None).await.unwrap();
    let text = String::from_utf8_lossy(&chunk_bytes(&replay.batch.chunks)).into_owned();
    assert!(
        text.contains("before-42"),
        "replay lacks old output: {text}"
    );
    assert_eq!(replay.exit, None, "the shell should still run");

    let screen = Screen::follow(&client, pid, 0);
    screen.wait_for("before-42").await;
    input(&client, pid, "echo after-$((6*7)); exit 5\n").await;
    screen.wait_for("after-42").await;
    let exit = within(20, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(5));
}

pub async fn a_new_connection_takes_over_from_the_end_of_the_replay(target: Target) {
    let client = target.connect().await;
    let pid = open(&client, argv(&["sh"]), 24, 80).await;
    let screen = Screen::follow(&client, pid, 0);
    input(&client, pid, "echo $((6*7))\n").await;
    screen.wait_for("42").await;
    let size = WindowSize {
        rows: 40,
        cols: 100,
    };
    client.pty_resize(pid, size).await.unwrap();
    input(&client, pid, "stty size\n").await;
    screen.wait_for("40 100").await;
    screen.task.abort();
    drop(client);

    // A new connection replays what the terminal showed and takes it over.
    let client = target.connect().await;
    let replay = client.logs(pid, None).await.unwrap();
    let shown = String::from_utf8_lossy(&chunk_bytes(&replay.batch.chunks)).into_owned();
    assert!(shown.contains("42") && shown.contains("40 100"), "{shown}");
    let screen = Screen::follow(&client, pid, replay.batch.end);
    input(&client, pid, "echo again-$((6*7))\n").await;
    screen.wait_for("again-42").await;
    assert!(!screen.contents().contains("40 100"), "replayed twice");
    input(&client, pid, "exit 7\n").await;
    let exit = within(20, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(7));
}

pub async fn a_pty_command_with_env_and_cwd_runs_on_a_terminal(target: Target) {
    let client = target.client();
    let spec = ProcessSpec {
        env: vec![("GREETING".into(), "hi-there".into())],
        cwd: Some("/tmp".into()),
        ..shell("echo $GREETING; pwd; test -t 0 && echo is-a-tty")
    };
    let pid = open(client, spec, 10, 50).await;
    let screen = Screen::follow(client, pid, 0);
    let exit = within(20, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(0));
    let text = String::from_utf8_lossy(&screen.text.lock().unwrap()).into_owned();
    assert!(text.contains("hi-there"), "{text}");
    assert!(text.contains("/tmp"), "{text}");
    assert!(text.contains("is-a-tty"), "{text}");
}

pub async fn input_to_an_unknown_terminal_is_not_found(target: Target) {
    let err = target
        .client()
        .pty_input(Pid(999_999), b"x".to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

/// Regression: input requests in flight at once used to be written by separate
/// tasks, so their bytes could interleave on the terminal.
pub async fn pipelined_input_reaches_the_terminal_in_order(target: Target) {
    let client = target.client();
    // Raw mode and no echo: the terminal's output is exactly what cat read.
    let pid = open(client, shell("stty raw -echo; echo READY; cat"), 24, 80).await;
    let screen = Screen::follow(client, pid, 0);
    screen.wait_for("READY").await;
    // 4 KiB per request, 160 KiB in all: the terminal's buffer fills, so requests
    // need several writes each and have to wait for one another.
    let chunks: Vec<String> = (0..40)
        .map(|i| format!("<{i:02}{}>", "x".repeat(4090)))
        .collect();
    // Sent in order, all in flight at once: `stream` queues each request before it
    // returns (spawned tasks on a multi-thread runtime could queue them out of order).
    let sends: Vec<_> = chunks
        .iter()
        .map(|chunk| {
            let data = chunk.clone().into_bytes();
            client
                .stream(Request::PtyInput(PtyInputRequest { pid, data }))
                .unwrap()
        })
        .collect();
    for send in sends {
        within(20, send.reply()).await.unwrap();
    }
    screen.wait_for("<39").await;
    let expected = chunks.concat();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while !screen.contents().contains(&expected) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "input arrived out of order or torn");
    screen.task.abort();
    client.kill(pid, libc::SIGKILL).await.unwrap();
}
