//! The `python` template (Debian with CPython and pip, a warm `default` session),
//! booted once in a real microVM and shared by every trial of this target:
//! - every `eval` and `wait` scenario of `sandbox_tests::scenarios`, against a guest
//!   that has `python3` (the default template has none, so over the suite's microVM
//!   transport the Python parts stop at "eval says python3 is missing");
//! - what only this template has: `python3` and `pip` themselves, `git`, `curl`, the
//!   CA certificates and `pytest`; the warm session,
//!   there when the sandbox is claimed and reseeded in each child of a fork; and a
//!   `python3 -m http.server` waited for by its banner, then served from.
//!
//! Trials are named `microvm-python::AREA::NAME`. The gate is the microVM tests' one
//! plus the template: without it every trial fails with the command that builds it
//! (`scripts/test.sh` runs it); `SANDBOX_SKIP_VM_TESTS=1` marks them ignored.

// Scenarios are tests: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::{ImageConfig, Language, ProcessKind, ProcessState, Stream};
use sandbox_tests::scenarios::eval::{clean, python};
use sandbox_tests::scenarios::{self, Scenario};
use sandbox_tests::suite::TransportKind;
use sandbox_tests::transport::{Target, Transport, VmTransport};
use sandbox_tests::vm::{python_gate, python_template, READY_TIMEOUT_SECS};
use sandbox_tests::{argv, sh, within};
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::snapshot::BranchSpec;

/// The one transport of this target: a microVM of the python template.
const PYTHON_VM: &[TransportKind] = &[TransportKind {
    name: "microvm-python",
    gate: python_gate,
    start: || {
        Box::pin(async {
            Arc::new(VmTransport::boot_template(python_template()).await) as Arc<dyn Transport>
        })
    },
}];

/// The session the template names for the agent to start at boot, and what its
/// setup code imports.
const WARM_SESSION: &str = "default";
const WARM_IMPORTS: &str = "['json', 'os', 'sys']";

/// The port the HTTP server scenario listens on (in the guest, on loopback).
const HTTP_PORT: u16 = 8000;

fn main() -> std::process::ExitCode {
    let mut list: Vec<Scenario> = scenarios::all()
        .into_iter()
        .filter(|s| matches!(s.area, "eval" | "wait"))
        .collect();
    list.extend([
        Scenario {
            area: "python",
            name: "the_template_runs_python3_and_pip",
            run: |target| Box::pin(the_template_runs_python3_and_pip(target)),
        },
        Scenario {
            area: "python",
            name: "the_template_has_git_curl_certificates_and_pytest",
            run: |target| Box::pin(the_template_has_git_curl_certificates_and_pytest(target)),
        },
        Scenario {
            area: "python",
            name: "the_warm_session_is_there_at_claim_and_reseeded_in_forked_children",
            run: |target| {
                Box::pin(the_warm_session_is_there_at_claim_and_reseeded_in_forked_children(target))
            },
        },
        Scenario {
            area: "python",
            name: "an_http_servers_banner_is_waited_for_then_it_serves",
            run: |target| Box::pin(an_http_servers_banner_is_waited_for_then_it_serves(target)),
        },
    ]);
    sandbox_tests::suite::run(PYTHON_VM, list)
}

async fn the_template_runs_python3_and_pip(target: Target) {
    let client = target.client();
    let version = sh(client, "python3 -c 'import sys; print(sys.version)'").await;
    assert!(version.starts_with("3."), "python3 says {version:?}");
    let pip = sh(client, "pip --version").await;
    assert!(
        pip.starts_with("pip ") && pip.contains("(python 3."),
        "pip says {pip:?}"
    );
    // The standard library is whole (docs and translations are what was left out).
    let stdlib = sh(
        client,
        "python3 -c 'import json, os, sys, sqlite3, ssl, venv; print(json.dumps(sys.path[-1]))'",
    )
    .await;
    assert!(stdlib.contains("python3"), "{stdlib}");
    // It names a Python session to warm at boot.
    let config: ImageConfig =
        serde_json::from_slice(&client.read_file("/etc/sandbox/image.json").await.unwrap())
            .unwrap();
    assert!(
        config
            .sessions
            .iter()
            .any(|s| s.name == WARM_SESSION && s.language == Language::Python),
        "no {WARM_SESSION} Python session in {config:?}"
    );
}

/// Regression: the template had no `git`, `curl` or `pytest`, the first commands an
/// agent types. (A template built before they were added fails here: rebuild it with
/// `sandbox_tests::vm::PYTHON_TEMPLATE_BUILD`.)
async fn the_template_has_git_curl_certificates_and_pytest(target: Target) {
    let client = target.client();
    let log = sh(
        client,
        "rm -rf /tmp/repo && git init -q /tmp/repo && cd /tmp/repo && echo hi > a && \
         git add a && git -c user.name=t -c user.email=t@example.com commit -q -m first && \
         git log --format=%s",
    )
    .await;
    assert_eq!(log, "first\n");
    let curl = sh(client, "curl --version").await;
    assert!(
        curl.starts_with("curl ") && curl.contains("OpenSSL"),
        "curl says {curl:?}"
    );
    // The CA bundle curl, git and pip verify HTTPS with (egress reaches the network).
    let certificates = sh(
        client,
        "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt",
    )
    .await;
    let count: u32 = certificates.trim().parse().unwrap();
    assert!(count > 100, "{count} certificates");
    let pytest = sh(
        client,
        "mkdir -p /tmp/suite && cd /tmp/suite && \
         printf 'def test_sum():\\n    assert 1 + 1 == 2\\n' > test_sum.py && pytest -q",
    )
    .await;
    assert!(pytest.contains("1 passed"), "pytest says {pytest:?}");
}

