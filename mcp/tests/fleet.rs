//! The fleet tools of `sandbox-mcp`'s default profile on real QEMU microVMs, driven
//! by rmcp's MCP client: three sandboxes in one `create_sandboxes` call (the warm one
//! and two started side by side), listed, described and pinged; `exec` with an argv
//! that no shell touches; and the refusals (a count past the limit, a batch that
//! does not fit, command and argv together), each an `isError` that names the tool to
//! call. After the session no QEMU, relay or run folder is left.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use support::{assert_nothing_left, eventually, Folders};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

/// The sandbox limit of the test's server, and the batch that fills it.
const MAX: usize = 3;

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "three_sandboxes_in_one_call_listed_pinged_and_run_with_argv",
        run: || block_on(three_sandboxes_in_one_call()),
    }])
}

fn ids(batch: &Value) -> Vec<String> {
    batch["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sandbox| sandbox["sandbox_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn three_sandboxes_in_one_call() {
    let Some(folders) = Folders::new("fleet", "batch") else {
        return;
    };
    let max = MAX.to_string();
    let server = folders
        .server(&["--pool", "1", "--max-sandboxes", &max])
        .await;
    eventually(WARM_WITHIN, "a warm VM", || async {
        let info = server.ok("node_info", json!({})).await;
        (info["pool"]["warm"] == 1).then_some(())
    })
    .await;

    let templates = server.ok("list_templates", json!({})).await;
    let default = templates["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == "default")
        .unwrap_or_else(|| panic!("no default template: {templates}"));
    assert_eq!(default["default"], true, "{templates}");
    assert!(default["memory_mib"].as_u64().unwrap() > 0, "{templates}");

    let too_many = server
        .err("create_sandboxes", json!({"count": MAX + 1}))
        .await;
    assert!(
        too_many.contains(&format!("between 1 and {MAX}")),
        "{too_many}"
    );

    // One call, three sandboxes: the warm one and two started side by side.
    let started = Instant::now();
    let batch = server.ok("create_sandboxes", json!({"count": MAX})).await;
    let batch_took = started.elapsed();
    let sandboxes = ids(&batch);
    assert_eq!(sandboxes.len(), MAX, "{batch}");
    assert_eq!(
        sandboxes.iter().collect::<HashSet<_>>().len(),
        MAX,
        "ids repeat: {batch}"
    );
    assert_eq!(batch["warm"], 1, "{batch}");
    assert_eq!(batch["sandboxes"][0]["ttl_seconds"], 3600);

    // Full: one more does not fit, and nothing is evicted for the refusal.
    let no_room = server.err("create_sandboxes", json!({"count": 1})).await;
    assert!(
        no_room.contains("room") && no_room.contains("release"),
        "{no_room}"
    );

    let listed = server.ok("list_sandboxes", json!({})).await;
    let rows = listed["sandboxes"].as_array().unwrap();
    let listed_ids: HashSet<&str> = rows
        .iter()
        .map(|row| row["sandbox_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed_ids,
        sandboxes.iter().map(String::as_str).collect(),
        "{listed}"
    );
    assert!(rows.iter().all(|row| row["state"] == "running"), "{listed}");
    assert_eq!(listed["claimable"], 0, "{listed}");

    let described = server
        .ok("get_sandbox", json!({"sandbox_id": sandboxes[1]}))
        .await;
    assert_eq!(
        (described["template"].as_str(), described["state"].as_str()),
        (Some("default"), Some("running")),
        "{described}"
    );
    assert!(described["seconds_left"].as_u64().unwrap() > 3500);
    let unknown = server
        .err("get_sandbox", json!({"sandbox_id": "sbx-nope"}))
        .await;
    assert!(unknown.starts_with("Unknown sandbox_id"), "{unknown}");

    for sandbox in &sandboxes {
        let ping = server
            .ok("ping_sandbox", json!({"sandbox_id": sandbox}))
            .await;
        assert_eq!(ping["state"], "running", "{ping}");
        assert!(ping["round_trip_ms"].is_u64(), "{ping}");
        assert!(
            ping["agent_version"]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{ping}"
        );
    }

    // argv reaches the program as given: no word splitting, no expansion.
    let printed = server
        .ok(
            "exec",
            json!({"sandbox_id": sandboxes[0], "argv": ["printf", "%s|", "a b", "$HOME", "*", ";id"]}),
        )
        .await;
    assert_eq!(printed["exit_code"], 0, "{printed}");
    assert_eq!(printed["stdout"], "a b|$HOME|*|;id|", "{printed}");
    let both = server
        .err(
            "exec",
            json!({"sandbox_id": sandboxes[0], "command": "id", "argv": ["id"]}),
        )
        .await;
    assert!(both.contains("exactly one"), "{both}");
    let missing = server
        .ok(
            "exec",
            json!({"sandbox_id": sandboxes[0], "argv": ["sh", "-c", "exit 7"]}),
        )
        .await;
    assert_eq!(missing["exit_code"], 7, "{missing}");

    // The sandboxes of a batch are independent.
    server
        .ok(
            "exec",
            json!({"sandbox_id": sandboxes[0], "argv": ["touch", "/tmp/first-only"]}),
        )
        .await;
    for other in &sandboxes[1..] {
        let absent = server
            .ok(
                "exec",
                json!({"sandbox_id": other, "argv": ["ls", "/tmp/first-only"]}),
            )
            .await;
        assert_ne!(absent["exit_code"], 0, "{other} sees the first's file");
    }

    server
        .ok("release", json!({"sandbox_id": sandboxes[2]}))
        .await;
    let listed = server.ok("list_sandboxes", json!({})).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), MAX - 1);

    eprintln!("create_sandboxes of {MAX} (1 warm): {batch_took:?}");
    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&folders.run);
}
