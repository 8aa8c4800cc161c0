//! A fleet's costs, each next to its baseline in the same run (these machines are
//! noisy: read the ratios). Run: `cargo bench -p sandboxd --bench fleet`.
//!
//! Two `sandboxd` (A and C) on a real etcd and a real S3 server (SeaweedFS) on
//! loopback, booting real microVMs of the `default` template. Prints:
//! - claim latency through placement (a claim sent to A, which may redirect it to
//!   C: the catalogue read, the redirect, the second request) next to a claim A
//!   serves itself (`no_redirect`), interleaved, medians;
//! - a checkpoint's upload rate (data bytes over upload time) after the guest wrote
//!   [`DIRTY_MIB`] MiB of random bytes, next to a plain S3 put of as many random
//!   bytes in objects of the store's blob size and parallelism;
//! - its download rate on C (the first branch there), next to a plain S3 get of the
//!   same objects;
//! - a branch of the checkpoint on the node that took it, on C after the download,
//!   and the first on C (download included), next to a cold boot of the template.
//!
//! Needs QEMU, `vhost-device-vsock`, the `default` template, etcd and SeaweedFS's
//! `weed` (scripts/setup.sh), as the fleet tests.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

#[path = "../tests/support/services.rs"]
mod services;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use sandbox_vmm::launcher::{BootSpec, Launcher, LauncherConfig, TemplateRef};
use sandbox_vmm::node_api::wire::ClaimBody;
use serde_json::{json, Value};
use services::{s3_client, store_node, Etcd, S3};
use support::{test_dir, Daemon, StopAllOnDrop};

/// Interleaved claims per path.
const CLAIMS: usize = 8;

/// What the guest writes before the checkpoint.
const DIRTY_MIB: usize = 64;

/// The store's blob size and parallelism (`sandbox_fleet::store`): the plain S3
/// baseline moves the same bytes in the same shape.
const OBJECT_BYTES: usize = 4 << 20;
const PARALLEL: usize = 4;

/// Branches per measured path.
const BRANCHES: usize = 3;

/// Cold boots.
const COLD_BOOTS: usize = 3;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn mib_per_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / f64::from(1 << 20) / took.as_secs_f64().max(1e-9)
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

async fn release(node: &Daemon, id: &str) {
    let released = node
        .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
        .await;
    assert_eq!(released.status, 200, "{released:?}");
}

