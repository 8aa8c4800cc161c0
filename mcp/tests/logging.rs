//! The MCP logging capability of `sandbox-mcp` on real QEMU microVMs, driven by
//! rmcp's MCP client: the server declares it; `logging/setLevel` info brings the
//! per-call info messages, warning stops them; and the server's warnings arrive
//! as `notifications/message` without any tool call asking: a sandbox destroyed at
//! its deadline by the reaper, and a sandbox whose VM died (its QEMU killed under
//! it), next to the `isError` result of the call that found it dead.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]
// rmcp deprecates the logging types (SEP-2577); this protocol version has them.
#![allow(deprecated)]

mod support;

use std::time::Duration;

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, SetLevelRequestParams};
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::json;
use support::{assert_nothing_left, eventually, processes_mentioning, Folders, McpServer};

/// How long a claim, a TTL's end or a notification may take on a loaded host.
const WITHIN: Duration = Duration::from_secs(180);

/// The TTL of the sandbox the reaper destroys.
const SHORT_TTL_SECS: u64 = 3;

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "warnings_reach_the_client_as_log_messages_at_the_level_it_set",
        run: || block_on(warnings_reach_the_client()),
    }])
}

/// The first message received after the first `skip` that `pick` accepts.
async fn message(
    server: &McpServer,
    skip: usize,
    what: &str,
    pick: impl Fn(&LoggingMessageNotificationParam) -> bool,
) -> LoggingMessageNotificationParam {
    eventually(WITHIN, what, || {
        let found = server.log_messages()[skip..]
            .iter()
            .find(|m| pick(m))
            .cloned();
        async move { found }
    })
    .await
}

fn says(message: &LoggingMessageNotificationParam, text: &str) -> bool {
    message.data["message"]
        .as_str()
        .is_some_and(|said| said.contains(text))
}

async fn warnings_reach_the_client() {
    let Some(folders) = Folders::new("logging", "log") else {
        return;
    };
    let server = folders
        .server(&["--pool", "0", "--max-sandboxes", "2"])
        .await;
    let info = server.session().peer_info().unwrap();
    assert!(
        info.capabilities.logging.is_some(),
        "no logging capability: {:?}",
        info.capabilities
    );

    // Info on: every call is logged; warning: not any more.
    server
        .session()
        .set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .unwrap();
    server.ok("node_info", json!({})).await;
    let call = message(&server, 0, "the node_info call's info message", |m| {
        m.level == LoggingLevel::Info && m.data["tool"] == "node_info"
    })
    .await;
    assert!(
        call.logger
            .as_deref()
            .unwrap_or("")
            .starts_with("sandbox_mcp"),
        "{call:?}"
    );
    server
        .session()
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .unwrap();
    let quiet_from = server.log_messages().len();
    server.ok("list_sandboxes", json!({})).await;

    // The reaper: a sandbox reaches its deadline with no call in flight.
    let short = server
        .ok("create_sandbox", json!({"ttl_seconds": SHORT_TTL_SECS}))
        .await;
    let short_id = short["sandbox_id"].as_str().unwrap().to_owned();
    let reaped = message(&server, quiet_from, "the reaper's warning", |m| {
        m.data["sandbox"] == short_id.as_str()
    })
    .await;
    assert_eq!(reaped.level, LoggingLevel::Warning, "{reaped:?}");
    assert!(says(&reaped, "deadline"), "{reaped:?}");
    eventually(WITHIN, "the expired sandbox to be gone", || async {
        let gone = server
            .call("get_sandbox", json!({"sandbox_id": short_id}))
            .await;
        (gone.is_error == Some(true)).then_some(())
    })
    .await;

    // A VM that dies under its sandbox.
    let doomed = server.ok("create_sandbox", json!({})).await;
    let doomed_id = doomed["sandbox_id"].as_str().unwrap().to_owned();
    server
        .ok("exec", json!({"sandbox_id": doomed_id, "command": "true"}))
        .await;
    let run = folders.run.display().to_string();
    let qemus: Vec<u32> = processes_mentioning(&run)
        .into_iter()
        .filter(|(_, command)| command.contains("qemu"))
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(qemus.len(), 1, "one VM runs");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(qemus[0]).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let failed = server
        .err("exec", json!({"sandbox_id": doomed_id, "command": "true"}))
        .await;
    assert!(failed.contains("release it"), "{failed}");
    let died = message(&server, quiet_from, "the dead VM's warning", |m| {
        m.data["sandbox"] == doomed_id.as_str()
    })
    .await;
    assert_eq!(died.level, LoggingLevel::Warning, "{died:?}");
    assert!(says(&died, "may have died"), "{died:?}");

    // Nothing below warning since the client asked for warning.
    let below: Vec<_> = server.log_messages()[quiet_from..]
        .iter()
        .filter(|m| m.level == LoggingLevel::Info || m.level == LoggingLevel::Debug)
        .cloned()
        .collect();
    assert!(below.is_empty(), "info after setLevel warning: {below:?}");

    server.ok("release", json!({"sandbox_id": doomed_id})).await;
    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&folders.run);
}
