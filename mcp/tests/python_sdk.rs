//! `sandbox-mcp` driven by the official Python MCP SDK (the `mcp` package from
//! PyPI) on a real microVM: `tests/python/sdk_client.py` starts the server over
//! stdio through the SDK's `stdio_client`, lists the tools, creates a sandbox, runs
//! exec, writes and reads a text and a binary file, and checks the structured
//! results (the SDK also checks them against each tool's output schema). rmcp's
//! client is Rust's; this is what Python agent frameworks use, so a difference in
//! how the two read the protocol shows here.
//!
//! The interpreter: `SANDBOX_MCP_PYTHON`, else the venv that `scripts/setup.sh`
//! makes in this checkout's `target/mcp-python`. A missing SDK fails the test with
//! the command that installs it; `SANDBOX_SKIP_MCP_PYTHON=1` skips it explicitly
//! (shown as ignored), as `SANDBOX_SKIP_VM_TESTS=1` does every microVM test.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use sandbox_tests::vm::{block_on, gate, Gate, SKIP_NOTE};

/// The explicit opt-out.
const SKIP_PYTHON_ENV: &str = "SANDBOX_SKIP_MCP_PYTHON";

/// The interpreter's override.
const PYTHON_ENV: &str = "SANDBOX_MCP_PYTHON";

/// How long the whole script may take (a claim, a dozen calls and a 3 s exec under
/// TCG on a busy 2-core host).
const SCRIPT_WITHIN: Duration = Duration::from_secs(300);

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let opted_out = std::env::var_os(SKIP_PYTHON_ENV).is_some_and(|v| v == "1");
    let trial = Trial::ignorable_test("the_python_sdk_drives_a_microvm_sandbox", move || {
        if opted_out {
            return Ok(Completion::ignored_with(format!("{SKIP_PYTHON_ENV}=1")));
        }
        match gate() {
            Gate::Open => {
                block_on(the_python_sdk_drives_a_microvm_sandbox());
                Ok(Completion::Completed)
            }
            Gate::Skipped => Ok(Completion::ignored_with(SKIP_NOTE)),
            Gate::Missing(what) => Err(Failed::from(what)),
        }
    })
    .with_ignored_flag(opted_out || *gate() == Gate::Skipped);
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

/// The Python with the SDK: the override, else the setup script's venv. Panics with
/// the way to get it.
fn python_with_sdk() -> PathBuf {
    let python = std::env::var_os(PYTHON_ENV).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-python/bin/python"),
        PathBuf::from,
    );
    let probe = std::process::Command::new(&python)
        .args(["-c", "import mcp.client.stdio"])
        .output();
    match probe {
        Ok(out) if out.status.success() => python,
        outcome => panic!(
            "the Python MCP SDK is not importable with {} ({}). Run scripts/setup.sh (it \
             makes that venv and installs `mcp` from PyPI), or point {PYTHON_ENV} at a \
             Python that has it; {SKIP_PYTHON_ENV}=1 skips this test explicitly",
            python.display(),
            match outcome {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(error) => error.to_string(),
            }
        ),
    }
}

async fn the_python_sdk_drives_a_microvm_sandbox() {
    let python = python_with_sdk();
    let run = support::run_dir("py");
    let log = PathBuf::from(format!("{}.log", run.display()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/sdk_client.py");
    let binary = std::env::var_os("SANDBOX_MCP_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_sandbox-mcp").into());
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("SANDBOX_MCP_BIN", &binary)
        .env("SANDBOX_MCP_LOG", &log)
        .env("SANDBOX_RUN_DIR", &run)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // The script hands every SANDBOX_* variable to the server: none of the server's
    // own settings may leak in from the developer's shell.
    for name in support::SERVER_ENV {
        command.env_remove(name);
    }
    let started = Instant::now();
    let output = tokio::time::timeout(SCRIPT_WITHIN, command.output())
        .await
        .unwrap_or_else(|_| panic!("the Python SDK script did not finish within {SCRIPT_WITHIN:?}"))
        .expect("cannot run the Python SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}the script took {:?}", started.elapsed());
    assert!(
        output.status.success(),
        "the Python SDK script failed ({}):\n{stdout}\n{}\nserver log:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        stdout.contains("checks passed"),
        "the script did not get to its end:\n{stdout}"
    );
    // The SDK closed the server's stdin and waited for it: its VM is gone.
    support::eventually(
        Duration::from_secs(10),
        "the server's VM to be gone",
        || async {
            sandbox_tests::processes_mentioning(&run.display().to_string())
                .is_empty()
                .then_some(())
        },
    )
    .await;
    support::assert_nothing_left(&run);
    let _ = std::fs::remove_dir_all(&run);
    let _ = std::fs::remove_file(&log);
}
