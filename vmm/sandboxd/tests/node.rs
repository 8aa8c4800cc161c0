//! `sandboxd` on real QEMU microVMs: a daemon on a loopback port with a warm pool,
//! driven over HTTP as seed 000's clients drive a node. Claims, the agent protocol
//! through the upgrade (exec, files, a streamed put and get), one sandbox's token
//! refused on another and on operator endpoints, fork, checkpoint and a claim from
//! it (kept while used), hibernate and a wake through the data plane, renew,
//! release; then SIGTERM stops the warm VM and leaves the claimed sandbox, a restart
//! re-adopts it, and `sandboxd stop-all` leaves no QEMU, relay or run folder.
//!
//! The second test kills the daemon with `kill -9` and starts it again on the same
//! home and port: the claimed sandboxes answer with the same id, token and deadline,
//! their files and a process spawned before; a hibernated one (woken meanwhile by
//! `sandboxctl vm wake`, and hibernated again) wakes on its next connection; the
//! killed daemon's warm VM is stopped, not leaked.
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
use support::{test_dir, Daemon, StopAllOnDrop};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "a_node_serves_claims_the_agent_protocol_and_snapshots_over_http",
            run: || block_on(a_node_end_to_end()),
        },
        VmTest {
            name: "a_node_killed_with_sigkill_re_adopts_its_sandboxes_at_restart",
            run: || block_on(a_node_outlives_kill_9()),
        },
    ])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

