//! `sandbox-mcp` as a child process driven by rmcp's MCP client over its stdio (the
//! harness in `tests/support`), next to the same operations without MCP, measured
//! in the same run (these machines are noisy, so only the ratios mean much).
//! Run: `cargo bench -p sandbox-mcp --bench mcp`.
//!
//! Prints, in this order:
//! - on real microVMs: `create_sandbox` from a warm pool (`--pool 1`) next to one
//!   that boots cold (`--pool 0`), as the client sees them and as the server logs
//!   them (`claim_ms`);
//! - on a claimed microVM: the `exec` tool's round trip with `true`, next to the
//!   same `sh -c true` through the client directly (one kept connection) and through
//!   `sandboxctl sh true` (a process, a connection and a handshake per call),
//!   interleaved;
//! - the same three against a local agent on a Unix socket (`--agent`, no VM).
//!
//! Needs QEMU, `qemu-img`, `vhost-device-vsock` and the `default` template; a missing
//! one panics with what to install or build (`SANDBOX_SKIP_VM_TESTS` does not apply).

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_tests::TestAgent;
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::{Launcher, LauncherConfig};
use serde_json::{json, Value};
use support::{eventually, McpServer};

/// Claims from the warm pool (each is followed by a refill boot).
const WARM_CLAIMS: usize = 5;

/// Claims that boot a VM.
const COLD_CLAIMS: usize = 3;

/// Exec round trips per path on the microVM (TCG forks slowly).
const VM_EXECS: usize = 100;

/// Exec round trips per path on the local agent.
const LOCAL_EXECS: usize = 300;

/// How long a pool boot may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

/// How long a server gets to stop its VMs and exit after the session ends.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

struct Summary {
    median: Duration,
    p90: Duration,
}

fn summary(name: &str, mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p90 = samples[samples.len() * 9 / 10];
    println!(
        "{name:<44} median {:>8.2} ms   p90 {:>8.2} ms",
        millis(median),
        millis(p90)
    );
    Summary { median, p90 }
}

