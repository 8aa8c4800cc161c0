//! `sandboxctl --node` against a real `sandboxd` on real QEMU microVMs: `node info`,
//! `vm start` (a claim), `--vm ID` exec, a piped shell, put and get of a 3 MiB file
//! through the data plane, a wrong token refused, `vm ls`, drain and uncordon, `vm
//! stop` (a release); nothing left running afterwards.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Output;
use std::time::Duration;

use sandbox_tests::eventually;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::Value;
use support::{test_dir, Daemon};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "sandboxctl_drives_a_node_through_both_planes",
        run: || block_on(sandboxctl_on_a_node()),
    }])
}

/// `sandboxctl --node ADDR ARGS` with `stdin`, and its output.
async fn sandboxctl(daemon: &Daemon, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut command = tokio::process::Command::new(&sandbox_tests::binaries().sandboxctl);
    command
        .arg("--node")
        .arg(&daemon.addr)
        .args(args)
        .env_remove("SANDBOX_AGENT")
        .env_remove("SANDBOX_TOKEN")
        .env_remove("SANDBOXD_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).await.unwrap();
    }
    drop(input);
    tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("sandboxctl did not finish within 300 s")
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_code(output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}\nstdout: {}\nstderr: {}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

async fn sandboxctl_on_a_node() {
    let dir = test_dir("cli");
    let daemon = Daemon::start(&dir, &["--pool", "1", "--max-sandboxes", "3"], &[]).await;
    let op = daemon.token.clone();
    eventually(WARM_WITHIN, "a warm VM", || async {
        let info = sandboxctl(&daemon, &["--token", &op, "node", "info", "--json"], None).await;
        let info: Value = serde_json::from_slice(&info.stdout).ok()?;
        (info["pool"]["warm"] == 1).then_some(())
    })
    .await;
    let info = sandboxctl(&daemon, &["--token", &op, "node", "info"], None).await;
    assert_code(&info, 0, "node info");
    assert!(
        text(&info.stdout).contains("warm pool: default"),
        "{}",
        text(&info.stdout)
    );

    // A claim: `ID TOKEN DEADLINE`.
    let started = sandboxctl(
        &daemon,
        &["--token", &op, "vm", "start", "--ttl", "900"],
        None,
    )
    .await;
    assert_code(&started, 0, "vm start");
    let line = text(&started.stdout);
    let fields: Vec<&str> = line.trim().split('\t').collect();
    assert_eq!(fields.len(), 3, "{line}");
    let (id, token) = (fields[0].to_owned(), fields[1].to_owned());

    // The data plane with the sandbox's own token.
    let exec = sandboxctl(
        &daemon,
        &[
            "--vm",
            &id,
            "--token",
            &token,
            "exec",
            "--",
            "sh",
            "-c",
            "echo hi; exit 3",
        ],
        None,
    )
    .await;
    assert_code(&exec, 3, "exec");
    assert_eq!(text(&exec.stdout), "hi\n");
    let shell = sandboxctl(
        &daemon,
        &["--vm", &id, "--token", &token, "shell", "--", "sh"],
        Some(b"echo $((6*7))\nexit 4\n"),
    )
    .await;
    assert_code(&shell, 4, "shell");
    assert!(
        text(&shell.stdout).contains("42"),
        "{}",
        text(&shell.stdout)
    );

    // put and get: 3 MiB both ways, byte for byte.
    let local = dir.join("payload.bin");
    let payload: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| u8::try_from(i.wrapping_mul(2_654_435_761) >> 24).unwrap())
        .collect();
    std::fs::write(&local, &payload).unwrap();
    let put = sandboxctl(
        &daemon,
        &[
            "--vm",
            &id,
            "--token",
            &token,
            "put",
            local.to_str().unwrap(),
            "/root/payload.bin",
        ],
        None,
    )
    .await;
    assert_code(&put, 0, "put");
    let back = dir.join("back.bin");
    let get = sandboxctl(
        &daemon,
        &[
            "--vm",
            &id,
            "--token",
            &token,
            "get",
            "/root/payload.bin",
            back.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_code(&get, 0, "get");
    assert!(
        std::fs::read(&back).unwrap() == payload,
        "get returned other bytes"
    );

    // Someone else's token reaches nothing; the operator's reaches everything.
    let wrong = sandboxctl(
        &daemon,
        &["--vm", &id, "--token", "not-a-token", "exec", "--", "true"],
        None,
    )
    .await;
    assert_code(&wrong, 1, "a wrong token");
    assert!(
        text(&wrong.stderr).contains("401"),
        "{}",
        text(&wrong.stderr)
    );
    let as_operator =
        sandboxctl(&daemon, &["--vm", &id, "--token", &op, "ls", "/root"], None).await;
    assert_code(&as_operator, 0, "the operator's token");
    let sandbox_on_node = sandboxctl(&daemon, &["--token", &token, "node", "info"], None).await;
    assert_code(&sandbox_on_node, 1, "a sandbox token on node info");
    assert!(
        text(&sandbox_on_node.stderr).contains("forbidden"),
        "{}",
        text(&sandbox_on_node.stderr)
    );

    let listed = sandboxctl(&daemon, &["--token", &op, "vm", "ls", "--json"], None).await;
    assert_code(&listed, 0, "vm ls");
    let rows: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["id"], id.as_str());

    // Drain: claims refused until uncordoned.
    assert_code(
        &sandboxctl(&daemon, &["--token", &op, "node", "drain"], None).await,
        0,
        "drain",
    );
    let refused = sandboxctl(&daemon, &["--token", &op, "vm", "start"], None).await;
    assert_code(&refused, 1, "a claim while draining");
    assert!(
        text(&refused.stderr).contains("draining"),
        "{}",
        text(&refused.stderr)
    );
    assert_code(
        &sandboxctl(&daemon, &["--token", &op, "node", "uncordon"], None).await,
        0,
        "uncordon",
    );

    // Release; then the sandbox is gone for its token.
    assert_code(
        &sandboxctl(&daemon, &["--token", &op, "vm", "stop", &id], None).await,
        0,
        "vm stop",
    );
    let after = sandboxctl(
        &daemon,
        &["--vm", &id, "--token", &token, "exec", "--", "true"],
        None,
    )
    .await;
    assert_code(&after, 1, "exec on a released sandbox");

    let run = dir.join("run");
    let status = daemon.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}");
    eventually(Duration::from_secs(30), "every VM to be gone", || async {
        let left = std::fs::read_dir(&run).unwrap().count();
        let processes = sandbox_tests::processes_mentioning(&run.display().to_string());
        (left == 0 && processes.is_empty()).then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
