//! The node daemon's cost, next to its baseline in the same run (these machines are
//! noisy: read the ratios). Run: `cargo bench -p sandboxd --bench node`.
//!
//! Prints:
//! - round trips to one sandbox: an exec of `true` and a 16 B `write_file` through
//!   the daemon's data plane (TCP, the upgrade, the splice) interleaved with the same
//!   requests on the VM's own agent socket, the path the embedded engine
//!   (`sandbox-mcp` without a node) takes; medians, p90s and the ratios;
//! - a warm claim through the daemon (`POST /v1/claim` served by the warm pool),
//!   median over sequential claims, each released and the pool refilled between;
//! - 8 clients at once, each claiming a sandbox and running `true` in it through the
//!   data plane: claims per second and the p99 (and max) of claim + exec;
//! - ports: HTTP requests per second to a busybox `httpd` in the guest, one
//!   connection per request, through a preview URL, through `sandboxctl --node
//!   port-forward`, and through `Client::dial_port`, next to the same server reached
//!   from inside the guest (an exec of a loop of `wget`), in the same run.
//!   `cargo bench -p sandboxd --bench node -- ports` runs only this part (one VM).
//!
//! Needs QEMU, `vhost-device-vsock` and the `default` template, as the microVM tests.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use serde_json::json;
use support::{test_dir, Daemon};

/// Interleaved round trips per request kind and path.
const ROUND_TRIPS: usize = 200;

/// Sequential warm claims.
const WARM_CLAIMS: usize = 8;

/// Clients claiming at once.
const CONCURRENT: usize = 8;

/// How long the pool may take to have a warm VM (TCG on a busy 2-core host).
const WARM_WITHIN: Duration = Duration::from_secs(180);

fn exec_true() -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Argv(vec!["true".into()])),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