async fn a_node_end_to_end() {
    let dir = test_dir("node");
    let _cleanup = StopAllOnDrop(dir.clone());
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
    // The pool's boots (at least the first warm VM and its refills) are timed.
    let boots: u64 = metrics
        .text
        .lines()
        .find_map(|line| line.strip_prefix("sandboxd_boot_seconds_count "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no boot count in\n{}", metrics.text));
    assert!(boots >= 1, "{}", metrics.text);
    assert!(
        metrics
            .text
            .contains("sandboxd_egress_connections{verdict=\"denied\"}"),
        "{}",
        metrics.text
    );

    // SIGTERM: the warm VM stops; the claimed sandbox `a` keeps running.
    let run = dir.join("run");
    let deadline = field(
        &daemon.get(&format!("/v1/sandboxes/{a}")).await.json,
        "deadline",
    );
    let addr = daemon.addr.clone();
    let status = daemon.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}");
    let a_vm = a.strip_prefix("sbx-").unwrap().to_owned();
    let left: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec![a_vm.clone()], "only the claimed sandbox is left");
    assert!(
        !sandbox_tests::processes_mentioning(&a_vm).is_empty(),
        "its QEMU runs on"
    );

    // The next start re-adopts it: same id, token, deadline and files.
    let daemon = Daemon::start_on(&dir, &addr, &["--pool", "0"], &[]).await;
    let again = daemon.agent(&a, &a_token).await.unwrap();
    assert_eq!(again.read_file("/tmp/marker").await.unwrap(), b"from-a");
    drop(again);
    let shown = daemon.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(field(&shown.json, "deadline"), deadline, "{shown:?}");

    // `stop-all` asks the daemon to stop, then ends everything it left.
    let said = support::stop_all(&dir);
    assert!(said.contains("stopped 1 VMs"), "{said}");
    let status = tokio::time::timeout(Duration::from_secs(60), daemon.wait())
        .await
        .expect("the daemon did not stop for stop-all");
    assert!(status.success(), "{status:?}");
    assert_nothing_left(&run).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// No run folder, QEMU or relay of `run` is left.
async fn assert_nothing_left(run: &std::path::Path) {
    eventually(Duration::from_secs(30), "every VM to be gone", || async {
        let left = std::fs::read_dir(run).unwrap().count();
        let processes = sandbox_tests::processes_mentioning(&run.display().to_string());
        (left == 0 && processes.is_empty()).then_some(())
    })
    .await;
}

/// The folders (VM ids) in `run`.
fn run_folders(run: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn a_node_outlives_kill_9() {
    let dir = test_dir("adopt");
    let _cleanup = StopAllOnDrop(dir.clone());
    let run = dir.join("run");
    let args = ["--pool", "1", "--max-sandboxes", "4"];
    let daemon = Daemon::start(&dir, &args, &[]).await;
    eventually(WARM_WITHIN, "a warm VM", || async {
        let info = daemon.get("/v1/info").await;
        (info.json["pool"]["warm"] == 1).then_some(())
    })
    .await;

    // `a`: a file and a background process.
    let claimed = daemon.post("/v1/claim", &json!({"ttl_seconds": 900})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", daemon.log());
    let a = field(&claimed.json, "id");
    let a_token = field(&claimed.json, "token");
    let a_deadline = field(&claimed.json, "deadline");
    let client = daemon.agent(&a, &a_token).await.unwrap();
    client
        .write_file("/tmp/before", b"written before the kill".to_vec(), None)
        .await
        .unwrap();
    let sleeper = client
        .spawn(sandbox_tests::argv(&["sleep", "1000"]))
        .await
        .unwrap();
    drop(client);

    // `b`: hibernated by the daemon, woken by the CLI (issue 22 item 3: the daemon
    // then uses the running VM instead of insisting it sleeps), hibernated again.
    let claimed = daemon.post("/v1/claim", &json!({"ttl_seconds": 900})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", daemon.log());
    let b = field(&claimed.json, "id");
    let b_token = field(&claimed.json, "token");
    let b_client = daemon.agent(&b, &b_token).await.unwrap();
    b_client
        .write_file("/tmp/b", b"b's file".to_vec(), None)
        .await
        .unwrap();
    drop(b_client);
    let hibernate = |id: String, token: String| {
        let daemon = &daemon;
        async move {
            let slept = daemon
                .call(
                    "POST",
                    &format!("/v1/sandboxes/{id}/hibernate"),
                    Some(&token),
                    None,
                )
                .await;
            assert_eq!(slept.status, 200, "{slept:?}\n{}", daemon.log());
        }
    };
    hibernate(b.clone(), b_token.clone()).await;
    let b_vm = b.strip_prefix("sbx-").unwrap().to_owned();
    sandbox_tests::TestCommand::new_sandboxctl()
        .env("SANDBOX_RUN_DIR", &run.display().to_string())
        .args(["vm", "wake", &b_vm])
        .deadline(Duration::from_secs(240))
        .assert_code(0);
    let b_client = daemon.agent(&b, &b_token).await.unwrap();
    assert_eq!(
        sh(&b_client, "cat /tmp/b").await,
        "b's file",
        "the daemon reaches the VM the CLI woke\n{}",
        daemon.log()
    );
    drop(b_client);
    hibernate(b.clone(), b_token.clone()).await;

    // The pool's warm VM, which the killed daemon leaves unclaimed.
    eventually(WARM_WITHIN, "the pool to refill", || async {
        let info = daemon.get("/v1/info").await;
        (info.json["pool"]["warm"] == 1).then_some(())
    })
    .await;
    let a_vm = a.strip_prefix("sbx-").unwrap().to_owned();
    let warm: Vec<String> = run_folders(&run)
        .into_iter()
        .filter(|name| *name != a_vm && *name != b_vm)
        .collect();
    assert_eq!(warm.len(), 1, "one warm VM: {warm:?}");

    let addr = daemon.addr.clone();
    let status = daemon.kill9().await;
    assert!(!status.success(), "{status:?}");
    assert!(
        !sandbox_tests::processes_mentioning(&a_vm).is_empty(),
        "a's QEMU outlived the daemon"
    );

    let daemon = Daemon::start_on(&dir, &addr, &args, &[]).await;
    let client = daemon.agent(&a, &a_token).await.unwrap();
    assert_eq!(
        client.read_file("/tmp/before").await.unwrap(),
        b"written before the kill"
    );
    let entry = sandbox_tests::ps_entry(&client, sleeper)
        .await
        .expect("the process spawned before the kill is listed");
    assert_eq!(
        entry.state,
        sandbox_protocol::ProcessState::Running,
        "{entry:?}"
    );
    drop(client);
    let shown = daemon.get(&format!("/v1/sandboxes/{a}")).await;
    assert_eq!(field(&shown.json, "deadline"), a_deadline, "{shown:?}");
    let shown = daemon.get(&format!("/v1/sandboxes/{b}")).await;
    assert_eq!(shown.json["status"], "hibernated", "{shown:?}");
    // A token is still the sandbox's own: `a`'s does not reach `b`.
    assert!(daemon.agent(&b, &a_token).await.is_err());
    let b_client = daemon.agent(&b, &b_token).await.unwrap();
    assert_eq!(sh(&b_client, "cat /tmp/b").await, "b's file");
    drop(b_client);
    // The killed daemon's warm VM was stopped, not leaked.
    eventually(Duration::from_secs(60), "the old warm VM to go", || async {
        (!run.join(&warm[0]).exists() && sandbox_tests::processes_mentioning(&warm[0]).is_empty())
            .then_some(())
    })
    .await;
    assert!(
        daemon.log().contains("re-adopted"),
        "the log reports the adoption:\n{}",
        daemon.log()
    );

    for (id, token) in [(&a, &a_token), (&b, &b_token)] {
        let released = daemon
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/release"),
                Some(token),
                None,
            )
            .await;
        assert_eq!(released.status, 200, "{released:?}");
    }
    let status = daemon.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "{status:?}");
    assert_nothing_left(&run).await;
    let _ = std::fs::remove_dir_all(&dir);
}
