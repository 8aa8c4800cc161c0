//! Fleet membership on a real etcd: three `sandboxd` with their own homes and
//! ports (no warm pool, so no VM boots) register under leases they keep alive.
//! All three appear as peers, and a drain on one is visible from the others,
//! within moments (each step prints how long it took); `kill -9` of one drops it
//! within the lease's TTL; SIGTERM of another drops it at once (lease revoked);
//! with etcd stopped the node keeps serving and `GET /v1/peers` says etcd is
//! unreachable; with etcd back it re-registers on a new lease. A second test claims a real microVM on one node
//! and `kill -9`s that node: the sandbox is reported lost fleet-wide, and found
//! again when the node restarts and re-adopts it.
//!
//! Needs the `etcd` binary (scripts/setup.sh installs it); without it the test fails.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

#[path = "support/services.rs"]
mod services;
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use services::Etcd;
use support::{test_dir, Daemon};

/// The lease TTL the nodes run with.
const TTL_SECS: u64 = 3;

/// How long a change one node publishes may take to show on another. On an idle
/// machine it is milliseconds (each test prints what it saw); the bound is for a
/// CI machine whose two cores and disk the other suites keep busy. A bound this
/// test enforces is a correctness check, not a benchmark.
const PROMPTLY: Duration = Duration::from_secs(10);

/// How long past the lease's TTL a dead node's records may linger, for the same
/// reason.
const EXPIRY_SLACK_SECS: u64 = 5;

async fn start_node(dir: &Path, name: &str, etcd: &Etcd) -> Daemon {
    let home = dir.join(name);
    let home_arg = home.join("home");
    std::fs::create_dir_all(&home_arg).unwrap();
    let ttl = TTL_SECS.to_string();
    Daemon::start(
        &home,
        &[
            "--pool",
            "0",
            "--sandbox-home",
            home_arg.to_str().unwrap(),
            "--etcd",
            &etcd.url,
            "--lease-ttl",
            &ttl,
        ],
        &[],
    )
    .await
}

