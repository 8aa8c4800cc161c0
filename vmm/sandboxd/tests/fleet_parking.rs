//! A drained node's hibernated sandboxes wake on another node, on real QEMU
//! microVMs, a real S3 server (SeaweedFS) and a real etcd on loopback, two
//! `sandboxd` nodes A and C:
//!
//! - a sandbox on A with a file written and a process spawned is hibernated, and A
//!   drains: the drain parks it (its image in the store, `P/parked/<id>` in etcd,
//!   no owner record, nothing left on A);
//! - its token on A learns that C wakes it (421 and `/owner`); a wrong token on C
//!   learns nothing and takes nothing; two first calls at once on C take it once,
//!   and it runs there with the same id, token, file and process;
//! - a sandbox hibernated on the draining A is parked by that hibernate; released
//!   while parked, it is gone without waking anywhere;
//! - `POST /v1/drain {"hibernate": true}` hibernates and parks a running sandbox;
//!   an image blob altered in the store is refused by digest on C, which keeps
//!   nothing and gives the sandbox back to the fleet, and wakes it once restored;
//! - a parked sandbox wakes on C after A is killed with -9, and A restarted on its
//!   run folder brings back nothing it handed over;
//! - with the S3 server stopped, a drain cannot park and says why; the sandbox
//!   stays hibernated on A and wakes there.
//!
//! Needs what `sandbox_tests::vm::gate` checks, `etcd` and `weed` (`scripts/setup.sh`
//! installs them). `SANDBOX_SKIP_VM_TESTS=1` marks the test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

#[path = "support/services.rs"]
mod services;
mod support;

use std::time::{Duration, Instant};

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt as _;
use sandbox_protocol::{Command, ProcessSpec};
use sandbox_tests::sh;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use services::{s3_client, store_node, Etcd, S3};
use support::{test_dir, Daemon, StopAllOnDrop};

/// What a park logs (`sandboxd::parking::PARKED_EVENT`).
const PARKED_EVENT: &str = "sandbox parked in the fleet";

/// What a take logs (`sandboxd::parking::TAKEN_EVENT`).
const TAKEN_EVENT: &str = "parked sandbox taken from the fleet";

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name:
            "a_drained_nodes_hibernated_sandbox_wakes_on_another_node_with_its_files_and_processes",
        run: || block_on(parking()),
    }])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

fn count(log: &str, event: &str) -> usize {
    log.lines().filter(|line| line.contains(event)).count()
}

/// A sandbox claimed on `node`: its id and token.
async fn claim(node: &Daemon) -> (String, String) {
    let claimed = node
        .post(
            "/v1/claim",
            &json!({"ttl_seconds": 600, "no_redirect": true}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", node.log());
    (field(&claimed.json, "id"), field(&claimed.json, "token"))
}

async fn hibernate(node: &Daemon, id: &str, token: &str) -> Value {
    let slept = node
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/hibernate"),
            Some(token),
            Some(&json!({})),
        )
        .await;
    assert_eq!(slept.status, 200, "{slept:?}\n{}", node.log());
    slept.json
}

/// Releases `id` on `node` with its own token.
async fn release(node: &Daemon, id: &str, token: &str) {
    let released = node
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(token),
            Some(&json!({})),
        )
        .await;
    assert_eq!(released.status, 200, "{released:?}\n{}", node.log());
}

async fn set_drain(node: &Daemon, on: bool, body: &Value) -> Value {
    let method = if on { "POST" } else { "DELETE" };
    let answer = node
        .call(method, "/v1/drain", Some(&node.token), Some(body))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}\n{}", node.log());
    answer.json
}

