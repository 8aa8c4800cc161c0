//! `POST /v1/claim` naming an image reference the node does not hold, on real QEMU
//! microVMs and a real registry on loopback (Debian's `docker-registry`, with
//! htpasswd auth; credentials from docker's config, as an operator would give
//! them): a registry not named by `--allow-registry` is refused with the command
//! that builds the template; two claims at once of an allowed reference build its
//! template once (one "building a template" log event) and both boot it; a third
//! claim finds the template built. The claims' timings are printed (a claim that
//! pulls and builds against one of a built template).
//!
//! Needs what `sandbox_tests::vm::gate` checks, and `docker-registry`, `skopeo` and
//! `htpasswd` (`scripts/setup.sh` installs them); `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

/// A registry on loopback and OCI layouts to push to it, shared with the builder's
/// own registry tests.
#[path = "../../../rootfs/tests/support/registry.rs"]
mod registry;

use std::time::Instant;

use sandbox_tests::sh;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use support::{test_dir, Daemon, StopAllOnDrop};

/// The log event of each claim-time build (`sandbox_engine::image_build`).
const BUILD_EVENT: &str = "building a template from a registry image";

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "claims_by_image_reference_build_once_from_an_allowed_registry",
        run: || block_on(claims_by_reference()),
    }])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

/// A busybox root whose `/etc/marker` says `marker`.
fn image_layer(marker: &str) -> Vec<u8> {
    registry::busybox_layer(marker)
}

async fn claims_by_reference() {
    let dir = test_dir("byref");
    let _cleanup = StopAllOnDrop(dir.clone());
    let registry = registry::Registry::start();
    let mut layout = registry::OciLayout::new();
    let image = layout.image(
        &[image_layer("claimed by reference\n")],
        json!({"Env": ["PATH=/bin"], "WorkingDir": "/"}),
        "amd64",
        true,
    );
    let repo = format!("test/byref{}", std::process::id());
    registry.push(layout.tag(image, "v1"), "v1", &repo);
    let reference = format!("oci://{}/{repo}:v1", registry.host);
    // The builder reads the registry's credentials from docker's config, as it would
    // on an operator's node.
    let docker = dir.join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let auth = base64_encode(format!("{}:{}", registry::USER, registry::PASSWORD).as_bytes());
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {registry.host.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let daemon = Daemon::start(
        &dir,
        &[
            "--pool",
            "0",
            "--max-sandboxes",
            "3",
            "--allow-registry",
            &registry.host,
            "--insecure-registry",
            &registry.host,
        ],
        &[("DOCKER_CONFIG", docker.to_str().unwrap())],
    )
    .await;

    // A registry the operator did not allow: refused, the command named, nothing built.
    let elsewhere = "oci://127.0.0.1:1/other/image:v1";
    let refused = daemon
        .post("/v1/claim", &json!({"template": elsewhere}))
        .await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert_eq!(
        refused.json["code"], "registry_not_allowed",
        "{}",
        refused.text
    );
    let message = refused.text.clone();
    assert!(
        message.contains("sandbox-rootfs build --name oci-127.0.0.1-1-other-image-v1-")
            && message.contains(&format!("--base {elsewhere}")),
        "{message}"
    );
    let unparsable = daemon
        .post("/v1/claim", &json!({"template": "oci://Bad/Name:v1"}))
        .await;
    assert_eq!(unparsable.status, 400, "{}", unparsable.text);

    // Two claims at once: one build, two sandboxes of the template it made.
    let started = Instant::now();
    let claim = || async {
        let began = Instant::now();
        let answer = daemon
            .post(
                "/v1/claim",
                &json!({"template": reference, "ttl_seconds": 600}),
            )
            .await;
        (answer, began.elapsed())
    };
    let ((first, first_took), (second, second_took)) = tokio::join!(claim(), claim());
    let log = daemon.log();
    for answer in [&first, &second] {
        assert_eq!(answer.status, 201, "{}\n{log}", answer.text);
    }
    assert_eq!(log.matches(BUILD_EVENT).count(), 1, "{log}");
    assert!(
        log.contains("claim-time build"),
        "no progress logged:\n{log}"
    );
    eprintln!(
        "BENCH claim of a fresh reference (pull + build + boot): {:.1} s and {:.1} s \
         (both claims, {:.1} s in all)",
        first_took.as_secs_f64(),
        second_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let info = daemon.get("/v1/info").await;
    let templates = info.json["templates"].to_string();
    let name = format!(
        "oci-{}-{}",
        registry.host.replace(':', "-"),
        format!("{repo}-v1").replace('/', "-")
    );
    assert!(templates.contains(&name), "{templates}");
    for answer in [&first, &second] {
        let id = field(&answer.json, "id");
        let client = daemon
            .agent(&id, &field(&answer.json, "token"))
            .await
            .unwrap();
        assert_eq!(
            sh(&client, "cat /etc/marker").await,
            "claimed by reference\n"
        );
        let released = daemon
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await;
        assert_eq!(released.status / 100, 2, "{}", released.text);
    }

    // The template is held now: a claim of the same reference boots it, no build.
    let began = Instant::now();
    let third = daemon
        .post(
            "/v1/claim",
            &json!({"template": reference, "ttl_seconds": 600}),
        )
        .await;
    let took = began.elapsed();
    assert_eq!(third.status, 201, "{}", third.text);
    assert_eq!(daemon.log().matches(BUILD_EVENT).count(), 1);
    eprintln!(
        "BENCH claim of a built template (boot only): {:.1} s",
        took.as_secs_f64()
    );
    let id = field(&third.json, "id");
    daemon
        .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
        .await;
    let templates_root = sandbox_rootfs::SandboxHome::from_env().unwrap().templates();
    for entry in std::fs::read_dir(&templates_root).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with(&name) {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}
