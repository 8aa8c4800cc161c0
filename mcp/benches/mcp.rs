//! `sandbox-mcp` as a child process driven by rmcp's MCP client over its stdio (the
//! harness in `tests/support`), next to the same operations without MCP, measured
//! in the same run (these machines are noisy, so only the ratios mean much).
//! Run: `cargo bench -p sandbox-mcp --bench mcp`.
//!
//! Prints, in this order:
//! - on real microVMs, `create_sandbox` three ways, as the client sees it and as the
//!   server logs it (`claim_ms`): a cold boot of the kernel (a server whose home has
//!   no ready snapshot and cannot take one), a VM restored from the template's ready
//!   snapshot (`--pool 0`), and a warm VM from the pool (`--pool 1`);
//! - on a claimed microVM: the `exec` tool's round trip with `true`, next to the
//!   same `sh -c true` through the client directly (one kept connection) and through
//!   `sandboxctl sh true` (a process, a connection and a handshake per call),
//!   interleaved;
//! - the bytes a result costs for typical calls on that microVM (a small exec, 1 MiB
//!   of exec output, a process's logs, a 100 KiB text file): the default call's, next
//!   to "before": the same data returned whole (what the old defaults returned)
//!   and repeated in text and structuredContent, as the old results did, computed
//!   from a call that returns it whole;
//! - `fork` into 1, 4 and 16 children of one running microVM;
//! - the `exec` round trips against a local agent on a Unix socket (`--agent`, no VM).
//!
//! Needs QEMU, `qemu-img`, `vhost-device-vsock` and the `default` template; a missing
//! one panics with what to install or build (`SANDBOX_SKIP_VM_TESTS` does not apply).

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::CallToolResult;
use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_tests::TestAgent;
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::{Launcher, LauncherConfig};
use serde_json::{json, Value};
use support::{eventually, McpServer};

/// Claims from the warm pool (each is followed by a refill boot).
const WARM_CLAIMS: usize = 5;

/// Claims that boot a VM's kernel.
const COLD_CLAIMS: usize = 3;

/// Claims that restore the template's ready snapshot.
const SNAPSHOT_CLAIMS: usize = 5;

/// Fork sizes, and forks of each.
const FORK_COUNTS: [usize; 3] = [1, 4, 16];
const FORKS_EACH: usize = 3;

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

/// A server launching VMs into `run`, with `pool` warm VMs, and `envs` added.
async fn launching(
    run: &Path,
    pool: usize,
    max: usize,
    tag: &str,
    envs: &[(&str, &str)],
) -> McpServer {
    let run_text = run.display().to_string();
    let log = PathBuf::from(format!("{run_text}-{tag}.log"));
    let mut all = vec![("SANDBOX_RUN_DIR", run_text.as_str())];
    all.extend_from_slice(envs);
    McpServer::start(
        &[
            "--pool",
            &pool.to_string(),
            "--max-sandboxes",
            &max.to_string(),
        ],
        &all,
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
async fn claim(server: &McpServer, origin: &str) -> (Duration, Duration, Value) {
    let start = Instant::now();
    let claimed = server.ok("create_sandbox", json!({})).await;
    let wall = start.elapsed();
    assert_eq!(claimed["origin"], origin, "{claimed}");
    let inside = Duration::from_millis(claimed["claim_ms"].as_u64().unwrap());
    (wall, inside, claimed)
}

/// `count` claims, each released; their wall times and `claim_ms`.
async fn claims(server: &McpServer, origin: &str, count: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut wall, mut inside) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let (w, i, claimed) = claim(server, origin).await;
        wall.push(w);
        inside.push(i);
        release(server, &claimed).await;
    }
    (wall, inside)
}

/// A sandbox home whose templates are the real home's and whose ready-snapshot store
/// cannot be written (`cache/ready` is a file): each VM of its server boots the
/// kernel, the path of a template that has no ready snapshot. Removed on drop.
struct ColdHome(PathBuf);

impl ColdHome {
    fn new(config: &LauncherConfig, at: PathBuf) -> Self {
        let _ = std::fs::remove_dir_all(&at);
        std::fs::create_dir_all(at.join("cache")).unwrap();
        std::os::unix::fs::symlink(config.templates_root(), at.join("templates")).unwrap();
        std::fs::write(at.join("cache/ready"), "no ready snapshots in this home\n").unwrap();
        // The accelerator probe's verdict, so the first claim does not probe again.
        let _ = std::fs::copy(config.accel_cache_file(), at.join("cache/accel.json"));
        Self(at)
    }