/// For the few slow samples of a claim: median, min and max.
fn spread(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let median = samples[samples.len() / 2];
    println!(
        "{name:<44} median {:>8.2} ms   min {:.2} ms   max {:.2} ms",
        millis(median),
        millis(samples[0]),
        millis(samples[samples.len() - 1])
    );
    median
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|line| {
            line.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

fn sh_true() -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Shell("true".into())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

/// A server launching VMs into `run`, with `pool` warm VMs.
async fn launching(run: &Path, pool: usize, max: usize) -> McpServer {
    let run_text = run.display().to_string();
    let log = PathBuf::from(format!("{run_text}-pool{pool}.log"));
    McpServer::start(
        &[
            "--pool",
            &pool.to_string(),
            "--max-sandboxes",
            &max.to_string(),
        ],
        &[("SANDBOX_RUN_DIR", &run_text)],
        &log,
    )
    .await
}

async fn wait_warm(server: &McpServer) {
    eventually(WARM_WITHIN, "a warm VM in the pool", || async {
        let info = server.ok("node_info", json!({})).await;
        (info["pool"]["warm"] == 1).then_some(())
    })
    .await;
}

/// Claims once; returns the claim's wall time from the client, the server's own
/// `claim_ms`, and the result.
async fn claim(server: &McpServer, warm: bool) -> (Duration, Duration, Value) {
    let start = Instant::now();
    let claimed = server.ok("create_sandbox", json!({})).await;
    let wall = start.elapsed();
    assert_eq!(claimed["warm"], warm, "{claimed}");
    let inside = Duration::from_millis(claimed["claim_ms"].as_u64().unwrap());
    (wall, inside, claimed)
}

async fn release(server: &McpServer, claimed: &Value) {
    server
        .ok("release", json!({"sandbox_id": claimed["sandbox_id"]}))
        .await;
}

async fn stop_server(server: McpServer) {
    let status = server.disconnect(EXIT_WITHIN).await;
    assert!(status.success(), "sandbox-mcp exited with {status}");
}

/// The agent URL and token of the VM behind a claimed `sbx-<vm id>`, from its run
/// folder.
fn agent_address(config: &LauncherConfig, sandbox_id: &str) -> (String, Option<String>) {
    let vm_id = sandbox_id.strip_prefix("sbx-").expect("a VM sandbox id");
    let listed = Launcher::new(config.clone())
        .list()
        .expect("list run folders");
    listed
        .iter()
        .find(|entry| entry.name == vm_id)
        .and_then(|entry| Some((entry.record.as_ref()?.agent_url.clone(), entry.token())))
        .unwrap_or_else(|| panic!("no run folder for {sandbox_id} in {listed:?}"))
}

/// Interleaves the `exec` tool, the client and `sandboxctl` on `sandbox_id` (whose
/// agent is at `url`), `runs` times each, and prints them with their ratios.
async fn exec_three_ways(
    server: &McpServer,
    sandbox_id: &str,
    (url, token): (&str, Option<String>),
    runs: usize,
) {
    let options = ConnectOptions {
        token: token.clone(),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&url.parse().expect("agent URL"), &options)
        .await
        .unwrap_or_else(|error| panic!("cannot connect to {url}: {}", error_chain(&error)));
    let sandboxctl = &sandbox_tests::binaries().sandboxctl;
    let tool_args = json!({"sandbox_id": sandbox_id, "command": "true"});
    let cli = || {
        let mut command = std::process::Command::new(sandboxctl);
        command.args(["--agent", url]);
        if let Some(token) = &token {
            command.args(["--token", token]);
        }
        let status = command.args(["sh", "true"]).status().unwrap();
        assert!(status.success(), "sandboxctl sh true: {status}");
    };
    for _ in 0..10 {
        server.ok("exec", tool_args.clone()).await;
        client.exec(sh_true()).await.unwrap();
        cli();
    }
    let (mut mcp, mut direct, mut ctl) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let start = Instant::now();
        let result = server.ok("exec", tool_args.clone()).await;
        mcp.push(start.elapsed());
        assert_eq!(result["exit_code"], 0, "{result}");

        let start = Instant::now();
        let reply = client.exec(sh_true()).await.unwrap();
        direct.push(start.elapsed());
        assert_eq!(reply.exit.and_then(|e| e.code), Some(0), "{reply:?}");

        let start = Instant::now();
        cli();
        ctl.push(start.elapsed());
    }
    let direct = summary(&format!("client exec (one connection) x{runs}"), direct);
    let mcp = summary(&format!("MCP exec tool x{runs}"), mcp);
    let ctl = summary(&format!("sandboxctl sh true (a process each) x{runs}"), ctl);
    println!(
        "MCP tool / client: {:.2}x (p90 {:.2}x), overhead {:.2} ms; \
         sandboxctl / client: {:.2}x (p90 {:.2}x), overhead {:.2} ms",
        ratio(mcp.median, direct.median),
        ratio(mcp.p90, direct.p90),
        millis(mcp.median.saturating_sub(direct.median)),
        ratio(ctl.median, direct.median),
        ratio(ctl.p90, direct.p90),
        millis(ctl.median.saturating_sub(direct.median))
    );
}

async fn microvms(config: &LauncherConfig) {
    // Cold first: with no pool, nothing boots in the background.
    let cold_server = launching(&config.run_root, 0, 1).await;
    let (mut cold_wall, mut cold_inside) = (Vec::new(), Vec::new());
    for _ in 0..COLD_CLAIMS {
        let (wall, inside, claimed) = claim(&cold_server, false).await;
        cold_wall.push(wall);
        cold_inside.push(inside);
        release(&cold_server, &claimed).await;
    }
    stop_server(cold_server).await;

    // Warm: each claim is taken once the refill boot is done, so the host is idle.
    let server = launching(&config.run_root, 1, 2).await;
    let (mut warm_wall, mut warm_inside) = (Vec::new(), Vec::new());
    let mut kept = None;
    for n in 0..WARM_CLAIMS {
        wait_warm(&server).await;
        let (wall, inside, claimed) = claim(&server, true).await;
        warm_wall.push(wall);
        warm_inside.push(inside);
        if n + 1 < WARM_CLAIMS {
            release(&server, &claimed).await;
        } else {
            kept = Some(claimed);
        }
    }
    let kept = kept.expect("at least one claim");
    // Let the refill finish so no boot competes with the round trips.
    wait_warm(&server).await;

    println!("microVM sandboxes (default template)");
    let warm = spread(
        &format!("create_sandbox, warm pool x{WARM_CLAIMS}"),
        warm_wall,
    );
    spread("  inside the server (claim_ms, whole ms)", warm_inside);
    let cold = spread(
        &format!("create_sandbox, cold boot x{COLD_CLAIMS}"),
        cold_wall,
    );
    spread("  inside the server (claim_ms, whole ms)", cold_inside);
    println!(
        "cold / warm claim: {:.0}x; a warm claim saves {:.0} ms",
        ratio(cold, warm),
        millis(cold.saturating_sub(warm))
    );

    let id = kept["sandbox_id"].as_str().unwrap().to_owned();
    let (url, token) = agent_address(config, &id);
    println!("exec of true on the claimed microVM {id}");
    exec_three_ways(&server, &id, (&url, token), VM_EXECS).await;
    release(&server, &kept).await;
    stop_server(server).await;
}

async fn local_agent() {
    let agent = TestAgent::start();
    let log = agent.dir().join("mcp.log");
    let server = McpServer::start(&["--agent", &agent.url()], &[], &log).await;
    println!("exec of true on a local agent (attach mode, Unix socket, no VM)");
    exec_three_ways(&server, "attached", (&agent.url(), None), LOCAL_EXECS).await;
    stop_server(server).await;
}

fn main() {
    let mut config = support::require_microvms();
    config.run_root = support::run_dir("bench");
    // Build sandboxctl and the agent before anything is timed.
    sandbox_tests::binaries();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("load average at start: {}", load_average());
    runtime.block_on(async {
        microvms(&config).await;
        local_agent().await;
    });
    let left = Launcher::new(config.clone())
        .list()
        .expect("list run folders");
    assert!(left.is_empty(), "run folders left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&config.run_root);
    for pool in [0, 1] {
        let _ = std::fs::remove_file(format!("{}-pool{pool}.log", config.run_root.display()));
    }
    println!("load average at end: {}", load_average());
}
