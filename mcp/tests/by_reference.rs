//! `create_sandbox` with an image reference the server does not hold, on real QEMU
//! microVMs and a real registry on loopback (Debian's `docker-registry` with
//! htpasswd auth, the credentials in docker's config), driven by rmcp's MCP client:
//! two calls at once build the template once (one "building a template" log event)
//! and both boot it, with progress notifications naming the pull and the build; a
//! registry the server does not allow (`--allow-registry`) is refused with the
//! command that builds the template.
//!
//! Needs what `sandbox_tests::vm::gate` checks, and `docker-registry`, `skopeo` and
//! `htpasswd` (`scripts/setup.sh` installs them); `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored (this target runs on `libtest-mimic`).

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

/// A registry on loopback and OCI layouts to push to it, shared with the builder's
/// own registry tests.
#[path = "../../rootfs/tests/support/registry.rs"]
mod registry;

use std::path::PathBuf;
use std::time::Duration;

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::json;
use support::McpServer;

/// The log event of each claim-time build (`sandbox_engine::image_build`).
const BUILD_EVENT: &str = "building a template from a registry image";

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "create_sandbox_with_an_image_reference_builds_it_once_with_progress",
        run: || block_on(create_by_reference()),
    }])
}

async fn create_by_reference() {
    if !sandbox_tests::vm::require("mcp::by_reference") {
        return;
    }
    let run = support::run_dir("byref");
    let run_text = run.display().to_string();
    let registry = registry::Registry::start();
    let mut layout = registry::OciLayout::new();
    let image = layout.image(
        &[registry::busybox_layer("created by reference\n")],
        json!({"Env": ["PATH=/bin"]}),
        "amd64",
        true,
    );
    let repo = format!("test/mcpref{}", std::process::id());
    registry.push(layout.tag(image, "v1"), "v1", &repo);
    let reference = format!("oci://{}/{repo}:v1", registry.host);
    let docker = run.join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let auth = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            registry::USER,
            registry::PASSWORD
        ))
    };
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {registry.host.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let log = PathBuf::from(format!("{run_text}.log"));
    let server = McpServer::start(
        &[
            "--pool",
            "0",
            "--max-sandboxes",
            "2",
            "--allow-registry",
            &registry.host,
            "--insecure-registry",
            &registry.host,
        ],
        &[
            ("SANDBOX_RUN_DIR", &run_text),
            ("DOCKER_CONFIG", docker.to_str().unwrap()),
        ],
        &log,
    )
    .await;

    let refused = server
        .err(
            "create_sandbox",
            json!({"template": "oci://127.0.0.1:1/other/image:v1"}),
        )
        .await;
    assert!(
        refused.contains("sandbox-rootfs build --name oci-127.0.0.1-1-other-image-v1-")
            && refused.contains("--allow-registry"),
        "{refused}"
    );

    let claim = || server.ok("create_sandbox", json!({"template": reference}));
    let (first, second) = tokio::join!(claim(), claim());
    let server_log = server.log();
    assert_eq!(server_log.matches(BUILD_EVENT).count(), 1, "{server_log}");
    let messages: Vec<String> = server
        .progress_so_far()
        .into_iter()
        .filter_map(|p| p.message)
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("pulling") || m.contains("building oci-")),
        "no build progress: {messages:?}"
    );
    for claimed in [&first, &second] {
        let id = claimed["sandbox_id"].as_str().unwrap();
        assert!(
            claimed["template"].as_str().unwrap().starts_with("oci-"),
            "{claimed}"
        );
        let out = server
            .ok(
                "exec",
                json!({"sandbox_id": id, "command": "cat /etc/marker"}),
            )
            .await;
        assert_eq!(out["stdout"], "created by reference\n", "{out}");
        server.ok("release", json!({"sandbox_id": id})).await;
    }
    let template = first["template"].as_str().unwrap().to_owned();
    server.disconnect(Duration::from_secs(60)).await;
    let templates = sandbox_rootfs::SandboxHome::from_env().unwrap().templates();
    std::fs::remove_dir_all(templates.join(template)).unwrap();
}