fn percentile(samples: &mut [Duration], per_mille: usize) -> Duration {
    samples.sort();
    samples[(samples.len() * per_mille / 1000).min(samples.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn timed<F: std::future::Future>(work: F) -> Duration {
    let started = Instant::now();
    work.await;
    started.elapsed()
}

async fn wait_warm(daemon: &Daemon) {
    sandbox_tests::eventually(WARM_WITHIN, "a warm VM", || async {
        (daemon.get("/v1/info").await.json["pool"]["warm"] == 1).then_some(())
    })
    .await;
}

fn main() {
    if let Some(what) = sandbox_tests::vm::missing() {
        panic!("{what} (benchmarks cannot be skipped)");
    }
    sandbox_tests::suite::block_on(bench());
}

async fn bench() {
    if std::env::args().any(|arg| arg == "ports") {
        return ports::bench().await;
    }
    let dir = test_dir("bench");
    let daemon = Daemon::start(&dir, &["--pool", "1", "--max-sandboxes", "10"], &[]).await;
    wait_warm(&daemon).await;

    // One sandbox, two paths to its agent.
    let claimed = daemon.post("/v1/claim", &json!({})).await;
    assert_eq!(claimed.status, 201, "{claimed:?}");
    let id = claimed.json["id"].as_str().unwrap().to_owned();
    let token = claimed.json["token"].as_str().unwrap().to_owned();
    let through = daemon.agent(&id, &token).await.unwrap();
    let vm = id.strip_prefix("sbx-").unwrap();
    let run = dir.join("run").join(vm);
    let direct = Client::connect(
        &AgentUrl::Unix(run.join("agent.sock")),
        &ConnectOptions {
            token: Some(
                std::fs::read_to_string(run.join("token"))
                    .unwrap()
                    .trim()
                    .to_owned(),
            ),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let (mut exec_node, mut exec_direct, mut write_node, mut write_direct) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUND_TRIPS {
        exec_node.push(timed(async { through.exec(exec_true()).await.unwrap() }).await);
        exec_direct.push(timed(async { direct.exec(exec_true()).await.unwrap() }).await);
        write_node.push(
            timed(async {
                through
                    .write_file("/tmp/b", vec![7; 16], None)
                    .await
                    .unwrap()
            })
            .await,
        );
        write_direct.push(
            timed(async {
                direct
                    .write_file("/tmp/b", vec![7; 16], None)
                    .await
                    .unwrap()
            })
            .await,
        );
    }
    println!("round trips to one sandbox ({ROUND_TRIPS} each, interleaved):");
    for (name, node, own) in [
        ("exec true", &mut exec_node, &mut exec_direct),
        ("write_file 16 B", &mut write_node, &mut write_direct),
    ] {
        let (n50, o50) = (percentile(node, 500), percentile(own, 500));
        let (n90, o90) = (percentile(node, 900), percentile(own, 900));
        println!(
            "  {name:<16} through sandboxd {:>7.2} ms (p90 {:>7.2})   VM socket (embedded) {:>7.2} ms (p90 {:>7.2})   ratio {:.2}x",
            ms(n50),
            ms(n90),
            ms(o50),
            ms(o90),
            n50.as_secs_f64() / o50.as_secs_f64()
        );
    }
    drop(direct);
    ports::measure(&daemon, &id, &token, &through).await;
    drop(through);
    assert_eq!(
        daemon
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await
            .status,
        200
    );

    // Warm claims, the pool refilled before each.
    let mut warm = Vec::new();
    for _ in 0..WARM_CLAIMS {
        wait_warm(&daemon).await;
        let started = Instant::now();
        let claimed = daemon.post("/v1/claim", &json!({})).await;
        let took = started.elapsed();
        assert_eq!(claimed.status, 201, "{claimed:?}");
        if claimed.json["warm"] == true {
            warm.push(took);
        }
        let id = claimed.json["id"].as_str().unwrap();
        daemon
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await;
    }
    let warm_count = warm.len();
    if warm_count > 0 {
        println!(
            "warm claim through sandboxd: median {:.1} ms over {warm_count} claims served warm",
            ms(percentile(&mut warm, 500))
        );
    }

    // CONCURRENT clients claiming and running `true` at once.
    wait_warm(&daemon).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    let daemon = std::sync::Arc::new(daemon);
    for _ in 0..CONCURRENT {
        let daemon = daemon.clone();
        tasks.push(tokio::spawn(async move {
            let began = Instant::now();
            let claimed = daemon.post("/v1/claim", &json!({})).await;
            assert_eq!(claimed.status, 201, "{claimed:?}");
            let id = claimed.json["id"].as_str().unwrap().to_owned();
            let token = claimed.json["token"].as_str().unwrap().to_owned();
            let client = daemon.agent(&id, &token).await.unwrap();
            client.exec(exec_true()).await.unwrap();
            (began.elapsed(), id)
        }));
    }
    let mut latencies = Vec::new();
    let mut ids = Vec::new();
    for task in tasks {
        let (took, id) = task.await.unwrap();
        latencies.push(took);
        ids.push(id);
    }
    let wall = started.elapsed();
    let max = *latencies.iter().max().unwrap();
    println!(
        "{CONCURRENT} clients claiming + exec at once: {:.2} claims/s, p99 {:.0} ms, max {:.0} ms (wall {:.0} ms)",
        CONCURRENT as f64 / wall.as_secs_f64(),
        ms(percentile(&mut latencies, 990)),
        ms(max),
        ms(wall)
    );
    for id in ids {
        daemon
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await;
    }
    let daemon = std::sync::Arc::into_inner(daemon).unwrap();
    daemon.terminate(Duration::from_secs(60)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// HTTP requests per second to a guest server, four ways.
mod ports {
    use std::time::{Duration, Instant};

    use sandbox_vmm::client::Client;
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    use super::support::{test_dir, Daemon};

    /// Requests per path (sequential, one connection each).
    const REQUESTS: usize = 100;

    /// The guest server's port.
    const PORT: u16 = 8000;

    /// Only this part: one claimed VM.
    pub async fn bench() {
        let dir = test_dir("bench-ports");
        let daemon = Daemon::start(&dir, &["--pool", "0", "--max-sandboxes", "1"], &[]).await;
        let claimed = daemon.post("/v1/claim", &json!({})).await;
        assert_eq!(claimed.status, 201, "{claimed:?}");
        let id = claimed.json["id"].as_str().unwrap().to_owned();
        let token = claimed.json["token"].as_str().unwrap().to_owned();
        let client = daemon.agent(&id, &token).await.unwrap();
        measure(&daemon, &id, &token, &client).await;
        drop(client);
        daemon
            .post(&format!("/v1/sandboxes/{id}/release"), &json!({}))
            .await;
        daemon.terminate(Duration::from_secs(60)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `GET path` (HTTP/1.0) over `stream`; panics unless it is a 200.
    async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        mut stream: S,
        path: &str,
    ) {
        let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        // busybox httpd answers an HTTP/1.0 request in HTTP/1.0.
        assert!(
            answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }

    fn per_second(took: Duration) -> f64 {
        REQUESTS as f64 / took.as_secs_f64()
    }

    /// Starts the guest server, then measures every path on `client`'s sandbox.
    pub async fn measure(daemon: &Daemon, id: &str, token: &str, client: &Client) {
        sandbox_tests::sh(
            client,
            "mkdir -p /tmp/www && echo hello > /tmp/www/index.html && \
             (httpd -p 127.0.0.1:8000 -h /tmp/www >/dev/null 2>&1 &)",
        )
        .await;
        sandbox_tests::eventually(Duration::from_secs(30), "httpd", || async {
            client.dial_port(PORT).await.ok()
        })
        .await;

        // Inside the guest: a loop of wget, timed by the exec around it.
        let script = format!(
            "i=0; while [ $i -lt {REQUESTS} ]; do wget -q -O /dev/null http://127.0.0.1:{PORT}/ || exit 1; i=$((i+1)); done"
        );
        let started = Instant::now();
        let reply = client.exec(sandbox_tests::exec_sh(&script)).await.unwrap();
        let inside = started.elapsed();
        assert_eq!(reply.exit.and_then(|exit| exit.code), Some(0), "{reply:?}");

        // dial_port through the daemon's data plane.
        let started = Instant::now();
        for _ in 0..REQUESTS {
            get(client.dial_port(PORT).await.unwrap(), "/").await;
        }
        let dialled = started.elapsed();

        // A preview URL, with a plain HTTP client.
        let minted = daemon
            .post(
                &format!("/v1/sandboxes/{id}/preview"),
                &json!({"port": PORT}),
            )
            .await;
        assert_eq!(minted.status, 200, "{minted:?}");
        let url = minted.json["url"].as_str().unwrap().to_owned();
        let path = url
            .strip_prefix(&format!("http://{}", daemon.addr))
            .unwrap()
            .to_owned();
        let started = Instant::now();
        for _ in 0..REQUESTS {
            let stream = tokio::net::TcpStream::connect(&daemon.addr).await.unwrap();
            get(stream, &path).await;
        }
        let previewed = started.elapsed();

        // sandboxctl --node port-forward.
        let mut forward = tokio::process::Command::new(&sandbox_tests::binaries().sandboxctl)
            .args([
                "--node",
                &daemon.addr,
                "--token",
                token,
                "port-forward",
                id,
                ":8000",
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(forward.stdout.take().unwrap()).lines();
        let line = lines.next_line().await.unwrap().unwrap();
        let local = line
            .strip_prefix("Forwarding from ")
            .and_then(|rest| rest.split(' ').next())
            .unwrap()
            .to_owned();
        let started = Instant::now();
        for _ in 0..REQUESTS {
            let stream = tokio::net::TcpStream::connect(&local).await.unwrap();
            get(stream, "/").await;
        }
        let forwarded = started.elapsed();
        drop(forward);

        let base = per_second(inside);
        println!("HTTP GET / to busybox httpd in the guest ({REQUESTS} sequential requests, one connection each):");
        for (name, took) in [
            ("inside the guest (wget loop)", inside),
            ("dial_port via sandboxd", dialled),
            ("preview URL", previewed),
            ("sandboxctl port-forward --node", forwarded),
        ] {
            println!(
                "  {name:<32} {:>7.1} req/s  ({:>6.2} ms each)  {:.2}x of inside",
                per_second(took),
                took.as_secs_f64() * 1e3 / REQUESTS as f64,
                per_second(took) / base
            );
        }
    }
}
