//! Checkpoints in an object store, on real QEMU microVMs, a real S3 server
//! (SeaweedFS's `weed mini`) and a real etcd on loopback, and `sandboxd` nodes with
//! their own homes:
//!
//! - a checkpoint taken on A (after writing a file and spawning a process) is
//!   uploaded before the call answers, listed as stored, and recorded in etcd;
//! - C, whose home holds no template and no checkpoint, lists it as remote, and two
//!   claims of it at once download it once (one download log event) and both
//!   children have A's file and A's spawned process;
//! - a blob altered in the store is refused by digest on a third node, which keeps
//!   nothing of it;
//! - a delete on C removes it fleet-wide (the store's manifest and etcd's record);
//! - A publishes its `default` template; C claims it twice at once and downloads
//!   it once; a template promoted on A is published by the promote and claimed on
//!   C with A's file; a delete on C removes it from the store;
//! - with the S3 server stopped, a checkpoint on A fails `store_unreachable` (the
//!   checkpoint stays local), the listing says why, and execs on A go on.
//!
//! Needs what `sandbox_tests::vm::gate` checks, `etcd`/`etcdctl` and `weed` (in
//! `target/seaweedfs`): `scripts/setup.sh` installs them. `SANDBOX_SKIP_VM_TESTS=1`
//! marks the test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

#[path = "support/services.rs"]
mod services;
mod support;

use std::time::Instant;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt as _;
use sandbox_protocol::{Command, ProcessSpec};
use sandbox_tests::sh;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use services::{s3_client, store_node, Etcd, S3};
use support::{test_dir, Daemon, StopAllOnDrop};

/// What a download logs (`sandboxd::store::DOWNLOADED_EVENT`).
const DOWNLOADED_EVENT: &str = "checkpoint downloaded from the store";

/// What a template download logs (`sandboxd::store::TEMPLATE_DOWNLOADED_EVENT`).
const TEMPLATE_DOWNLOADED_EVENT: &str = "template downloaded from the store";

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "a_checkpoint_in_the_store_branches_on_another_node_downloaded_once_and_verified",
        run: || block_on(fleet_store()),
    }])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

fn mib_per_s(bytes: u64, millis: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / (millis.max(1) as f64 / 1000.0)
}

async fn release(daemon: &Daemon, id: &str) {
    let released = daemon
        .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
        .await;
    assert_eq!(released.status, 200, "{released:?}");
}