/// The run folders on `node` (by VM id).
fn run_folders(dir: &std::path::Path, node: &str) -> Vec<String> {
    std::fs::read_dir(dir.join(node).join("run"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

async fn parking() {
    let dir = test_dir("fleet-parking");
    let _cleanup_a = StopAllOnDrop(dir.join("a"));
    let _cleanup_c = StopAllOnDrop(dir.join("c"));
    let mut s3 = S3::start(&dir);
    let etcd = Etcd::start(&dir);
    let prefix = format!("parking-{}", std::process::id());
    let a = store_node(&dir, "a", None, &s3, &prefix, &etcd, 2).await;
    let c = store_node(&dir, "c", None, &s3, &prefix, &etcd, 2).await;
    let c_addr = c.addr.clone();

    // On A: a file and a spawned process, then hibernated; A drains and parks it.
    let (sandbox, token) = claim(&a).await;
    let client = a.agent(&sandbox, &token).await.unwrap();
    client
        .write_file("/tmp/marker", b"written on A".to_vec(), None)
        .await
        .unwrap();
    let spawned = client
        .spawn(ProcessSpec::new(Command::Shell(
            "exec sleep 3600".to_owned(),
        )))
        .await
        .unwrap();
    drop(client);
    let slept = hibernate(&a, &sandbox, &token).await;
    assert_eq!(slept["parked"], false, "A was not draining yet: {slept}");
    let started = Instant::now();
    let drained = set_drain(&a, true, &json!({})).await;
    let park_ms = started.elapsed().as_millis();
    assert_eq!(
        drained["parked"],
        json!([sandbox]),
        "{drained}\n{}",
        a.log()
    );
    assert_eq!(count(&a.log(), PARKED_EVENT), 1, "{}", a.log());
    let parked = etcd
        .get(&format!("/sandbox/parked/{sandbox}"))
        .expect("no parked record");
    let parked: Value = serde_json::from_str(&parked).unwrap();
    assert_eq!(parked["node_id"], "a", "{parked}");
    assert!(
        !parked.to_string().contains(&token),
        "the parked record holds the token: {parked}"
    );
    assert_eq!(etcd.get(&format!("/sandbox/owners/{sandbox}")), None);
    assert!(
        run_folders(&dir, "a").is_empty(),
        "A kept {:?}",
        run_folders(&dir, "a")
    );
    let listed = a.get("/v1/sandboxes").await;
    assert_eq!(listed.json["sandboxes"], json!([]), "{listed:?}");
    let peers = a.get("/v1/peers").await;
    assert_eq!(peers.json["parked"][0]["id"], sandbox.as_str(), "{peers:?}");

    // Its token, on A, is told where it wakes; a wrong token on C learns nothing.
    let owner = a
        .call(
            "GET",
            &format!("/v1/sandboxes/{sandbox}/owner"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(owner.status, 200, "{owner:?}\n{}", a.log());
    assert_eq!(owner.json["owner_addr"], c_addr.as_str(), "{owner:?}");
    let on_a = a
        .call(
            "GET",
            &format!("/v1/sandboxes/{sandbox}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(
        (on_a.status, on_a.json["code"].clone()),
        (421, json!("elsewhere")),
        "{on_a:?}"
    );
    for bad in ["not-the-token", ""] {
        let denied = c
            .call("GET", &format!("/v1/sandboxes/{sandbox}"), Some(bad), None)
            .await;
        assert_eq!(denied.status, 401, "{denied:?}");
    }
    assert_eq!(count(&c.log(), TAKEN_EVENT), 0, "{}", c.log());
    assert!(etcd.get(&format!("/sandbox/parked/{sandbox}")).is_some());

    // Two first calls at once on C: one take; the sandbox runs on C as it was.
    let show = format!("/v1/sandboxes/{sandbox}");
    let started = Instant::now();
    let (connected, shown) = tokio::join!(
        c.agent(&sandbox, &token),
        c.call("GET", &show, Some(&token), None)
    );
    let client = connected.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!(shown.status, 200, "{shown:?}\n{}", c.log());
    assert_eq!(shown.json["id"], sandbox.as_str(), "{shown:?}");
    assert_eq!(count(&c.log(), TAKEN_EVENT), 1, "{}", c.log());
    eprintln!(
        "drain parking one hibernated sandbox: {park_ms} ms; its first calls on C \
         (take, download, wake): {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(
        client.read_file("/tmp/marker").await.unwrap(),
        b"written on A"
    );
    let processes = client.ps().await.unwrap();
    assert!(
        processes
            .iter()
            .any(|p| p.pid == spawned && p.argv.iter().any(|a| a.contains("sleep 3600"))),
        "A's spawned process {spawned:?} is not running on C: {processes:?}"
    );
    assert_eq!(sh(&client, "echo on C").await.trim(), "on C");
    assert_eq!(
        etcd.get(&format!("/sandbox/owners/{sandbox}")).as_deref(),
        Some("c")
    );
    assert_eq!(etcd.get(&format!("/sandbox/parked/{sandbox}")), None);
    let durable: Value =
        serde_json::from_str(&etcd.get(&format!("/sandbox/sandboxes/{sandbox}")).unwrap()).unwrap();
    assert_eq!(durable["node_id"], "c", "{durable}");
    // A now points its token at C, the owner.
    let owner = a
        .call(
            "GET",
            &format!("/v1/sandboxes/{sandbox}/owner"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(owner.json["owner_addr"], c_addr.as_str(), "{owner:?}");
    drop(client);
    release(&c, &sandbox, &token).await;

    // Hibernated on the draining A: parked by the hibernate itself. Released while
    // parked: gone, woken nowhere.
    set_drain(&a, false, &json!({})).await;
    let (second, second_token) = claim(&a).await;
    let drained = set_drain(&a, true, &json!({})).await;
    assert!(
        drained.get("parked").is_none(),
        "a running sandbox was parked: {drained}"
    );
    let slept = hibernate(&a, &second, &second_token).await;
    assert_eq!(slept["parked"], true, "{slept}\n{}", a.log());
    release(&c, &second, &second_token).await;
    assert_eq!(count(&c.log(), TAKEN_EVENT), 1, "{}", c.log());
    assert_eq!(etcd.get(&format!("/sandbox/parked/{second}")), None);
    let gone = c
        .call(
            "GET",
            &format!("/v1/sandboxes/{second}"),
            Some(&second_token),
            None,
        )
        .await;
    assert_eq!(gone.status, 401, "{gone:?}");

    // A drain that hibernates: a running sandbox is hibernated, parked, and wakes on
    // C at its first exec.
    set_drain(&a, false, &json!({})).await;
    let (third, third_token) = claim(&a).await;
    let client = a.agent(&third, &third_token).await.unwrap();
    assert_eq!(
        sh(&client, "echo 3 > /tmp/three; echo ok").await.trim(),
        "ok"
    );
    drop(client);
    let drained = set_drain(&a, true, &json!({"hibernate": true})).await;
    assert_eq!(drained["parked"], json!([third]), "{drained}\n{}", a.log());
    // A blob of its image altered in the store: C refuses it by digest, keeps
    // nothing, and gives it back to the fleet; restored, the next call wakes it.
    let store = s3_client(&s3);
    let manifest_key = ObjectPath::from(format!("{prefix}/parked/{third}.json"));
    let manifest: Value = serde_json::from_slice(
        &store
            .get(&manifest_key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    let ram = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "ram")
        .unwrap_or_else(|| panic!("no ram in {manifest}"));
    let sha256 = field(&ram["chunks"][0], "sha256");
    let blob_key = ObjectPath::from(format!("{prefix}/blobs/sha256/{sha256}"));
    let original = store.get(&blob_key).await.unwrap().bytes().await.unwrap();
    let mut content = zstd::bulk::decompress(&original, 8 << 20).unwrap();
    content[0] ^= 0xff;
    let altered = zstd::bulk::compress(&content, 3).unwrap();
    store.put(&blob_key, altered.into()).await.unwrap();
    let show = format!("/v1/sandboxes/{third}");
    let refused = c.call("GET", &show, Some(&third_token), None).await;
    assert_eq!(refused.status, 502, "{refused:?}\n{}", c.log());
    assert_eq!(refused.json["code"], "store_digest_mismatch", "{refused:?}");
    assert!(
        run_folders(&dir, "c").is_empty(),
        "a refused image left {:?}",
        run_folders(&dir, "c")
    );
    assert_eq!(etcd.get(&format!("/sandbox/owners/{third}")), None);
    assert!(etcd.get(&format!("/sandbox/parked/{third}")).is_some());
    store.put(&blob_key, original.into()).await.unwrap();
    let client = c.agent(&third, &third_token).await.unwrap();
    assert_eq!(sh(&client, "cat /tmp/three").await.trim(), "3");
    drop(client);
    assert_eq!(count(&c.log(), TAKEN_EVENT), 2, "{}", c.log());
    // Listed lost nowhere, parked no more.
    let peers = c.get("/v1/peers").await;
    assert!(peers.json.get("parked").is_none(), "{peers:?}");
    assert!(peers.json.get("lost").is_none(), "{peers:?}");
    release(&c, &third, &third_token).await;

    // A parked sandbox does not need its old node: A killed with -9 after the
    // park, it wakes on C all the same.
    set_drain(&a, false, &json!({})).await;
    let (fifth, fifth_token) = claim(&a).await;
    let client = a.agent(&fifth, &fifth_token).await.unwrap();
    assert_eq!(
        sh(&client, "echo 5 > /tmp/five; echo ok").await.trim(),
        "ok"
    );
    drop(client);
    let drained = set_drain(&a, true, &json!({"hibernate": true})).await;
    assert_eq!(drained["parked"], json!([fifth]), "{drained}\n{}", a.log());
    a.kill9().await;
    let client = c.agent(&fifth, &fifth_token).await.unwrap();
    assert_eq!(sh(&client, "cat /tmp/five").await.trim(), "5");
    drop(client);
    release(&c, &fifth, &fifth_token).await;
    // A again, on its run folder: it brings back nothing it handed over.
    let a = store_node(&dir, "a", None, &s3, &prefix, &etcd, 2).await;
    let listed = a.get("/v1/sandboxes").await;
    assert_eq!(
        listed.json["sandboxes"],
        json!([]),
        "{listed:?}\n{}",
        a.log()
    );

    // The store stopped: a drain cannot park, says why, and the sandbox stays
    // hibernated on A, where it still wakes.
    let (fourth, fourth_token) = claim(&a).await;
    hibernate(&a, &fourth, &fourth_token).await;
    s3.stop();
    let drained = set_drain(&a, true, &json!({})).await;
    assert_eq!(drained["not_parked"][0]["id"], fourth.as_str(), "{drained}");
    let why = field(&drained["not_parked"][0], "error");
    assert!(why.contains("unreachable"), "{why}");
    assert_eq!(etcd.get(&format!("/sandbox/parked/{fourth}")), None);
    let client = a.agent(&fourth, &fourth_token).await.unwrap();
    assert_eq!(sh(&client, "echo still on A").await.trim(), "still on A");
    drop(client);
    release(&a, &fourth, &fourth_token).await;

    assert!(a.terminate(Duration::from_secs(30)).await.success());
    assert!(c.terminate(Duration::from_secs(30)).await.success());
    assert!(
        run_folders(&dir, "c").is_empty(),
        "C kept {:?}",
        run_folders(&dir, "c")
    );
    drop(etcd);
    drop(s3);
    let _ = std::fs::remove_dir_all(&dir);
}
