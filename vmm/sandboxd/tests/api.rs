//! `sandboxd`'s control plane against what a hostile network sends, with no VM: a
//! real daemon on a loopback port, a home without templates and no warm pool, so
//! nothing boots. Missing and wrong tokens, sandbox-free operator endpoints,
//! malformed and oversize bodies, unknown fields, paths and methods, a peer that
//! never finishes its request head, drain; every refusal a JSON error with a status,
//! and the daemon answering `/healthz` after all of it.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::json;
use support::{test_dir, Daemon};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn daemon(tag: &str) -> (Daemon, std::path::PathBuf) {
    let dir = test_dir(tag);
    let home = dir.join("home");
    let daemon = Daemon::start(
        &dir,
        &["--pool", "0", "--sandbox-home", home.to_str().unwrap()],
        &[],
    )
    .await;
    (daemon, dir)
}

/// Every refusal is JSON `{"error": string, "code": string}`.
fn assert_error(answer: &support::Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.json["code"], code, "{answer:?}");
    assert!(
        answer.json["error"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer:?}"
    );
}

#[tokio::test]
async fn tokens_are_required_and_operator_endpoints_refuse_other_tokens() {
    let (daemon, dir) = daemon("auth").await;
    for (method, path) in [
        ("GET", "/v1/info"),
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/checkpoints"),
        ("POST", "/v1/claim"),
        ("POST", "/v1/drain"),
        ("GET", "/v1/peers"),
    ] {
        let none = daemon.call(method, path, None, None).await;
        assert_error(&none, 401, "unauthorized");
    }
    let wrong = daemon
        .call("GET", "/v1/info", Some("not-the-token"), None)
        .await;
    assert_error(&wrong, 403, "forbidden");
    let claim = daemon
        .call("POST", "/v1/claim", Some("not-the-token"), Some(&json!({})))
        .await;
    assert_error(&claim, 403, "forbidden");
    // A sandbox id with any other token answers as unauthorized, whether it exists
    // or not: ids cannot be probed.
    let probe = daemon
        .call(
            "POST",
            "/v1/sandboxes/sbx-000000000000/release",
            Some("x"),
            None,
        )
        .await;
    assert_error(&probe, 401, "unauthorized");
    let operator = daemon
        .call(
            "POST",
            "/v1/sandboxes/sbx-000000000000/release",
            Some(&daemon.token),
            None,
        )
        .await;
    assert_error(&operator, 404, "not_found");
    let info = daemon.get("/v1/info").await;
    assert_eq!(info.status, 200, "{info:?}");
    assert_eq!(info.json["peers"], json!([]));
    assert!(
        !info.text.contains(&daemon.token),
        "the token is never shown"
    );
    assert!(
        !daemon.log().contains(&daemon.token),
        "the token is never logged"
    );
    assert_eq!(daemon.get("/v1/peers").await.json, json!({"peers": []}));
    let health = daemon.call("GET", "/healthz", None, None).await;
    assert_eq!((health.status, health.text.as_str()), (200, "ok\n"));
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn bad_requests_are_typed_json_errors_and_the_daemon_goes_on() {
    let (daemon, dir) = daemon("bad").await;
    let token = daemon.token.clone();
    let raw_post = |body: &str| {
        format!(
            "POST /v1/claim HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let malformed = daemon.raw(raw_post("{\"template\": ").as_bytes()).await;
    assert_error(&malformed, 400, "bad_request");
    let not_object = daemon.raw(raw_post("[1,2,3]").as_bytes()).await;
    assert_error(&not_object, 400, "bad_request");
    let unknown = daemon
        .post("/v1/claim", &json!({"tempalte": "default"}))
        .await;
    assert_error(&unknown, 400, "bad_request");
    assert!(
        unknown.json["error"].as_str().unwrap().contains("tempalte"),
        "{unknown:?}"
    );
    let wrong_type = daemon
        .post("/v1/claim", &json!({"ttl_seconds": "soon"}))
        .await;
    assert_error(&wrong_type, 400, "bad_request");
    let long_ttl = daemon
        .post("/v1/claim", &json!({"ttl_seconds": 100_000_000}))
        .await;
    assert_error(&long_ttl, 400, "bad_request");
    let bad_net = daemon
        .post("/v1/claim", &json!({"net": "everything"}))
        .await;
    assert_error(&bad_net, 400, "bad_request");
    let volumes = daemon.post("/v1/claim", &json!({"volumes": ["v1"]})).await;
    assert_error(&volumes, 400, "bad_request");
    let no_template = daemon
        .post("/v1/claim", &json!({"template": "nosuch"}))
        .await;
    assert_error(&no_template, 400, "bad_request");
    assert!(
        no_template.json["error"]
            .as_str()
            .unwrap()
            .contains("nosuch"),
        "{no_template:?}"
    );
    let huge = format!("{{\"template\": \"{}\"}}", "x".repeat(200 * 1024));
    let too_large = daemon.raw(raw_post(&huge).as_bytes()).await;
    assert_eq!(too_large.status, 413, "{too_large:?}");
    assert_eq!(too_large.json["code"], "bad_request");
    assert_error(&daemon.get("/v2/whatever").await, 404, "not_found");
    assert_error(&daemon.get("/v1/claim").await, 405, "method_not_allowed");
    let not_http = daemon.raw(b"\x16\x03\x01\x02\x00garbage\r\n\r\n").await;
    assert_eq!(not_http.status, 400, "{not_http:?}");
    // Not an upgrade: a plain GET of the agent endpoint is refused with what to send.
    let plain = daemon
        .call(
            "GET",
            "/v1/sandboxes/sbx-000000000000/agent",
            Some(&daemon.token),
            None,
        )
        .await;
    assert_error(&plain, 404, "not_found");
    let health = daemon.call("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200, "the daemon goes on: {health:?}");
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_peer_that_never_finishes_its_request_is_cut_off() {
    let (daemon, dir) = daemon("slow").await;
    let mut stalled = tokio::net::TcpStream::connect(&daemon.addr).await.unwrap();
    stalled
        .write_all(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Meanwhile others are served.
    assert_eq!(daemon.call("GET", "/healthz", None, None).await.status, 200);
    let mut rest = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(90), stalled.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "a stalled request head is closed by the daemon"
    );
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn drain_refuses_claims_until_uncordoned_and_metrics_say_so() {
    let (daemon, dir) = daemon("drain").await;
    let drained = daemon.post("/v1/drain", &json!({})).await;
    assert_eq!(drained.status, 200, "{drained:?}");
    assert_eq!(drained.json["draining"], true);
    assert_eq!(daemon.get("/v1/info").await.json["draining"], true);
    let refused = daemon.post("/v1/claim", &json!({})).await;
    assert_error(&refused, 503, "draining");
    let metrics = daemon.call("GET", "/metrics", None, None).await;
    assert!(
        metrics.text.contains("sandboxd_draining 1"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.text.contains("sandboxd_claims_failed_total 1"),
        "{}",
        metrics.text
    );
    let lifted = daemon
        .call("DELETE", "/v1/drain", Some(&daemon.token), None)
        .await;
    assert_eq!(lifted.json["draining"], false, "{lifted:?}");
    // Claims are taken again (this home has no template: the claim is tried, and
    // fails for that reason, not the drain).
    let tried = daemon.post("/v1/claim", &json!({})).await;
    assert_ne!(tried.json["code"], "draining", "{tried:?}");
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The workspace's typed client (`sandbox_vmm::node_api`) against the real daemon:
/// the shapes both ends share parse, and refusals keep their code.
#[tokio::test]
async fn the_typed_client_reads_every_node_endpoint() {
    let (daemon, dir) = daemon("client").await;
    let api = daemon.api();
    let info = api.info().await.unwrap();
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.addr, daemon.addr);
    assert!(info.pool.is_none() || info.pool.as_ref().is_some_and(|p| p.target == 0));
    assert!(api.sandboxes().await.unwrap().is_empty());
    assert!(api.checkpoints().await.unwrap().is_empty());
    assert!(api.peers().await.unwrap().is_empty());
    assert!(api.drain(false).await.unwrap().draining);
    assert!(!api.uncordon().await.unwrap().draining);

    let unknown = api.sandbox("sbx-000000000000").await.unwrap_err();
    assert_eq!(unknown.code(), Some("not_found"), "{unknown}");
    let no_log = api.egress_log("sbx-000000000000", 10).await.unwrap_err();
    assert_eq!(no_log.code(), Some("not_found"), "{no_log}");
    let probe = api
        .with_token("not-the-token")
        .egress_log("sbx-000000000000", 10)
        .await
        .unwrap_err();
    assert_eq!(probe.code(), Some("unauthorized"), "{probe}");
    let template = api.delete_template("no-such-template").await.unwrap_err();
    assert_eq!(template.code(), Some("not_found"), "{template}");
    let escaping = api.delete_template("../../etc").await.unwrap_err();
    assert_eq!(escaping.code(), Some("not_found"), "{escaping}");
    let default = api.delete_template("default").await.unwrap_err();
    assert_eq!(default.code(), Some("conflict"), "{default}");
    let missing = daemon
        .call("DELETE", "/v1/templates", Some(&daemon.token), None)
        .await;
    assert_error(&missing, 400, "bad_request");

    // A sandbox token is no operator token; no token is no caller.
    let stranger = api.with_token("not-the-token");
    let forbidden = stranger.info().await.unwrap_err();
    assert_eq!(forbidden.code(), Some("forbidden"), "{forbidden}");
    let anonymous = sandbox_vmm::node_api::NodeApi::new(&daemon.addr, None).unwrap();
    let refused = anonymous.delete_template("x").await.unwrap_err();
    assert_eq!(refused.code(), Some("unauthorized"), "{refused}");
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// `--tls-cert`/`--tls-key`: both planes over HTTPS, a client trusting the node's CA
/// reaches it, one that does not is refused at the handshake, plain HTTP to the TLS
/// port gets no answer, and a non-loopback address is accepted with TLS.
#[tokio::test]
async fn https_serves_the_api_to_clients_that_trust_the_certificate() {
    let dir = test_dir("tls");
    let home = dir.join("home");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_file = dir.join("cert.pem");
    let key_file = dir.join("key.pem");
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let daemon = Daemon::start(
        &dir,
        &[
            "--pool",
            "0",
            "--sandbox-home",
            home.to_str().unwrap(),
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    let base = format!("https://{}?ca={}", daemon.addr, cert_file.display());
    let api = sandbox_vmm::node_api::NodeApi::new(&base, Some(daemon.token.clone())).unwrap();
    // A node on TLS advertises its scheme: peers and clients never reach it in the clear.
    assert_eq!(
        api.info().await.unwrap().addr,
        format!("https://{}", daemon.addr)
    );
    // The data plane rides the same TLS: an unknown sandbox is refused by the daemon
    // (an HTTP answer through TLS), not by the handshake.
    let url = api.agent_url("sbx-000000000000");
    let options = sandbox_vmm::ConnectOptions {
        token: Some(daemon.token.clone()),
        ..sandbox_vmm::ConnectOptions::default()
    };
    let refused = sandbox_vmm::Client::connect(&url, &options)
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            sandbox_vmm::ClientError::NodeRefused { status: 404, .. }
        ),
        "{refused:?}"
    );

    // Without the CA (the system's roots do not hold a self-signed certificate).
    let untrusting =
        sandbox_vmm::node_api::NodeApi::new(&format!("https://{}", daemon.addr), None).unwrap();
    let error = untrusting.info().await.unwrap_err();
    assert!(
        matches!(error, sandbox_vmm::node_api::NodeApiError::Transport { .. }),
        "{error:?}"
    );
    // Plain HTTP to the TLS port: no HTTP answer.
    let plain = sandbox_vmm::node_api::NodeApi::new(&daemon.addr, Some(daemon.token.clone()))
        .unwrap()
        .with_timeout(Duration::from_secs(60));
    assert!(plain.info().await.is_err());
    assert_eq!(
        daemon.call("GET", "/healthz", None, None).await.status,
        0,
        "no HTTP answer in the clear"
    );
    daemon.terminate(Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(dir);
}