async fn fleet_store() {
    let dir = test_dir("fleet-store");
    let _cleanup_a = StopAllOnDrop(dir.join("a"));
    let _cleanup_c = StopAllOnDrop(dir.join("c"));
    let mut s3 = S3::start(&dir);
    let etcd = Etcd::start(&dir);
    let prefix = format!("fleet-{}", std::process::id());
    let a = store_node(&dir, "a", None, &s3, &prefix, &etcd, 2).await;
    let c = store_node(&dir, "c", Some(&dir.join("c-home")), &s3, &prefix, &etcd, 2).await;

    // On A: a sandbox with a file written and a process spawned, checkpointed.
    let claimed = a
        .post(
            "/v1/claim",
            &json!({"ttl_seconds": 600, "no_redirect": true}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", a.log());
    let sandbox = field(&claimed.json, "id");
    let client = a
        .agent(&sandbox, &field(&claimed.json, "token"))
        .await
        .unwrap();
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
    let started = Instant::now();
    let taken = a
        .post(&format!("/v1/sandboxes/{sandbox}/checkpoint"), &json!({}))
        .await;
    let call_ms = started.elapsed().as_millis();
    assert_eq!(taken.status, 200, "{taken:?}\n{}", a.log());
    let checkpoint = field(&taken.json["checkpoint"], "id");
    assert_eq!(taken.json["checkpoint"]["stored"], true, "{taken:?}");
    let data_bytes = taken.json["data_bytes"].as_u64().unwrap();
    let sent_bytes = taken.json["uploaded_bytes"].as_u64().unwrap();
    let upload_ms = taken.json["upload_ms"].as_u64().unwrap();
    eprintln!(
        "checkpoint call {call_ms} ms (pause {} ms, capture {} ms, upload {upload_ms} ms): \
         {:.1} MiB of data, {:.1} MiB sent compressed, {:.1} MiB/s of data",
        taken.json["pause_ms"],
        taken.json["took_ms"],
        data_bytes as f64 / (1 << 20) as f64,
        sent_bytes as f64 / (1 << 20) as f64,
        mib_per_s(data_bytes, upload_ms),
    );
    // The RAM image's holes were not uploaded: the data is far below its size.
    let ram_size = std::fs::metadata(dir.join("a/checkpoints").join(&checkpoint).join("ram"))
        .unwrap()
        .len();
    assert!(
        data_bytes < ram_size / 2,
        "{data_bytes} bytes of data for a RAM image of {ram_size}"
    );
    let record = etcd
        .get(&format!("/sandbox/checkpoints/{checkpoint}"))
        .expect("no etcd record of the stored checkpoint");
    let record: Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["node_id"], "a", "{record}");
    assert_eq!(
        record["manifest_key"],
        format!("{prefix}/checkpoints/{checkpoint}.json"),
        "{record}"
    );
    let listed = a.get("/v1/checkpoints").await;
    let row = &listed.json["checkpoints"][0];
    assert_eq!(
        (row["id"].clone(), row["stored"].clone()),
        (json!(checkpoint), json!(true))
    );
    drop(client);
    // At most two VMs at once on this machine: A's goes before C's two.
    release(&a, &sandbox).await;

    // C lists it as remote; two claims at once download it once.
    let remote = c.get("/v1/checkpoints").await;
    let row = remote.json["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["id"] == checkpoint.as_str())
        .unwrap_or_else(|| panic!("C does not list {checkpoint}: {remote:?}"))
        .clone();
    assert_eq!(
        (row["stored"].clone(), row["remote"].clone()),
        (json!(true), json!(true))
    );
    let started = Instant::now();
    let path = format!("/v1/checkpoints/{checkpoint}/claim");
    // On C itself: placement would send the claims to A, which holds it.
    let here = json!({"no_redirect": true});
    let (first, second) = tokio::join!(c.post(&path, &here), c.post(&path, &here));
    eprintln!(
        "two claims on C of a checkpoint it did not hold: {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(first.status, 201, "{first:?}\n{}", c.log());
    assert_eq!(second.status, 201, "{second:?}\n{}", c.log());
    let log = c.log();
    let downloads: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(DOWNLOADED_EVENT))
        .collect();
    assert_eq!(downloads.len(), 1, "downloaded more than once:\n{log}");
    eprintln!("C: {}", downloads[0]);
    for child in [&first.json, &second.json] {
        assert_eq!(child["from_checkpoint"], checkpoint.as_str(), "{child}");
        let id = field(child, "id");
        let client = c.agent(&id, &field(child, "token")).await.unwrap();
        assert_eq!(
            client.read_file("/tmp/marker").await.unwrap(),
            b"written on A"
        );
        let processes = client.ps().await.unwrap();
        assert!(
            processes
                .iter()
                .any(|p| p.pid == spawned && p.argv.iter().any(|a| a.contains("sleep 3600"))),
            "A's spawned process {spawned:?} is not in the child's table: {processes:?}"
        );
        assert_eq!(
            sh(
                &client,
                &format!("cat /proc/{}/cmdline | tr '\\0' ' '", spawned.0)
            )
            .await
            .trim(),
            "sleep 3600",
            "the spawned process runs in the child"
        );
        drop(client);
        release(&c, &id).await;
    }

    // A blob altered in the store (valid zstd, other bytes): a node that downloads
    // the checkpoint refuses it by digest and keeps nothing.
    let store = s3_client(&s3);
    let manifest_key = ObjectPath::from(format!("{prefix}/checkpoints/{checkpoint}.json"));
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
        .unwrap();
    let sha256 = field(&ram["chunks"][0], "sha256");
    let blob_key = ObjectPath::from(format!("{prefix}/blobs/sha256/{sha256}"));
    let original = store.get(&blob_key).await.unwrap().bytes().await.unwrap();
    let mut content = zstd::bulk::decompress(&original, 8 << 20).unwrap();
    content[0] ^= 0xff;
    let altered = zstd::bulk::compress(&content, 3).unwrap();
    store.put(&blob_key, altered.into()).await.unwrap();
    let d = store_node(&dir, "d", Some(&dir.join("d-home")), &s3, &prefix, &etcd, 2).await;
    let refused = d.post(&path, &here).await;
    assert_eq!(refused.status, 502, "{refused:?}\n{}", d.log());
    assert_eq!(refused.json["code"], "store_digest_mismatch", "{refused:?}");
    let message = field(&refused.json, "error");
    assert!(
        message.contains(&sha256) && message.contains("digest") && message.contains("nothing"),
        "{message}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.join("d/checkpoints"))
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a refused download left {left:?}");
    store.put(&blob_key, original.into()).await.unwrap();
    assert!(d
        .terminate(std::time::Duration::from_secs(30))
        .await
        .success());

    // A delete on C is fleet-wide: out of the store and etcd, off C.
    let deleted = c
        .call(
            "DELETE",
            &format!("/v1/checkpoints/{checkpoint}"),
            Some(&c.token),
            None,
        )
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}\n{}", c.log());
    assert!(
        store.head(&manifest_key).await.is_err(),
        "the manifest is still in the store"
    );
    assert_eq!(
        etcd.get(&format!("/sandbox/checkpoints/{checkpoint}")),
        None
    );
    assert!(!dir.join("c/checkpoints").join(&checkpoint).exists());
    let listed = a.get("/v1/checkpoints").await;
    assert!(
        listed.json["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|row| row["id"] != checkpoint.as_str() || row["stored"].is_null()),
        "A still lists it as stored: {listed:?}"
    );

    // Templates: A publishes its built `default`; C, whose home holds none, claims
    // it twice at once and downloads it once. A promoted template is published by
    // its promote, and C's claim of it has the promoted VM's file. A delete on C
    // takes it out of the store.
    let published = a.post("/v1/templates/default/publish", &json!({})).await;
    assert_eq!(published.status, 200, "{published:?}\n{}", a.log());
    assert!(
        published.json["data_bytes"].as_u64().unwrap() > 0,
        "{published:?}"
    );
    let claim_default = json!({"template": "default", "ttl_seconds": 600, "no_redirect": true});
    let (first, second) = tokio::join!(
        c.post("/v1/claim", &claim_default),
        c.post("/v1/claim", &claim_default)
    );
    assert_eq!(first.status, 201, "{first:?}\n{}", c.log());
    assert_eq!(second.status, 201, "{second:?}\n{}", c.log());
    assert_eq!(
        c.log()
            .lines()
            .filter(|l| l.contains(TEMPLATE_DOWNLOADED_EVENT))
            .count(),
        1,
        "the template was downloaded more than once:\n{}",
        c.log()
    );
    for claimed in [&first.json, &second.json] {
        let id = field(claimed, "id");
        let client = c.agent(&id, &field(claimed, "token")).await.unwrap();
        assert_eq!(
            sh(&client, "echo from the store").await.trim(),
            "from the store"
        );
        drop(client);
        release(&c, &id).await;
    }
    let claimed = a
        .post(
            "/v1/claim",
            &json!({"ttl_seconds": 600, "no_redirect": true}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", a.log());
    let source = field(&claimed.json, "id");
    let client = a
        .agent(&source, &field(&claimed.json, "token"))
        .await
        .unwrap();
    client
        .write_file("/tmp/promoted", b"promoted on A".to_vec(), None)
        .await
        .unwrap();
    drop(client);
    let promoted = a
        .post(
            &format!("/v1/sandboxes/{source}/promote"),
            &json!({"template": "promoted-on-a"}),
        )
        .await;
    assert_eq!(promoted.status, 200, "{promoted:?}\n{}", a.log());
    assert_eq!(promoted.json["stored"], true, "{promoted:?}");
    release(&a, &source).await;
    let claimed = c
        .post(
            "/v1/claim",
            &json!({"template": "promoted-on-a", "ttl_seconds": 600, "no_redirect": true}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", c.log());
    let id = field(&claimed.json, "id");
    let client = c.agent(&id, &field(&claimed.json, "token")).await.unwrap();
    assert_eq!(
        client.read_file("/tmp/promoted").await.unwrap(),
        b"promoted on A"
    );
    drop(client);
    release(&c, &id).await;
    let template_key = ObjectPath::from(format!("{prefix}/templates/promoted-on-a.json"));
    assert!(store.head(&template_key).await.is_ok());
    let deleted = c
        .call(
            "DELETE",
            "/v1/templates?template=promoted-on-a",
            Some(&c.token),
            None,
        )
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}\n{}", c.log());
    assert!(
        store.head(&template_key).await.is_err(),
        "the template is still in the store"
    );

    // The collector: every blob is named or young, so nothing goes; a grace under
    // an hour is refused.
    let gc = c.post("/v1/store/gc", &json!({"dry_run": true})).await;
    assert_eq!(gc.status, 200, "{gc:?}\n{}", c.log());
    assert!(gc.json["manifests"].as_u64().unwrap() >= 1, "{gc:?}");
    assert!(gc.json["referenced"].as_u64().unwrap() >= 1, "{gc:?}");
    assert_eq!(gc.json["deleted"], 0, "{gc:?}");
    let refused = c.post("/v1/store/gc", &json!({"grace_seconds": 10})).await;
    assert_eq!(refused.status, 400, "{refused:?}");

    // The store stopped: a checkpoint on A fails saying so and stays local; the
    // listing says why; execs on A go on.
    let claimed = a
        .post(
            "/v1/claim",
            &json!({"ttl_seconds": 600, "no_redirect": true}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", a.log());
    let sandbox = field(&claimed.json, "id");
    let client = a
        .agent(&sandbox, &field(&claimed.json, "token"))
        .await
        .unwrap();
    s3.stop();
    let started = Instant::now();
    let failed = a
        .post(&format!("/v1/sandboxes/{sandbox}/checkpoint"), &json!({}))
        .await;
    eprintln!(
        "checkpoint with the store down failed after {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(failed.status, 503, "{failed:?}\n{}", a.log());
    assert_eq!(failed.json["code"], "store_unreachable", "{failed:?}");
    let message = field(&failed.json, "error");
    assert!(
        message.contains("is unreachable") && message.contains("kept on this node"),
        "{message}"
    );
    assert_eq!(sh(&client, "echo still here").await.trim(), "still here");
    let listed = a.get("/v1/checkpoints").await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert!(
        listed.json["store_error"]
            .as_str()
            .is_some_and(|e| e.contains("unreachable")),
        "{listed:?}"
    );
    drop(client);
    release(&a, &sandbox).await;
    assert!(a
        .terminate(std::time::Duration::from_secs(30))
        .await
        .success());
    assert!(c
        .terminate(std::time::Duration::from_secs(30))
        .await
        .success());
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