/// Polls `check` every 50 ms until it gives a value or `within` passes.
async fn within<T>(within: Duration, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < until, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node_ids(peers: &Value) -> Vec<String> {
    let mut ids: Vec<String> = peers["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter(|node| node["alive"] == true)
                .map(|node| node["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Runs `etcdctl ARGS` against `etcd`; panics unless it succeeds.
fn etcdctl(etcd: &Etcd, args: &[&str]) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.url])
        .args(args)
        .output()
        .expect("cannot run etcdctl (scripts/setup.sh installs etcd-client)");
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
}

fn draining_of(peers: &Value, id: &str) -> Option<bool> {
    peers["nodes"]
        .as_array()?
        .iter()
        .find(|node| node["id"] == id)
        .and_then(|node| node["draining"].as_bool())
}

#[test]
fn three_nodes_register_drain_die_leave_and_survive_etcd_going_away() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(fleet());
}

async fn fleet() {
    let dir = test_dir("fleet-members");
    let mut etcd = Etcd::start(&dir);
    let a = start_node(&dir, "a", &etcd).await;
    let b = start_node(&dir, "b", &etcd).await;
    let c = start_node(&dir, "c", &etcd).await;
    let started = Instant::now();
    let id_of = |daemon: &Daemon| {
        let file = daemon.dir.join("home").join("sandboxd").join("node-id");
        std::fs::read_to_string(file).unwrap().trim().to_owned()
    };

    // All three register (within milliseconds of starting on an idle machine).
    let all = within(PROMPTLY, "three peers", async || {
        let peers = a.get("/v1/peers").await;
        (node_ids(&peers.json).len() == 3).then_some(peers.json)
    })
    .await;
    eprintln!("three peers after {:?}", started.elapsed());
    let (a_id, b_id, c_id) = (id_of(&a), id_of(&b), id_of(&c));
    let mut expected = vec![a_id.clone(), b_id.clone(), c_id.clone()];
    expected.sort();
    assert_eq!(node_ids(&all), expected, "{all}");
    assert_eq!(all["node_id"], a_id.as_str());
    assert_eq!(all["peers"].as_array().unwrap().len(), 2, "{all}");
    assert!(all["peers"]
        .as_array()
        .unwrap()
        .contains(&Value::from(b.addr.clone())));
    let info = c.get("/v1/info").await;
    assert_eq!(info.json["peers"].as_array().unwrap().len(), 2, "{info:?}");
    for node in all["nodes"].as_array().unwrap() {
        assert_eq!(node["capacity"], 8, "{node}");
        assert_eq!(node["draining"], false, "{node}");
        assert!(node["addr"].as_str().unwrap().starts_with("127.0.0.1:"));
    }

    // The lost rule as the fleet listing applies it: a durable sandbox record
    // (written here as a vanished node would have left it) with no owner record.
    etcdctl(
        &etcd,
        &[
            "put",
            "/sandbox/sandboxes/sbx-ghost",
            r#"{"node_id":"vanished","template":"default","created_unix":1}"#,
        ],
    );
    let peers = b.get("/v1/peers").await;
    let lost = peers.json["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{}", peers.json);
    assert_eq!(lost[0]["id"], "sbx-ghost");
    assert_eq!(lost[0]["node_id"], "vanished");
    // Asked for by id, a lost sandbox is a 410 `sandbox_lost`, not an unknown id.
    for path in ["/v1/sandboxes/sbx-ghost", "/v1/sandboxes/sbx-ghost/owner"] {
        let answer = a.get(path).await;
        assert_eq!(answer.status, 410, "{path}: {answer:?}");
        assert_eq!(answer.json["code"], "sandbox_lost", "{answer:?}");
        assert!(
            answer.json["error"].as_str().unwrap().contains("vanished"),
            "{answer:?}"
        );
    }
    etcdctl(&etcd, &["del", "/sandbox/sandboxes/sbx-ghost"]);
    let unknown = a.get("/v1/sandboxes/sbx-ghost").await;
    assert_eq!(unknown.status, 404, "{unknown:?}");

    // A drain on B is visible from A and C at once.
    let drained = b.call("POST", "/v1/drain", Some(&b.token), None).await;
    assert_eq!(drained.status, 200, "{drained:?}");
    let drained_at = Instant::now();
    for viewer in [&a, &c] {
        within(PROMPTLY, "the drain seen", async || {
            let peers = viewer.get("/v1/peers").await;
            (draining_of(&peers.json, &b_id) == Some(true)).then_some(())
        })
        .await;
    }
    eprintln!("drain seen after {:?}", drained_at.elapsed());

    // kill -9 of B: its record expires within the lease's TTL (plus a refresh).
    b.kill9().await;
    let killed_at = Instant::now();
    within(
        Duration::from_secs(TTL_SECS + EXPIRY_SLACK_SECS),
        "the killed node's record expired",
        async || {
            let peers = a.get("/v1/peers").await;
            (!node_ids(&peers.json).contains(&b_id)).then_some(())
        },
    )
    .await;
    let expired_after = killed_at.elapsed();
    eprintln!("killed node gone after {expired_after:?}");
    assert!(
        expired_after > Duration::from_millis(500),
        "a killed node's record stays until its lease expires"
    );

    // SIGTERM of C: its lease is revoked, its record goes at once.
    assert!(c.terminate(Duration::from_secs(30)).await.success());
    let peers = a.get("/v1/peers").await;
    assert_eq!(node_ids(&peers.json), vec![a_id.clone()], "{:?}", peers);

    // etcd stopped: A keeps serving; /v1/peers says etcd is unreachable.
    etcd.stop();
    let down = a.get("/v1/peers").await;
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(down.json["code"], "etcd_unreachable", "{down:?}");
    assert!(
        down.json["error"]
            .as_str()
            .unwrap()
            .contains("etcd is unreachable"),
        "{down:?}"
    );
    let info = a.get("/v1/info").await;
    assert_eq!(info.status, 200, "{info:?}");
    let drained = a.call("POST", "/v1/drain", Some(&a.token), None).await;
    assert_eq!(drained.status, 200, "the node still serves: {drained:?}");

    // etcd back: A re-registers on a new lease, with its drain flag as it is now
    // (etcd restores the old lease and record, drain off, for one more TTL: the
    // flag tells the new record from the old).
    etcd.spawn();
    let back = within(Duration::from_secs(15), "A re-registered", async || {
        let peers = a.get("/v1/peers").await;
        (peers.status == 200
            && peers.json["registered"] == true
            && draining_of(&peers.json, &a_id) == Some(true))
        .then_some(peers.json)
    })
    .await;
    assert_eq!(node_ids(&back), vec![a_id.clone()], "{back}");
    assert!(a.terminate(Duration::from_secs(30)).await.success());
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_nodes_sandbox_is_reported_lost_and_found_again_when_it_restarts() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(lost_and_found());
}

/// A node that boots VMs: the machine's templates (its `SANDBOX_HOME`), its own run
/// folder, and a node id of its own (the id file would be the home's).
async fn start_vm_node(dir: &Path, etcd: &Etcd, node_id: &str, listen: &str) -> Daemon {
    let ttl = TTL_SECS.to_string();
    Daemon::start_on(
        dir,
        listen,
        &[
            "--pool",
            "0",
            "--max-sandboxes",
            "1",
            "--etcd",
            &etcd.url,
            "--lease-ttl",
            &ttl,
            "--node-id",
            node_id,
        ],
        &[],
    )
    .await
}

async fn lost_and_found() {
    let dir = test_dir("fleet-lost");
    let etcd = Etcd::start(&dir);
    let a = start_node(&dir, "a", &etcd).await;
    let b_dir = dir.join("b");
    // B's VM outlives B by design: stop it even when an assertion fails below.
    let _stop_b = support::StopAllOnDrop(b_dir.clone());
    let b_id = format!("lost-b-{}", std::process::id());
    let b = start_vm_node(&b_dir, &etcd, &b_id, "127.0.0.1:0").await;
    let b_addr = b.addr.clone();

    let claimed = b.post("/v1/claim", &serde_json::json!({})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}");
    let id = claimed.json["id"].as_str().unwrap().to_owned();
    let owner_path = format!("/v1/sandboxes/{id}/owner");

    // Another node names the owner, and sends the sandbox's calls there.
    let owner = within(PROMPTLY, "the owner record", async || {
        let answer = a.get(&owner_path).await;
        (answer.status == 200).then_some(answer.json)
    })
    .await;
    assert_eq!(owner["owner_addr"], b_addr.as_str(), "{owner}");
    let elsewhere = a.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(elsewhere.status, 421, "{elsewhere:?}");
    assert_eq!(elsewhere.json["code"], "elsewhere", "{elsewhere:?}");
    assert!(
        elsewhere.json["error"].as_str().unwrap().contains(&b_addr),
        "{elsewhere:?}"
    );

    // kill -9 of B: within the lease its sandbox is lost, listed and asked for.
    b.kill9().await;
    let killed_at = Instant::now();
    let peers = within(
        Duration::from_secs(TTL_SECS + EXPIRY_SLACK_SECS),
        "the sandbox listed lost",
        async || {
            let peers = a.get("/v1/peers").await;
            let lost = peers.json["lost"].as_array()?;
            lost.iter()
                .any(|entry| entry["id"] == id.as_str())
                .then_some(peers.json)
        },
    )
    .await;
    eprintln!("sandbox lost after {:?}", killed_at.elapsed());
    assert!(!node_ids(&peers).contains(&b_id), "{peers}");
    let gone = a.get(&owner_path).await;
    assert_eq!(gone.status, 410, "{gone:?}");
    assert_eq!(gone.json["code"], "sandbox_lost", "{gone:?}");

    // B restarts on its run folder: it re-adopts the VM, and the fleet finds it.
    let b = start_vm_node(&b_dir, &etcd, &b_id, &b_addr).await;
    let found = within(
        Duration::from_secs(30),
        "the sandbox found again",
        async || {
            let answer = a.get(&owner_path).await;
            (answer.status == 200).then_some(answer.json)
        },
    )
    .await;
    assert_eq!(found["owner_addr"], b_addr.as_str(), "{found}");
    let peers = a.get("/v1/peers").await;
    // `lost` is left out when empty.
    assert!(peers.json.get("lost").is_none(), "{peers:?}");
    let exec = b
        .agent(&id, claimed.json["token"].as_str().unwrap())
        .await
        .unwrap()
        .exec(sandbox_tests::exec_sh("echo still here"))
        .await
        .unwrap();
    assert_eq!(exec.stdout, b"still here\n", "{exec:?}");

    let released = b
        .post(
            &format!("/v1/sandboxes/{id}/release"),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(released.status, 200, "{released:?}");
    within(PROMPTLY, "the records removed", async || {
        let answer = a.get(&owner_path).await;
        (answer.status == 404).then_some(())
    })
    .await;
    assert!(b.terminate(Duration::from_secs(60)).await.success());
    assert!(a.terminate(Duration::from_secs(30)).await.success());
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