/// A checkpoint claim on `node` itself; its time, then released.
async fn branch_on(node: &Daemon, checkpoint: &str) -> Duration {
    let started = Instant::now();
    let child = node
        .post(
            &format!("/v1/checkpoints/{checkpoint}/claim"),
            &json!({"no_redirect": true}),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(child.status, 201, "{child:?}\n{}", node.log());
    release(node, &field(&child.json, "id")).await;
    took
}

/// `bytes` of random-looking data (incompressible, as the guest's).
fn noise(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Puts `objects`, [`PARALLEL`] at a time; how long it took.
async fn put_all(store: &impl ObjectStore, objects: &[(ObjectPath, Vec<u8>)]) -> Duration {
    let started = Instant::now();
    for batch in objects.chunks(PARALLEL) {
        let puts = batch
            .iter()
            .map(|(key, bytes)| store.put(key, bytes.clone().into()));
        for put in futures::future::join_all(puts).await {
            put.unwrap();
        }
    }
    started.elapsed()
}

/// Gets `keys`, [`PARALLEL`] at a time; how long it took and the bytes read.
async fn get_all(store: &impl ObjectStore, keys: &[ObjectPath]) -> (Duration, u64) {
    let started = Instant::now();
    let mut read = 0u64;
    for batch in keys.chunks(PARALLEL) {
        let gets = batch.iter().map(|key| async move {
            store.get(key).await.unwrap().bytes().await.unwrap().len() as u64
        });
        read += futures::future::join_all(gets)
            .await
            .into_iter()
            .sum::<u64>();
    }
    (started.elapsed(), read)
}

/// The last `took_ms=` of the download event in `log`.
fn download_ms(log: &str) -> u64 {
    log.lines()
        .rev()
        .filter(|line| line.contains("checkpoint downloaded from the store"))
        .filter_map(|line| line.split("took_ms=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .find_map(|value| value.parse().ok())
        .expect("no download event in C's log")
}

fn main() {
    if let Some(what) = sandbox_tests::vm::missing() {
        panic!("{what} (benchmarks cannot be skipped)");
    }
    sandbox_tests::suite::block_on(bench());
}

async fn bench() {
    let dir = test_dir("fleet-bench");
    let _stop = [dir.join("a"), dir.join("c")].map(StopAllOnDrop);
    let s3 = S3::start(&dir);
    let etcd = Etcd::start(&dir);
    let prefix = format!("bench-{}", std::process::id());
    let a = store_node(&dir, "a", None, &s3, &prefix, &etcd, 4).await;
    let c = store_node(&dir, "c", None, &s3, &prefix, &etcd, 4).await;
    sandbox_tests::eventually(Duration::from_secs(10), "two live nodes", || async {
        let peers = a.get("/v1/peers").await;
        let alive = peers.json["nodes"]
            .as_array()
            .map(|nodes| nodes.iter().filter(|n| n["alive"] == true).count());
        (alive == Some(2)).then_some(())
    })
    .await;

    // Warm-up (page cache, the template's ready snapshot): not a sample.
    let api = a.api();
    let warm = api.claim(&ClaimBody::default()).await.unwrap();
    api.at(&warm.owner_addr)
        .unwrap()
        .release(&warm.id)
        .await
        .unwrap();

    // Claims: through placement, and served by A itself, interleaved.
    let (mut placed, mut local, mut redirected) = (Vec::new(), Vec::new(), 0);
    for _ in 0..CLAIMS {
        let started = Instant::now();
        let reply = api.claim(&ClaimBody::default()).await.unwrap();
        placed.push(started.elapsed());
        if reply.owner_addr != a.addr {
            redirected += 1;
        }
        api.at(&reply.owner_addr)
            .unwrap()
            .release(&reply.id)
            .await
            .unwrap();
        let body = ClaimBody {
            no_redirect: true,
            ..ClaimBody::default()
        };
        let started = Instant::now();
        let reply = api.claim(&body).await.unwrap();
        local.push(started.elapsed());
        api.release(&reply.id).await.unwrap();
    }
    let (placed, local) = (median(placed), median(local));

    // A checkpoint on A after the guest wrote DIRTY_MIB of random bytes.
    let claimed = a
        .post(
            "/v1/claim",
            &json!({"no_redirect": true, "ttl_seconds": 1800}),
        )
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}");
    let sandbox = field(&claimed.json, "id");
    let client = a
        .agent(&sandbox, &field(&claimed.json, "token"))
        .await
        .unwrap();
    sandbox_tests::sh(
        &client,
        &format!("dd if=/dev/urandom of=/tmp/dirty bs=1M count={DIRTY_MIB} 2>/dev/null && sync"),
    )
    .await;
    drop(client);
    let taken = a
        .post(&format!("/v1/sandboxes/{sandbox}/checkpoint"), &json!({}))
        .await;
    assert_eq!(taken.status, 200, "{taken:?}\n{}", a.log());
    let checkpoint = field(&taken.json["checkpoint"], "id");
    let data_bytes = taken.json["data_bytes"].as_u64().unwrap();
    let sent_bytes = taken.json["uploaded_bytes"].as_u64().unwrap();
    let upload = Duration::from_millis(taken.json["upload_ms"].as_u64().unwrap());
    release(&a, &sandbox).await;

    // Plain S3: as many random bytes, the store's object size and parallelism.
    let store = s3_client(&s3);
    let count = usize::try_from(data_bytes).unwrap().div_ceil(OBJECT_BYTES);
    let objects: Vec<(ObjectPath, Vec<u8>)> = (0..count)
        .map(|n| {
            (
                ObjectPath::from(format!("{prefix}/plain/{n}")),
                noise(OBJECT_BYTES, n as u64 + 1),
            )
        })
        .collect();
    let plain_put = put_all(&store, &objects).await;
    let keys: Vec<ObjectPath> = objects.iter().map(|(key, _)| key.clone()).collect();
    let (plain_get, plain_read) = get_all(&store, &keys).await;
    let plain_bytes = (count * OBJECT_BYTES) as u64;

    // Branches: on A (holds it), the first on C (downloads it), then on C again.
    let mut on_a = Vec::new();
    for _ in 0..BRANCHES {
        on_a.push(branch_on(&a, &checkpoint).await);
    }
    let first_on_c = branch_on(&c, &checkpoint).await;
    let download = Duration::from_millis(download_ms(&c.log()));
    let mut on_c = Vec::new();
    for _ in 0..BRANCHES {
        on_c.push(branch_on(&c, &checkpoint).await);
    }
    let (on_a, on_c) = (median(on_a), median(on_c));

    // Cold boots of the template, to a connected client.
    let scratch = dir.join("cold");
    let mut config = LauncherConfig::from_env().expect("launcher configuration");
    config.run_root = scratch.join("run");
    config.checkpoint_root = scratch.join("checkpoints");
    let launcher = Launcher::new(config);
    let mut cold = Vec::new();
    for _ in 0..COLD_BOOTS {
        let mut spec = BootSpec::new(TemplateRef::parse("default"));
        spec.cold = true;
        let started = Instant::now();
        let vm = launcher.boot(spec).await.unwrap();
        vm.client(&sandbox_vmm::client::ConnectOptions::default())
            .await
            .unwrap();
        cold.push(started.elapsed());
        launcher
            .stop(vm.id(), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let cold = median(cold);

    println!("## fleet (two nodes, etcd and SeaweedFS on loopback)\n");
    println!("| measure | value | next to |");
    println!("| --- | --- | --- |");
    println!(
        "| claim through placement, median of {CLAIMS} ({redirected} redirected to C) | {:.0} ms | {:.2}x a claim A serves itself ({:.0} ms) |",
        ms(placed),
        ms(placed) / ms(local),
        ms(local)
    );
    println!(
        "| checkpoint upload: {:.1} MiB of data ({:.1} MiB sent) in {:.0} ms | {:.1} MiB/s | {:.2}x a plain S3 put of {:.0} MiB ({:.1} MiB/s) |",
        data_bytes as f64 / f64::from(1 << 20),
        sent_bytes as f64 / f64::from(1 << 20),
        ms(upload),
        mib_per_s(data_bytes, upload),
        mib_per_s(data_bytes, upload) / mib_per_s(plain_bytes, plain_put),
        plain_bytes as f64 / f64::from(1 << 20),
        mib_per_s(plain_bytes, plain_put),
    );
    println!(
        "| checkpoint download on C in {:.0} ms | {:.1} MiB/s of data | {:.2}x a plain S3 get of {:.0} MiB ({:.1} MiB/s) |",
        ms(download),
        mib_per_s(data_bytes, download),
        mib_per_s(data_bytes, download) / mib_per_s(plain_read, plain_get),
        plain_read as f64 / f64::from(1 << 20),
        mib_per_s(plain_read, plain_get),
    );
    for (what, took) in [
        (
            format!("branch on A, which holds it (median of {BRANCHES})"),
            on_a,
        ),
        (
            format!("branch on C after its download (median of {BRANCHES})"),
            on_c,
        ),
        (
            "first branch on C, download included".to_owned(),
            first_on_c,
        ),
    ] {
        println!(
            "| {what} | {:.0} ms | {:.2}x a cold boot ({:.0} ms, median of {COLD_BOOTS}) |",
            ms(took),
            ms(took) / ms(cold),
            ms(cold)
        );
    }

    assert!(a.terminate(Duration::from_secs(60)).await.success());
    assert!(c.terminate(Duration::from_secs(60)).await.success());
    drop(etcd);
    drop(s3);
    let _ = std::fs::remove_dir_all(&dir);
}