/// `(marker, random.random())` in the warm session, as its repr.
async fn draw(client: &Client) -> String {
    let reply = clean(client, python(WARM_SESSION, "marker, random.random()")).await;
    assert!(!reply.session.started, "the warm session was started anew");
    let value = reply.value.expect("no value");
    assert!(value.starts_with("('set before the fork', 0."), "{value}");
    value
}

async fn the_warm_session_is_there_at_claim_and_reseeded_in_forked_children(target: Target) {
    let client = target.client();
    // Claimed: the agent started the session before it answered, and it is listed.
    let ps = client.ps().await.unwrap();
    let warm = ps
        .iter()
        .find(|p| {
            p.kind == ProcessKind::Session
                && p.argv.last().map(String::as_str) == Some(WARM_SESSION)
        })
        .unwrap_or_else(|| panic!("no {WARM_SESSION} session in ps: {ps:#?}"))
        .clone();
    assert_eq!(warm.state, ProcessState::Running);
    // The first evaluation does not start it, and finds its setup's imports done.
    let code = "sorted(m for m in ('json', 'os', 'sys') if m in globals())";
    let first = clean(client, python(WARM_SESSION, code)).await;
    assert_eq!(first.value.as_deref(), Some(WARM_IMPORTS));
    assert!(!first.session.started, "the first eval started the session");
    assert_eq!(first.session.evaluations, 1, "the setup is not counted");
    assert_eq!(first.session.pid, warm.pid);
    assert_eq!(
        clean(client, python(WARM_SESSION, "json.dumps({'a': 1})"))
            .await
            .value
            .as_deref(),
        Some("'{\"a\": 1}'")
    );

    // Fork: each child has the session as it was, and draws numbers of its own.
    let setup = "import random\nmarker = 'set before the fork'\nrandom.random()";
    clean(client, python(WARM_SESSION, setup)).await;
    let vm = target.vm().expect("the python transport is a microVM");
    let launcher = vm.launcher();
    let spec = BranchSpec {
        detached: false,
        ready_timeout: Duration::from_secs(READY_TIMEOUT_SECS),
    };
    let fork = launcher
        .fork(vm.vm().id(), 2, spec)
        .await
        .unwrap_or_else(|e| panic!("fork failed: {}", error_chain(&e)));
    let mut draws = Vec::new();
    for (n, child) in fork.children.iter().enumerate() {
        let child_client = within(60, child.client(&ConnectOptions::default()))
            .await
            .unwrap_or_else(|e| panic!("cannot reach child {n}: {}", error_chain(&e)));
        draws.push(draw(&child_client).await);
    }
    // Without the reseed, each child would draw the parent's next number.
    draws.push(draw(client).await);
    eprintln!("children and parent drew {draws:?}");
    for (i, a) in draws.iter().enumerate() {
        for b in &draws[i + 1..] {
            assert_ne!(a, b, "two of the children and the parent drew alike");
        }
    }
    // The fork's checkpoint holds the disk the parent now writes over: it goes with
    // the test's checkpoint folder once the parent has.
    for child in fork.children {
        child.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

async fn an_http_servers_banner_is_waited_for_then_it_serves(target: Target) {
    let client = target.client();
    let dir = target.scratch("http").await;
    client
        .write_file(
            dir.join("hello.txt"),
            b"hello from the guest\n".to_vec(),
            None,
        )
        .await
        .unwrap();
    let port = HTTP_PORT.to_string();
    let root = dir.display().to_string();
    // `-u`: on a pipe, Python holds its stdout in a block buffer, and the banner
    // would not be written until 8 KiB of output or the exit.
    let server = argv(&[
        "python3",
        "-u",
        "-m",
        "http.server",
        &port,
        "--bind",
        "127.0.0.1",
        "--directory",
        &root,
    ]);
    let pid = client.spawn(server).await.unwrap();
    let banner = within(
        90,
        client.wait_for_output_text(pid, "Serving HTTP", Some(Duration::from_secs(60))),
    )
    .await
    .unwrap_or_else(|e| panic!("no banner: {e}"));
    assert_eq!(banner.stream, Some(Stream::Stdout));
    assert!(
        banner
            .line
            .starts_with(&format!("Serving HTTP on 127.0.0.1 port {port}")),
        "{banner:?}"
    );
    // The banner is printed once the socket listens: a request now is served.
    let fetch = format!(
        "python3 -c \"import urllib.request; \
         print(urllib.request.urlopen('http://127.0.0.1:{port}/hello.txt').read().decode(), end='')\""
    );
    assert_eq!(sh(client, &fetch).await, "hello from the guest\n");
    let logged = within(
        90,
        client.wait_for_output_text(pid, "GET /hello.txt", Some(Duration::from_secs(60))),
    )
    .await
    .unwrap();
    assert_eq!(logged.stream, Some(Stream::Stderr), "{logged:?}");
    assert!(logged.line.ends_with("\" 200 -"), "{logged:?}");
    client.kill(pid, libc::SIGKILL).await.unwrap();
}
