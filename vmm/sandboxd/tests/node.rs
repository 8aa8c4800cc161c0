//! `sandboxd` on real QEMU microVMs: a daemon on a loopback port with a warm pool,
//! driven over HTTP as seed 000's clients drive a node. Claims, the agent protocol
//! through the upgrade (exec, files, a streamed put and get), one sandbox's token
//! refused on another and on operator endpoints, fork, checkpoint and a claim from
//! it (kept while used), hibernate and a wake through the data plane, renew,
//! release; then SIGTERM leaves no QEMU, relay or run folder.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_tests::{eventually, sh};
use sandbox_vmm::client::ClientError;
use serde_json::{json, Value};
use support::{test_dir, Daemon};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "a_node_serves_claims_the_agent_protocol_and_snapshots_over_http",
        run: || block_on(a_node_end_to_end()),
    }])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

async fn a_node_end_to_end() {
    let dir = test_dir("node");
    let daemon = Daemon::start(&dir, &["--pool", "1", "--max-sandboxes", "5"], &[]).await;
    eventually(WARM_WITHIN, "a warm VM", || async {
        let info = daemon.get("/v1/info").await;
        (info.json["pool"]["warm"] == 1).then_some(())
    })
    .await;

    // A claim: the warm VM, with its own token.
    let claimed = daemon.post("/v1/claim", &json!({"ttl_seconds": 600})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", daemon.log());
    let a = field(&claimed.json, "id");
    let a_token = field(&claimed.json, "token");
    assert_eq!(claimed.json["warm"], true, "{claimed:?}");
    assert_eq!(field(&claimed.json, "owner_addr"), daemon.addr);
    assert!(!field(&claimed.json, "deadline").is_empty());

    // The agent protocol through the upgrade, with the sandbox's token.
    let client = daemon.agent(&a, &a_token).await.unwrap();
    assert_eq!(
        sh(&client, "echo hi from $(hostname)")
            .await
            .trim_end()
            .split(' ')
            .next(),
        Some("hi")
    );
    client
        .write_file("/tmp/marker", b"from-a".to_vec(), None)
        .await
        .unwrap();
    assert_eq!(client.read_file("/tmp/marker").await.unwrap(), b"from-a");
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    client.put("/tmp/big", None, big.as_slice()).await.unwrap();
    let mut back = Vec::new();
    client.get("/tmp/big", &mut back).await.unwrap();
    assert!(back == big, "3 MiB put and got back through the node");

    // Another sandbox's token reaches its own sandbox only.
    let other = daemon.post("/v1/claim", &json!({})).await;
    assert_eq!(other.status, 201, "{other:?}");
    let b = field(&other.json, "id");
    let b_token = field(&other.json, "token");
    let refused = daemon.agent(&a, &b_token).await.err().unwrap();
    assert!(
        matches!(&refused, ClientError::NodeRefused { status: 401, code, .. } if code == "unauthorized"),
        "{refused:?}"
    );
    let refused = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{a}/release"),
            Some(&b_token),
            None,
        )
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
    let operator_only = daemon.call("GET", "/v1/info", Some(&a_token), None).await;
    assert_eq!(operator_only.status, 403, "{operator_only:?}");
    let own = daemon
        .call("GET", "/v1/sandboxes", Some(&a_token), None)
        .await;
    let listed: Vec<String> = own.json["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| field(row, "id"))
        .collect();
    assert_eq!(
        listed,
        vec![a.clone()],
        "a sandbox token lists its own sandbox only"
    );
    let all = daemon.get("/v1/sandboxes").await;
    assert_eq!(
        all.json["sandboxes"].as_array().unwrap().len(),
        2,
        "{all:?}"
    );
    assert!(
        !all.text.contains(&a_token) && !all.text.contains(&b_token),
        "no tokens in listings"
    );

    // A fork: the child has the parent's files, its own token.
    let forked = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{a}/fork"),
            None,
            Some(&json!({"token": a_token, "count": 1})),
        )
        .await;
    assert_eq!(forked.status, 200, "{forked:?}\n{}", daemon.log());
    let child = &forked.json["children"][0];
    let child_id = field(child, "id");
    let child_client = daemon
        .agent(&child_id, &field(child, "token"))
        .await
        .unwrap();
    assert_eq!(
        child_client.read_file("/tmp/marker").await.unwrap(),
        b"from-a"
    );
    drop(child_client);
    let released = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{child_id}/release"),
            Some(&field(child, "token")),
            None,
        )
        .await;
    assert_eq!(released.status, 200, "{released:?}");

    // A checkpoint, a claim from it, kept while that sandbox lives.
    let taken = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{a}/checkpoint"),
            None,
            Some(&json!({"token": a_token, "name": "node-test"})),
        )
        .await;
    assert_eq!(taken.status, 200, "{taken:?}\n{}", daemon.log());
    let checkpoint = field(&taken.json["checkpoint"], "id");
    assert_eq!(taken.json["checkpoint"]["sandbox_id"], a.as_str());
    let listed = daemon.get("/v1/checkpoints").await;
    assert!(listed.text.contains(&checkpoint), "{listed:?}");
    let branched = daemon
        .post(&format!("/v1/checkpoints/{checkpoint}/claim"), &json!({}))
        .await;
    assert_eq!(branched.status, 201, "{branched:?}\n{}", daemon.log());
    assert_eq!(branched.json["from_checkpoint"], checkpoint.as_str());
    let c = field(&branched.json, "id");
    let c_client = daemon
        .agent(&c, &field(&branched.json, "token"))
        .await
        .unwrap();
    assert_eq!(c_client.read_file("/tmp/marker").await.unwrap(), b"from-a");
    drop(c_client);
    let in_use = daemon
        .call(
            "DELETE",
            &format!("/v1/checkpoints/{checkpoint}"),
            Some(&daemon.token),
            None,
        )
        .await;
    assert_eq!(
        (in_use.status, in_use.json["code"].as_str()),
        (409, Some("in_use")),
        "{in_use:?}"
    );
    assert_eq!(
        daemon
            .post(&format!("/v1/sandboxes/{c}/release"), &json!({}))
            .await
            .status,
        200
    );
    let deleted = daemon
        .call(
            "DELETE",
            &format!("/v1/checkpoints/{checkpoint}"),
            Some(&daemon.token),
            None,
        )
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");

    // Hibernate; the next agent connection wakes it, files and all.
    drop(client);
    let slept = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{a}/hibernate"),
            Some(&a_token),
            None,
        )
        .await;
    assert_eq!(slept.status, 200, "{slept:?}\n{}", daemon.log());
    assert_eq!(slept.json["hibernated_now"], true);
    let woken = daemon.agent(&a, &a_token).await.unwrap();
    assert_eq!(woken.read_file("/tmp/marker").await.unwrap(), b"from-a");
    drop(woken);

    // Renew moves the deadline.
    let before = field(
        &daemon.get(&format!("/v1/sandboxes/{a}")).await.json,
        "deadline",
    );
    let renewed = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{a}/renew"),
            Some(&a_token),
            Some(&json!({"ttl_seconds": 7200})),
        )
        .await;
    assert_eq!(renewed.status, 200, "{renewed:?}");
    assert!(
        field(&renewed.json, "deadline") > before,
        "{renewed:?} vs {before}"
    );

    // Release, twice: the second is told the sandbox is gone.
    assert_eq!(
        daemon
            .call(
                "POST",
                &format!("/v1/sandboxes/{b}/release"),
                Some(&b_token),
                None
            )
            .await
            .status,
        200
    );
    let again = daemon
        .post(&format!("/v1/sandboxes/{b}/release"), &json!({}))
        .await;
    assert_eq!(again.status, 410, "{again:?}");

    let metrics = daemon.call("GET", "/metrics", None, None).await;
    assert!(
        metrics.text.contains("sandboxd_warm_hits_total"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.text.contains("sandboxd_agent_connections_total"),
        "{}",
        metrics.text
    );

    // SIGTERM: every VM stops, nothing is left.
    let run = dir.join("run");
    let status = daemon.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}");
    eventually(Duration::from_secs(30), "every VM to be gone", || async {
        let left = std::fs::read_dir(&run).unwrap().count();
        let processes = support::processes_mentioning(&run.display().to_string());
        (left == 0 && processes.is_empty()).then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
