//! Claims placed across a fleet of three real `sandboxd` on a real etcd, booting
//! real microVMs (`--pool 0 --max-sandboxes 4` each, the machine's templates).
//!
//! Twelve claims sent to A spread over the three, four each (a node with room is
//! chosen, the client follows the redirect once, and the sandbox's calls go to its
//! owner); seed 000's Python SDK follows the same redirect. A drained node gets no
//! claims, even those sent to it. After `kill -9` of B, claims land on A and C only.
//! Nothing is left running after.
//!
//! Needs the `etcd` binary (scripts/setup.sh installs it) and what
//! `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks it ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

#[path = "support/sdk.rs"]
mod sdk;
#[path = "support/services.rs"]
mod services;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_vmm::node_api::wire::{ClaimBody, ClaimReply};
use sandbox_vmm::node_api::NodeApi;
use serde_json::json;
use services::Etcd;
use support::{test_dir, Daemon, StopAllOnDrop};

/// Each node's capacity: twelve claims fill the three exactly.
const CAPACITY: usize = 4;

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "claims_spread_over_the_fleet_skip_drained_and_dead_nodes_and_follow_redirects",
        run: || block_on(placement()),
    }])
}

async fn start_node(dir: &Path, etcd: &Etcd, node_id: &str) -> Daemon {
    let capacity = CAPACITY.to_string();
    Daemon::start(
        dir,
        &[
            "--pool",
            "0",
            "--max-sandboxes",
            &capacity,
            "--etcd",
            &etcd.url,
            "--lease-ttl",
            "3",
            "--node-id",
            node_id,
        ],
        &[],
    )
    .await
}

