//! Pulling a ~100 MB image from a real registry on loopback (Debian's
//! `docker-registry`, htpasswd auth; the image is the cached Debian bootstrap of
//! `sandbox-rootfs build --base debian` as one gzip layer, pushed by `skopeo`):
//!
//! - `skopeo copy` of the image to a local folder: the baseline (download and
//!   digest checks only);
//! - `sandbox-rootfs build --base oci://…` into an empty layer cache: pull, verify,
//!   unpack, initramfs/disk, template;
//! - the same build again: a digest cache hit (nothing rewritten);
//! - a build with other options from the cached layers (no download).
//!
//! Each is run [`RUNS`] times; medians are printed with their ratio to skopeo's.
//! Claims are measured by sandboxd's `claim_by_reference` test (a claim that pulls
//! and builds vs one of the built template).
//!
//! Needs `docker-registry`, `skopeo`, `htpasswd`, the kernel in
//! `$SANDBOX_HOME/cache/kernel` (any earlier `sandbox-rootfs build`) and a Debian
//! bootstrap in `$SANDBOX_HOME/cache/debian` (`sandbox-rootfs build --name deb --base
//! debian`): a missing one fails, saying so.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

#[path = "../tests/support/registry.rs"]
mod support;
use support::{OciLayout, Registry, PASSWORD, USER};

/// Runs of each measure.
const RUNS: usize = 3;

fn main() {
    let home = sandbox_rootfs::SandboxHome::from_env().unwrap();
    let cache = home.root().join("cache");
    let kernel = cache.join("kernel");
    assert!(
        kernel.is_dir(),
        "no kernel in {}: run `sandbox-rootfs build` once",
        kernel.display()
    );
    let bootstrap = smallest_tar(&cache.join("debian")).unwrap_or_else(|| {
        panic!(
            "no Debian bootstrap in {}/debian: run `sandbox-rootfs build --name deb --base debian` once",
            cache.display()
        )
    });
    let layer = std::fs::read(&bootstrap).unwrap();
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let image = layout.image(
        std::slice::from_ref(&layer),
        json!({"Env": ["PATH=/usr/bin:/bin"]}),
        "amd64",
        true,
    );
    registry.push(layout.tag(image, "v1"), "v1", "bench/debian");
    let reference = format!("oci://{}/bench/debian:v1", registry.host);
    let pushed = registry.blob_file(&registry.served_digest("bench/debian:v1"));
    eprintln!(
        "image: {} ({:.0} MiB unpacked tar, manifest {})",
        bootstrap.display(),
        layer.len() as f64 / f64::from(1 << 20),
        pushed.display()
    );

    let mut skopeo = Vec::new();
    let mut fresh = Vec::new();
    let mut hit = Vec::new();
    let mut cached = Vec::new();
    for run in 0..RUNS {
        let out = tempfile::tempdir().unwrap();
        let began = Instant::now();
        let copied = Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--src-creds",
            ])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg(format!("docker://{}/bench/debian:v1", registry.host))
            .arg(format!("dir:{}", out.path().display()))
            .output()
            .unwrap();
        assert!(
            copied.status.success(),
            "{}",
            String::from_utf8_lossy(&copied.stderr)
        );
        skopeo.push(began.elapsed());
        eprintln!(
            "run {run}: skopeo copy {:.2} s",
            began.elapsed().as_secs_f64()
        );

        // A home of its own (empty layer cache) sharing the kernel download.
        let bench_home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(bench_home.path().join("cache")).unwrap();
        std::os::unix::fs::symlink(&kernel, bench_home.path().join("cache/kernel")).unwrap();
        let build = |extra: &[&str]| {
            let began = Instant::now();
            let output = Command::new(env!("CARGO_BIN_EXE_sandbox-rootfs"))
                .args(["build", "--name", "bench", "--base", &reference])
                .args(["--insecure-registry", &registry.host])
                .arg("--registry-auth")
                .arg(format!("{USER}:{PASSWORD}"))
                .args(extra)
                .env("SANDBOX_HOME", bench_home.path())
                .env("NO_COLOR", "1")
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(
                output.status.success(),
                "build {extra:?} (run {run}): {stderr}"
            );
            (began.elapsed(), stderr)
        };
        let (took, _) = build(&[]);
        fresh.push(took);
        eprintln!("run {run}: pull + build {:.2} s", took.as_secs_f64());
        let (took, stderr) = build(&[]);
        assert!(stderr.contains("up to date"), "{stderr}");
        hit.push(took);
        eprintln!("run {run}: cache hit {:.2} s", took.as_secs_f64());
        let (took, stderr) = build(&["--size", "medium"]);
        assert!(!stderr.contains("up to date"), "{stderr}");
        cached.push(took);
        eprintln!("run {run}: from cached layers {:.2} s", took.as_secs_f64());
    }
    let base = median(&mut skopeo);
    println!("| measure (median of {RUNS}) | time | vs skopeo copy |");
    println!("| --- | --- | --- |");
    for (name, times) in [
        ("skopeo copy to a local dir", &mut skopeo),
        ("pull + build, empty layer cache", &mut fresh),
        ("build again, same digest (cache hit)", &mut hit),
        ("build with other options from cached layers", &mut cached),
    ] {
        let value = median(times);
        println!(
            "| {name} | {:.2} s | {:.2}x |",
            value.as_secs_f64(),
            value.as_secs_f64() / base.as_secs_f64()
        );
    }
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The smallest complete bootstrap tarball in `dir` (partial ones start with '.').
fn smallest_tar(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.') && name.ends_with(".tar")
        })
        .min_by_key(|e| e.metadata().map(|m| m.len()).unwrap_or(u64::MAX))
        .map(|e| e.path())
}
