//! `sandbox-mcp` as a thin front end over a real node daemon: a `sandboxd` on a
//! loopback port (pool 1, at most 4 VMs, a run folder of its own) and the
//! official Python MCP SDK driving `tests/python/node_client.py`: two MCP sessions
//! at once with seed 000's `.mcp.json` arguments as written, their isolation, the
//! release of a disconnected session's claims (checked in the daemon's own
//! `GET /v1/sandboxes`), an ended session's id, the fleet and snapshot tools through
//! the node (create_sandboxes, ping_sandbox, list_templates, fork, checkpoint,
//! branch_checkpoint, hibernate, promote, expose_port through a preview URL), a
//! wrong token, and the sandstorm
//! profile through `SANDSTORM_URL`. Afterwards the daemon is stopped and nothing
//! may be left running.
//!
//! The interpreter and the opt-outs are `python_sdk`'s (`SANDBOX_MCP_PYTHON`,
//! `SANDBOX_SKIP_MCP_PYTHON=1`, `SANDBOX_SKIP_VM_TESTS=1`).

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use sandbox_tests::vm::{block_on, gate, Gate, SKIP_NOTE};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long the whole script may take: several VM boots, forks, checkpoints and a
/// promote under TCG on a busy host.
const SCRIPT_WITHIN: Duration = Duration::from_secs(1800);

/// The operator token the daemon is started with.
const OPERATOR_TOKEN: &str = "operator-token-for-the-mcp-node-test";

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let opted_out = std::env::var_os("SANDBOX_SKIP_MCP_PYTHON").is_some_and(|v| v == "1");
    let trial = Trial::ignorable_test("two_mcp_sessions_share_a_node_daemon", move || {
        if opted_out {
            return Ok(Completion::ignored_with("SANDBOX_SKIP_MCP_PYTHON=1"));
        }
        match gate() {
            Gate::Open => {
                block_on(two_mcp_sessions_share_a_node_daemon());
                Ok(Completion::Completed)
            }
            Gate::Skipped => Ok(Completion::ignored_with(SKIP_NOTE)),
            Gate::Missing(what) => Err(Failed::from(what)),
        }
    })
    .with_ignored_flag(opted_out || *gate() == Gate::Skipped);
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

fn python() -> PathBuf {
    std::env::var_os("SANDBOX_MCP_PYTHON").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-python/bin/python"),
        PathBuf::from,
    )
}

async fn two_mcp_sessions_share_a_node_daemon() {
    let sandboxd = &sandbox_tests::binaries().sandboxd;
    let run = support::run_dir("node");
    let home = run.join("mcp-home");
    std::fs::create_dir_all(&home).unwrap();
    let token_file = run.join("token");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .unwrap();
        std::io::Write::write_all(&mut file, OPERATOR_TOKEN.as_bytes()).unwrap();
    }
    let log = run.join("sandboxd.log");
    let mut daemon = tokio::process::Command::new(sandboxd);
    daemon
        .args([
            "--listen",
            "127.0.0.1:0",
            "--pool",
            "1",
            "--max-sandboxes",
            "4",
        ])
        .arg("--token-file")
        .arg(&token_file)
        .env("SANDBOX_RUN_DIR", run.join("vms"))
        .env("SANDBOX_CHECKPOINT_DIR", run.join("checkpoints"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true);
    for name in support::SERVER_ENV {
        if *name != "SANDBOX_HOME" {
            daemon.env_remove(name);
        }
    }
    let mut daemon = daemon.spawn().expect("cannot start sandboxd");
    // Dropped before `daemon` (declared after it): whatever way the test ends, the
    // node's sandboxes, which outlive a killed daemon by design, are stopped.
    let _stop_all = StopAll {
        sandboxd: sandboxd.to_owned(),
        run: run.clone(),
    };
    let mut lines = BufReader::new(daemon.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(addr) = line.strip_prefix("sandboxd listening on ") {
                return Some(addr.to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| {
        panic!(
            "sandboxd did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/node_client.py");
    let mcp_log = run.join("mcp");
    let mut command = tokio::process::Command::new(python());
    command
        .arg(&script)
        .env("SANDBOX_MCP_BIN", env!("CARGO_BIN_EXE_sandbox-mcp"))
        .env("SANDBOX_MCP_LOG", &mcp_log)
        .env("NODE_ADDR", &addr)
        .env("NODE_TOKEN", OPERATOR_TOKEN)
        .env("SANDBOX_HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SCRIPT_WITHIN, command.output())
        .await
        .unwrap_or_else(|_| panic!("the script did not finish within {SCRIPT_WITHIN:?}"))
        .expect("cannot run the Python script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    let logs = || {
        let mut text = format!(
            "sandboxd:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        for name in ["a", "b", "c", "bad", "sandstorm"] {
            let path = PathBuf::from(format!("{}.{name}", mcp_log.display()));
            text.push_str(&format!(
                "\nsandbox-mcp {name}:\n{}",
                std::fs::read_to_string(path).unwrap_or_default()
            ));
        }
        text
    };
    assert!(
        output.status.success() && stdout.contains("checks passed"),
        "the script failed ({}):\n{stdout}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        logs()
    );

    // The daemon stops its warm VM on SIGTERM; then nothing of this run is left.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), daemon.wait())
        .await
        .expect("sandboxd did not stop within 60 s")
        .unwrap();
    assert!(status.success(), "sandboxd exited {status}:\n{}", logs());
    support::eventually(
        Duration::from_secs(20),
        "every VM of the run to be gone",
        || async {
            sandbox_tests::processes_mentioning(&run.display().to_string())
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&run);
}

/// Runs `sandboxd stop-all` on the test's run folders when dropped: a failed test
/// must not leave the daemon's detached VMs running.
struct StopAll {
    sandboxd: PathBuf,
    run: PathBuf,
}

impl Drop for StopAll {
    fn drop(&mut self) {
        let mut command = std::process::Command::new(&self.sandboxd);
        command
            .arg("stop-all")
            .env("SANDBOX_RUN_DIR", self.run.join("vms"))
            .env("SANDBOX_CHECKPOINT_DIR", self.run.join("checkpoints"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for name in support::SERVER_ENV {
            if *name != "SANDBOX_HOME" {
                command.env_remove(name);
            }
        }
        if let Err(error) = command.status() {
            eprintln!("sandboxd stop-all could not run: {error}");
        }
    }
}