/// Polls `check` every 100 ms until it gives a value or `within` passes.
async fn within<T>(within: Duration, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < until, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The live nodes A's catalogue lists, by id, with (draining, used).
async fn catalogue(a: &Daemon) -> BTreeMap<String, (bool, u64)> {
    let peers = a.get("/v1/peers").await;
    peers.json["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter(|node| node["alive"] == true)
                .map(|node| {
                    (
                        node["id"].as_str().unwrap().to_owned(),
                        (node["draining"] == true, node["used"].as_u64().unwrap_or(0)),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `count` claims sent one after another through `api`; each reply with how long
/// it took.
async fn claim_many(api: &NodeApi, count: usize, tag: &str) -> Vec<(ClaimReply, Duration)> {
    let body = ClaimBody {
        ttl_seconds: 900,
        claim_ref: tag.to_owned(),
        ..ClaimBody::default()
    };
    let mut made = Vec::new();
    for n in 0..count {
        let started = Instant::now();
        let reply = api
            .claim(&body)
            .await
            .unwrap_or_else(|error| panic!("{tag}: claim {n} failed: {error}"));
        made.push((reply, started.elapsed()));
    }
    made
}

/// How many of `made` each node address owns.
fn owners(made: &[(ClaimReply, Duration)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (reply, _) in made {
        *counts.entry(reply.owner_addr.clone()).or_insert(0) += 1;
    }
    counts
}

/// Releases each of `made` at its owner.
async fn release_all(api: &NodeApi, made: &[(ClaimReply, Duration)]) {
    for (reply, _) in made {
        let owner = api.at(&reply.owner_addr).unwrap();
        owner
            .release(&reply.id)
            .await
            .unwrap_or_else(|error| panic!("release {} at {}: {error}", reply.id, owner.base()));
    }
}

fn mean_ms(made: &[(ClaimReply, Duration)], on: impl Fn(&ClaimReply) -> bool) -> f64 {
    let times: Vec<f64> = made
        .iter()
        .filter(|(reply, _)| on(reply))
        .map(|(_, took)| took.as_secs_f64() * 1000.0)
        .collect();
    times.iter().sum::<f64>() / times.len().max(1) as f64
}

async fn placement() {
    let dir = test_dir("fleet-place");
    let etcd = Etcd::start(&dir);
    let pid = std::process::id();
    let (a_dir, b_dir, c_dir) = (dir.join("a"), dir.join("b"), dir.join("c"));
    // Each node's VMs outlive it by design: stopped even when an assertion fails.
    let _stop = [&a_dir, &b_dir, &c_dir].map(|dir| StopAllOnDrop(dir.to_path_buf()));
    let (a_id, b_id, c_id) = (
        format!("place-a-{pid}"),
        format!("place-b-{pid}"),
        format!("place-c-{pid}"),
    );
    let a = start_node(&a_dir, &etcd, &a_id).await;
    let b = start_node(&b_dir, &etcd, &b_id).await;
    let c = start_node(&c_dir, &etcd, &c_id).await;
    within(Duration::from_secs(5), "three live nodes", async || {
        (catalogue(&a).await.len() == 3).then_some(())
    })
    .await;
    let addr_of: BTreeMap<&str, &str> = [
        (a.addr.as_str(), "A"),
        (b.addr.as_str(), "B"),
        (c.addr.as_str(), "C"),
    ]
    .into();

    // Twelve claims sent to A: four on each node, each one's calls at its owner.
    let api = a.api();
    let spread = claim_many(&api, 3 * CAPACITY, "spread").await;
    let counts = owners(&spread);
    eprintln!(
        "twelve claims through A: {:?}; mean claim {:.0} ms on A itself, {:.0} ms placed on a peer",
        counts
            .iter()
            .map(|(addr, n)| (addr_of.get(addr.as_str()).copied().unwrap_or("?"), *n))
            .collect::<Vec<_>>(),
        mean_ms(&spread, |reply| reply.owner_addr == a.addr),
        mean_ms(&spread, |reply| reply.owner_addr != a.addr),
    );
    for node in [&a, &b, &c] {
        assert_eq!(counts.get(&node.addr), Some(&CAPACITY), "{counts:?}");
    }
    for (reply, _) in &spread {
        let owner = [&a, &b, &c]
            .into_iter()
            .find(|node| node.addr == reply.owner_addr)
            .unwrap();
        let listed = owner.get(&format!("/v1/sandboxes/{}", reply.id)).await;
        assert_eq!(listed.status, 200, "{listed:?}");
        // A's typed client follows A's 421 to the owner.
        let row = api.sandbox(&reply.id).await.unwrap();
        assert_eq!(row.id, reply.id);
    }
    let (far, _) = spread
        .iter()
        .find(|(reply, _)| reply.owner_addr == c.addr)
        .unwrap();
    let on_c = c.agent(&far.id, &far.token).await.unwrap();
    assert_eq!(
        sandbox_tests::sh(&on_c, "echo placed on C").await.trim(),
        "placed on C"
    );
    drop(on_c);
    // The fleet is full: A answers its own refusal.
    let full = a.post("/v1/claim", &json!({})).await;
    assert!(full.status >= 400, "{full:?}");
    release_all(&api, &spread).await;
    within(
        Duration::from_secs(5),
        "the releases published",
        async || {
            catalogue(&a)
                .await
                .values()
                .all(|(_, used)| *used == 0)
                .then_some(())
        },
    )
    .await;

    // Seed 000's SDK, sent to A, follows the same redirect (B and C are emptier
    // than A once A holds two).
    let mut here = Vec::new();
    for _ in 0..2 {
        let answer = a.post("/v1/claim", &json!({"no_redirect": true})).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        here.push(answer.json);
    }
    within(Duration::from_secs(5), "A's use published", async || {
        (catalogue(&a).await.get(&a_id).map(|(_, used)| *used) == Some(2)).then_some(())
    })
    .await;
    let redirect = a.post("/v1/claim", &json!({})).await;
    assert_eq!(redirect.status, 200, "{redirect:?}");
    let named: Vec<&str> = redirect.json["redirect"]
        .as_array()
        .unwrap()
        .iter()
        .map(|addr| addr.as_str().unwrap())
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|addr| *addr == b.addr || *addr == c.addr),
        "{redirect:?}"
    );
    let sdk_owner = sdk_claim(&a).await;
    assert!(
        sdk_owner == b.addr || sdk_owner == c.addr,
        "the SDK's sandbox is on {sdk_owner}"
    );
    for sandbox in &here {
        let id = sandbox["id"].as_str().unwrap();
        let released = a
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await;
        assert_eq!(released.status, 200, "{released:?}");
    }

    // C drains: claims, even those sent to C, land on A and B.
    let drained = c.post("/v1/drain", &json!({})).await;
    assert_eq!(drained.status, 200, "{drained:?}");
    within(Duration::from_secs(5), "C's drain published", async || {
        catalogue(&a)
            .await
            .get(&c_id)
            .is_some_and(|(draining, _)| *draining)
            .then_some(())
    })
    .await;
    let via_c = claim_many(&c.api(), 3, "drained").await;
    let via_a = claim_many(&api, 3, "drained").await;
    for (reply, _) in via_c.iter().chain(&via_a) {
        assert!(
            reply.owner_addr == a.addr || reply.owner_addr == b.addr,
            "a claim landed on the drained C: {reply:?}"
        );
    }
    release_all(&api, &via_c).await;
    release_all(&api, &via_a).await;
    let uncordoned = c.call("DELETE", "/v1/drain", Some(&c.token), None).await;
    assert_eq!(uncordoned.status, 200, "{uncordoned:?}");

    // kill -9 of B: once its lease expires, claims land on A and C only.
    let b_addr = b.addr.clone();
    b.kill9().await;
    within(
        Duration::from_secs(10),
        "B gone from the catalogue",
        async || {
            let nodes = catalogue(&a).await;
            (!nodes.contains_key(&b_id) && nodes.get(&c_id).is_some_and(|(d, _)| !d)).then_some(())
        },
    )
    .await;
    let after = claim_many(&api, 4, "after-kill").await;
    for (reply, _) in &after {
        assert!(
            reply.owner_addr == a.addr || reply.owner_addr == c.addr,
            "a claim landed on the dead B ({b_addr}): {reply:?}"
        );
    }
    release_all(&api, &after).await;
    assert!(a.terminate(Duration::from_secs(60)).await.success());
    assert!(c.terminate(Duration::from_secs(60)).await.success());
    drop(etcd);
    drop(_stop);
    for node in [&a_dir, &b_dir, &c_dir] {
        let left: Vec<_> = std::fs::read_dir(node.join("run"))
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            left.iter()
                .all(|name| !name.to_string_lossy().starts_with("sb-")),
            "{} left {left:?}",
            node.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A claim by seed 000's Python SDK sent to `a`: the owner it reports (the SDK
/// follows a redirect to a peer, `Sandbox.owner`), after one exec there and its
/// release.
async fn sdk_claim(a: &Daemon) -> String {
    let python = sdk::python_with_sdk();
    let script = r#"
import sys
from cocoonsandbox import Client
client = Client(sys.argv[1], api_token=sys.argv[2])
sb = client.new("", ttl_seconds=900)
out = sb.exec("echo", "sdk on a peer")
assert out == "sdk on a peer\n", out
print(sb.owner)
sb.close()
"#;
    let out = tokio::process::Command::new(python)
        .args(["-c", script, &a.addr, &a.token])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK's claim failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
