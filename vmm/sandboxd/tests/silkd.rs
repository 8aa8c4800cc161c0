//! Seed 000's agent relay protocol on a real `sandboxd` with real microVMs.
//!
//! The first test runs seed 000's own Python SDK (`cocoonstack-sandbox` 0.1.19 from
//! PyPI, in the venv `scripts/setup.sh` makes at `target/silkd-python`; made here
//! when missing) through `tests/python/silkd_sdk.py`: every op the translator
//! serves, the control-plane calls the SDK makes (checkpoint, fork, hibernate,
//! renew, promote, close), one line per check. The second sends what the SDK never
//! does: a frame over the 8 MiB cap, bad JSON, unknown ops, frames outside a request,
//! and clients that vanish in the middle of an exec and of an upload.
//!
//! Both keep at most two VMs of their own running (`--pool 0 --max-sandboxes 2`).
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! tests ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

#[path = "support/sdk.rs"]
mod sdk;
mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sandbox_tests::eventually;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sdk::python_with_sdk;
use serde_json::{json, Value};
use support::{test_dir, Daemon, StopAllOnDrop};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long the whole SDK script may take (TCG on a busy 2-core host is slow).
const SCRIPT_WITHIN: Duration = Duration::from_secs(900);

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "seed_000s_python_sdk_drives_a_node_through_silkd",
            run: || block_on(the_sdk_drives_a_node()),
        },
        VmTest {
            name: "silkd_answers_hostile_frames_with_typed_errors_and_serves_on",
            run: || block_on(hostile_frames()),
        },
    ])
}

async fn the_sdk_drives_a_node() {
    let python = python_with_sdk();
    let dir = test_dir("silkd-sdk");
    let _cleanup = StopAllOnDrop(dir.clone());
    let daemon = Daemon::start(&dir, &["--pool", "0", "--max-sandboxes", "2"], &[]).await;
    let template = daemon.get("/v1/info").await.json["default_template"]
        .as_str()
        .unwrap()
        .to_owned();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/silkd_sdk.py");
    let output = tokio::time::timeout(
        SCRIPT_WITHIN,
        tokio::process::Command::new(&python)
            .arg(&script)
            .args([&daemon.addr, &daemon.token, &template])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the SDK script did not finish within {SCRIPT_WITHIN:?}"))
    .expect("cannot run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "the SDK script failed ({}):\n{stdout}\n{}\nsandboxd log:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    for check in [
        "ok exec_and_run",
        "ok spawn_ps_logs_attach_kill",
        "ok push_pull_tree",
        "ok watch_sees_a_new_file",
        "ok pty_with_resize",
        "ok dial_port_and_proxy_port",
        "ok promote_then_claim",
    ] {
        assert!(stdout.contains(check), "no {check:?} in:\n{stdout}");
    }
    let live = daemon.get("/v1/sandboxes").await;
    assert_eq!(live.json["sandboxes"], json!([]), "left running: {live:?}");
}

/// A raw silkd connection: the upgrade, then lines.
struct Raw {
    reader: BufReader<tokio::io::ReadHalf<TcpStream>>,
    writer: tokio::io::WriteHalf<TcpStream>,
}

impl Raw {
    async fn open(daemon: &Daemon, id: &str, token: &str) -> Self {
        let mut stream = TcpStream::connect(&daemon.addr).await.unwrap();
        let head = format!(
            "GET /v1/sandboxes/{id}/agent HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\n\
             Upgrade: silkd\r\nAuthorization: Bearer {token}\r\n\r\n",
            daemon.addr
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let (read, writer) = tokio::io::split(stream);
        let mut reader = BufReader::new(read);
        let mut status = String::new();
        reader.read_line(&mut status).await.unwrap();
        assert!(status.starts_with("HTTP/1.1 101"), "{status}");
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).await.unwrap();
            if header == "\r\n" {
                break;
            }
        }
        Self { reader, writer }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.unwrap();
    }

    async fn frame(&mut self) -> Option<Value> {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(120), self.reader.read_line(&mut line))
            .await
            .expect("no frame within 120 s")
            .ok()?;
        (read > 0).then(|| serde_json::from_str(&line).unwrap())
    }

    async fn call(&mut self, request: Value) -> Value {
        self.send(format!("{request}\n").as_bytes()).await;
        self.frame().await.expect("the connection ended")
    }
}

fn assert_error(frame: &Value, kind: &str) {
    assert_eq!(frame["type"], "error", "{frame}");
    assert_eq!(frame["kind"], kind, "{frame}");
}

