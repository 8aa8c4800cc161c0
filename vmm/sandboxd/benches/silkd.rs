//! Seed 000's SDK through the silkd upgrade next to this project's own client
//! through the node, in the same run, on the same sandbox (these machines are
//! noisy: read the ratios). Run: `cargo bench -p sandboxd --bench silkd`.
//!
//! Prints:
//! - an exec of `true`: the SDK (`Sandbox.exec`, one keep-alive connection, frames
//!   translated by `sandboxd::silkd`) and our client (`Client::exec` over the
//!   `sandbox-agent` upgrade); medians and p90s over [`ROUND_TRIPS`] calls;
//! - 100 MiB: the SDK's `pull` (a tar stream made by the guest's tar) and `push`
//!   (a tar upload, staged and extracted in the guest) next to our `get` / `put` of
//!   the same file; seconds and MiB/s.
//!
//! Needs QEMU, `vhost-device-vsock`, the `default` template and the SDK venv
//! (`scripts/setup.sh`: `target/silkd-python`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use serde_json::{json, Value};
use support::{test_dir, Daemon, StopAllOnDrop};

/// Timed execs per client.
const ROUND_TRIPS: usize = 100;

/// The bulk file: 100 MiB.
const BULK_BYTES: usize = 100 * 1024 * 1024;

/// Where the bulk file lives in the guest (on its disk, not a tmpfs).
const BULK_PATH: &str = "/root/bulk.bin";

fn exec(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Argv(argv.iter().map(|&a| a.to_owned()).collect())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib_per_s(seconds: f64) -> f64 {
    (BULK_BYTES as f64 / (1024.0 * 1024.0)) / seconds
}

fn main() {
    if let Some(what) = sandbox_tests::vm::missing() {
        panic!("{what} (benchmarks cannot be skipped)");
    }
    sandbox_tests::suite::block_on(bench());
}

async fn bench() {
    let python =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/silkd-python/bin/python");
    assert!(
        python.exists(),
        "no SDK venv at {}: run scripts/setup.sh",
        python.display()
    );
    let dir = test_dir("silkd-bench");
    let _cleanup = StopAllOnDrop(dir.clone());
    let daemon = Daemon::start(&dir, &["--pool", "0", "--max-sandboxes", "2"], &[]).await;
    let claimed = daemon
        .post("/v1/claim", &json!({"ttl_seconds": 1800}))
        .await;
    assert_eq!(claimed.status, 201, "{claimed:?}");
    let id = claimed.json["id"].as_str().unwrap().to_owned();
    let token = claimed.json["token"].as_str().unwrap().to_owned();
    let ours = daemon.agent(&id, &token).await.unwrap();
    let made = ours
        .exec(exec(&[
            "sh",
            "-c",
            &format!("head -c {BULK_BYTES} /dev/urandom > {BULK_PATH}"),
        ]))
        .await
        .unwrap();
    assert_eq!(made.exit.map(|e| e.shell_code()), Some(0), "{made:?}");

    // The SDK first (its own process), then ours, on the same sandbox.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/python/silkd_bench.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .args([
            &daemon.addr,
            &id,
            &token,
            &ROUND_TRIPS.to_string(),
            BULK_PATH,
        ])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the SDK bench failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    let sdk: Value = serde_json::from_slice(&output.stdout).unwrap();

    ours.exec(exec(&["true"])).await.unwrap();
    let mut samples: Vec<Duration> = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let started = Instant::now();
        ours.exec(exec(&["true"])).await.unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    let (median, p90) = (samples[ROUND_TRIPS / 2], samples[ROUND_TRIPS * 9 / 10]);
    let started = Instant::now();
    let mut bulk = Vec::with_capacity(BULK_BYTES);
    ours.get(BULK_PATH, &mut bulk).await.unwrap();
    let get_s = started.elapsed().as_secs_f64();
    assert_eq!(bulk.len(), BULK_BYTES);
    let started = Instant::now();
    ours.put("/root/put-bulk.bin", None, &bulk[..])
        .await
        .unwrap();
    let put_s = started.elapsed().as_secs_f64();

    let f = |key: &str| sdk[key].as_f64().unwrap();
    println!("exec true, {ROUND_TRIPS} calls each, one sandbox through sandboxd:");
    println!(
        "  seed 000 SDK (silkd)      median {:7.2} ms  p90 {:7.2} ms",
        f("exec_true_median_ms"),
        f("exec_true_p90_ms")
    );
    println!(
        "  our client (agent proto)  median {:7.2} ms  p90 {:7.2} ms  (SDK/ours {:.2}x)",
        ms(median),
        ms(p90),
        f("exec_true_median_ms") / ms(median)
    );
    println!("100 MiB of random bytes:");
    println!(
        "  SDK pull (tar) {:6.2} s {:6.1} MiB/s | our get {:6.2} s {:6.1} MiB/s",
        f("pull_s"),
        mib_per_s(f("pull_s")),
        get_s,
        mib_per_s(get_s)
    );
    println!(
        "  SDK push (tar) {:6.2} s {:6.1} MiB/s | our put {:6.2} s {:6.1} MiB/s",
        f("push_s"),
        mib_per_s(f("push_s")),
        put_s,
        mib_per_s(put_s)
    );
    let released = daemon
        .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
        .await;
    assert_eq!(released.status, 200, "{released:?}");
}