    /// True while no ready snapshot could have been taken or restored.
    fn still_cold(&self) -> bool {
        self.0.join("cache/ready").is_file()
    }
}

impl Drop for ColdHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
        // A stdin that is not a terminal would be read to its end and sent along.
        let status = command
            .args(["sh", "true"])
            .stdin(std::process::Stdio::null())
            .status()
            .unwrap();
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

/// What the old results cost for the data `whole` returns: the same envelope, with
/// the data in structuredContent and again in the text (the old rendering repeated
/// every field whole). `whole`'s own text is only a preview of a field that large,
/// so it is taken out and the structured part counted twice.
fn doubled(whole: &CallToolResult) -> usize {
    let (wire, text, structured) = support::sizes(whole);
    wire - text - structured + 2 * structured
}

/// One row of the result-size table: a default call (`after`) and the call that
/// returns the data whole (`before`, doubled).
async fn size_row(
    server: &McpServer,
    name: &str,
    tool: &str,
    default_args: Value,
    whole_args: Value,
) -> (String, usize, usize) {
    let after = server.call(tool, default_args).await;
    assert_ne!(after.is_error, Some(true), "{}", support::text(&after));
    let whole = server.call(tool, whole_args).await;
    assert_ne!(whole.is_error, Some(true), "{}", support::text(&whole));
    (name.to_owned(), doubled(&whole), support::sizes(&after).0)
}