async fn hostile_frames() {
    let dir = test_dir("silkd-raw");
    let _cleanup = StopAllOnDrop(dir.clone());
    let daemon = Daemon::start(&dir, &["--pool", "0", "--max-sandboxes", "2"], &[]).await;
    let claimed = daemon.post("/v1/claim", &json!({"ttl_seconds": 600})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", daemon.log());
    let id = claimed.json["id"].as_str().unwrap().to_owned();
    let token = claimed.json["token"].as_str().unwrap().to_owned();

    // Bad JSON, a frame without an op, bad fields, unknown and unserved ops: one
    // typed error each, and the connection serves on.
    let mut raw = Raw::open(&daemon, &id, &token).await;
    raw.send(b"{this is not json\n").await;
    assert_error(&raw.frame().await.unwrap(), "bad_request");
    assert_error(&raw.call(json!({"v": 1})).await, "bad_request");
    assert_error(
        &raw.call(json!({"v": 1, "op": "kill"})).await,
        "bad_request",
    );
    assert_error(
        &raw.call(json!({"v": 1, "op": "teleport"})).await,
        "unimplemented",
    );
    assert_error(
        &raw.call(json!({"v": 1, "op": "git_clone", "url": "x", "path": "/x"}))
            .await,
        "unimplemented",
    );
    assert_error(
        &raw.call(json!({"v": 2, "op": "info"})).await,
        "bad_request",
    );
    // Frames that feed a request, sent outside one, are ignored, never answered.
    raw.send(b"{\"v\":1,\"op\":\"stdin_close\"}\n{\"v\":1,\"op\":\"data_end\"}\n")
        .await;
    let info = raw.call(json!({"v": 1, "op": "info"})).await;
    assert_eq!(info["type"], "info", "{info}");
    assert_eq!(info["proto"], 2, "{info}");
    // Back to back on one connection.
    for _ in 0..3 {
        assert_eq!(raw.call(json!({"v": 1, "op": "ps"})).await["type"], "procs");
    }

    // A line over the 8 MiB cap: an error frame, then the connection ends; the
    // daemon never holds more than the cap of it.
    let huge = vec![b'x'; 9 * 1024 * 1024];
    raw.send(b"{\"v\":1,\"op\":\"fs_write\",\"path\":\"").await;
    let _ = raw.writer.write_all(&huge).await;
    let answer = raw.frame().await.expect("no answer to an oversized frame");
    assert_error(&answer, "bad_request");
    assert!(
        answer["message"].as_str().unwrap().contains("cap"),
        "{answer}"
    );
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), raw.reader.read_to_end(&mut rest)).await;

    // A client that vanishes in the middle of an exec: the command is killed.
    let mut raw = Raw::open(&daemon, &id, &token).await;
    raw.send(
        format!(
            "{}\n{}\n",
            json!({"v": 1, "op": "exec", "argv": ["sh", "-c", "echo up; exec sleep 600"]}),
            json!({"v": 1, "op": "stdin_close"})
        )
        .as_bytes(),
    )
    .await;
    let started = raw.frame().await.unwrap();
    assert_eq!(started["type"], "started", "{started}");
    let pid = started["pid"].as_i64().unwrap();
    assert_eq!(raw.frame().await.unwrap()["type"], "stdout");
    drop(raw);
    eventually(
        Duration::from_secs(30),
        "the abandoned exec killed",
        || async {
            let mut probe = Raw::open(&daemon, &id, &token).await;
            let procs = probe.call(json!({"v": 1, "op": "ps"})).await;
            let row = procs["procs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|row| row["pid"].as_i64() == Some(pid))
                .cloned();
            row.is_none_or(|row| row["state"] == "exited").then_some(())
        },
    )
    .await;
    let mut probe = Raw::open(&daemon, &id, &token).await;

    // A client that vanishes in the middle of an upload: nothing is written.
    let mut raw = Raw::open(&daemon, &id, &token).await;
    raw.send(
        format!(
            "{}\n{}\n",
            json!({"v": 1, "op": "fs_write", "path": "/tmp/vanished.txt"}),
            json!({"v": 1, "op": "data", "data": "aGFsZg=="})
        )
        .as_bytes(),
    )
    .await;
    drop(raw);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_error(
        &probe
            .call(json!({"v": 1, "op": "fs_stat", "path": "/tmp/vanished.txt"}))
            .await,
        "not_found",
    );

    // A slow reader: a 64 MiB pull nobody reads ends when the client goes.
    let mut raw = Raw::open(&daemon, &id, &token).await;
    raw.send(
        format!(
            "{}\n{}\n",
            json!({"v": 1, "op": "exec", "argv": ["sh", "-c", "head -c 67108864 /dev/zero > /tmp/big"]}),
            json!({"v": 1, "op": "stdin_close"})
        )
        .as_bytes(),
    )
    .await;
    while raw.frame().await.unwrap()["type"] != "exit" {}
    raw.send(format!("{}\n", json!({"v": 1, "op": "fs_pull", "path": "/tmp/big"})).as_bytes())
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(raw);
    let info = probe.call(json!({"v": 1, "op": "info"})).await;
    assert_eq!(info["type"], "info", "{info}");
    let released = daemon
        .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
        .await;
    assert_eq!(released.status, 200, "{released:?}");
}