/// The result-size table on sandbox `id`.
async fn result_sizes(server: &McpServer, id: &str) {
    let mut rows = Vec::new();
    let small = json!({"sandbox_id": id, "command": "uname -a"});
    rows.push(size_row(server, "exec `uname -a`", "exec", small.clone(), small).await);

    let mib = "yes 'a line of build output, 40 bytes long' | head -c 1048576";
    rows.push(
        size_row(
            server,
            "exec, 1 MiB of stdout",
            "exec",
            json!({"sandbox_id": id, "command": mib}),
            json!({"sandbox_id": id, "command": mib, "max_bytes": 1_048_576}),
        )
        .await,
    );

    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": id,
                   "command": "yes 'a server log line, 30 bytes' | head -c 1000000"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    eventually(Duration::from_secs(60), "the log writer to end", || async {
        let ps = server.ok("ps", json!({"sandbox_id": id})).await;
        let running = ps["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| row["pid"] == pid && row["state"] == "running");
        (!running).then_some(())
    })
    .await;
    rows.push(
        size_row(
            server,
            "logs, no cursor (ring full)",
            "logs",
            json!({"sandbox_id": id, "pid": pid}),
            json!({"sandbox_id": id, "pid": pid, "max_bytes": 256 * 1024}),
        )
        .await,
    );

    let line = "    let value = compute(input, &mut state); // a line of code\n";
    let source = line.repeat(100 * 1024 / line.len());
    server
        .ok(
            "write_file",
            json!({"sandbox_id": id, "path": "/tmp/source.rs", "content": source}),
        )
        .await;
    rows.push(
        size_row(
            server,
            "read_file, 100 KiB text file",
            "read_file",
            json!({"sandbox_id": id, "path": "/tmp/source.rs"}),
            json!({"sandbox_id": id, "path": "/tmp/source.rs", "max_bytes": 1_048_576}),
        )
        .await,
    );

    println!("bytes per MCP call result (before: the data whole, in text and structuredContent)");
    println!("| call | before | after | after / before |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, before, after) in rows {
        println!(
            "| {name} | {before} | {after} | {:.3} |",
            after as f64 / before as f64
        );
    }
}

/// `fork` of one running sandbox into 1, 4 and 16 children, each released before
/// the next fork.
async fn forks(config: &LauncherConfig) {
    let checkpoints = format!("{}-ckpt", config.run_root.display());
    let max = FORK_COUNTS.iter().max().unwrap() + 1;
    let server = launching(
        &config.run_root,
        0,
        max,
        "fork",
        &[("SANDBOX_CHECKPOINT_DIR", &checkpoints)],
    )
    .await;
    let (_, _, parent) = claim(&server, "new_vm").await;
    let id = parent["sandbox_id"].as_str().unwrap().to_owned();
    server
        .ok(
            "exec",
            json!({"sandbox_id": id, "command": "echo parent > /tmp/state"}),
        )
        .await;
    println!(
        "fork of a running microVM (each child a restored copy; wall time / the server's fork_ms)"
    );
    let mut one = None;
    for count in FORK_COUNTS {
        let (mut wall, mut inside, mut pauses) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..FORKS_EACH {
            let start = Instant::now();
            let forked = server
                .ok("fork", json!({"sandbox_id": id, "count": count}))
                .await;
            wall.push(start.elapsed());
            inside.push(Duration::from_millis(forked["fork_ms"].as_u64().unwrap()));
            pauses.push(Duration::from_millis(forked["pause_ms"].as_u64().unwrap()));
            let children = forked["children"].as_array().unwrap();
            assert_eq!(children.len(), count, "{forked}");
            for child in children {
                server
                    .ok("release", json!({"sandbox_id": child["sandbox_id"]}))
                    .await;
            }
        }
        let median = spread(&format!("fork count={count:<2} x{FORKS_EACH}"), wall);
        spread("  inside the server (fork_ms)", inside);
        spread("  the parent paused (pause_ms)", pauses);
        let per_child = median / u32::try_from(count).unwrap();
        let base = *one.get_or_insert(median);
        println!(
            "  {:.0} ms a child; {:.2}x the time of a fork of 1",
            millis(per_child),
            ratio(median, base)
        );
    }
    release(&server, &parent).await;
    stop_server(server).await;
    let _ = std::fs::remove_dir_all(&checkpoints);
}

async fn microvms(config: &LauncherConfig) {
    // Cold boots first, with no pool, so nothing boots in the background.
    let cold_home = ColdHome::new(
        config,
        PathBuf::from(format!("{}-home", config.run_root.display())),
    );
    let home_text = cold_home.0.display().to_string();
    let cold_server = launching(
        &config.run_root,
        0,
        1,
        "cold",
        &[("SANDBOX_HOME", &home_text)],
    )
    .await;
    let (cold_wall, cold_inside) = claims(&cold_server, "new_vm", COLD_CLAIMS).await;
    stop_server(cold_server).await;
    assert!(cold_home.still_cold(), "a ready snapshot was taken");
    drop(cold_home);

    // From the template's ready snapshot: the first claim takes it if it is not
    // there yet, and is not counted.
    let snap_server = launching(&config.run_root, 0, 1, "pool0", &[]).await;
    let _ = claims(&snap_server, "new_vm", 1).await;
    let (snap_wall, snap_inside) = claims(&snap_server, "new_vm", SNAPSHOT_CLAIMS).await;
    stop_server(snap_server).await;

    // Warm: each claim is taken once the refill is done, so the host is idle.
    let server = launching(&config.run_root, 1, 2, "pool1", &[]).await;
    let (mut warm_wall, mut warm_inside) = (Vec::new(), Vec::new());
    let mut kept = None;
    for n in 0..WARM_CLAIMS {
        wait_warm(&server).await;
        let (wall, inside, claimed) = claim(&server, "warm_pool").await;
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

    println!("microVM sandboxes (default template): create_sandbox as the client sees it");
    let warm = spread(&format!("warm, from the pool x{WARM_CLAIMS}"), warm_wall);
    spread("  inside the server (claim_ms, whole ms)", warm_inside);
    let snap = spread(
        &format!("cold, from the ready snapshot x{SNAPSHOT_CLAIMS}"),
        snap_wall,
    );
    spread("  inside the server (claim_ms, whole ms)", snap_inside);
    let cold = spread(
        &format!("cold boot of the kernel x{COLD_CLAIMS}"),
        cold_wall,
    );
    spread("  inside the server (claim_ms, whole ms)", cold_inside);
    println!(
        "cold boot / warm: {:.1}x; from snapshot / warm: {:.1}x; cold boot / from snapshot: {:.1}x",
        ratio(cold, warm),
        ratio(snap, warm),
        ratio(cold, snap)
    );

    let id = kept["sandbox_id"].as_str().unwrap().to_owned();
    let (url, token) = agent_address(config, &id);
    println!("exec of true on the claimed microVM {id}");
    exec_three_ways(&server, &id, (&url, token), VM_EXECS).await;
    result_sizes(&server, &id).await;
    release(&server, &kept).await;
    stop_server(server).await;

    forks(config).await;
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
    for tag in ["cold", "pool0", "pool1", "fork"] {
        let _ = std::fs::remove_file(format!("{}-{tag}.log", config.run_root.display()));
    }
    println!("load average at end: {}", load_average());
}
