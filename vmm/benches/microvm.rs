//! A real microVM of the `default` template: boot-to-ready, and round trips over one
//! kept connection next to a local fork/exec measured in the same run (these
//! machines are noisy, so only the ratios mean much), over both transports: the
//! serial link behind its relay (the default, snapshot-capable) and hybrid vsock.
//! Run: `cargo bench -p sandbox-vmm --bench microvm`.
//!
//! Prints, in this order:
//! - round trips to one VM over one connection (medians and 90th percentiles): a bare
//!   request (`ps` on an empty table), a local `std::process::Command::new("true")`
//!   next to an agent exec of `true` (interleaved), and a `write_file` of 16 B next
//!   to one of 4 KiB; then the ratios, and an exec next to the in-guest floor (a
//!   fork+exec of `true` by the guest's own shell);
//! - boot-to-ready (QEMU's start to the agent's `Ready`) over sequential boots:
//!   median, min and max, the whole `Launcher::boot` call's median, and the
//!   recipe's 1.30 s figure as a reference line.
//!
//! Needs QEMU, `qemu-img`, `vhost-device-vsock` and the `default` template; a missing
//! one panics with what to install or build (`SANDBOX_SKIP_VM_TESTS` does not apply).
//! The VMs run under a private run root in `/tmp`, checked empty at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec, ProcessState};
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::{AgentTransport, BootSpec, Launcher, LauncherConfig, TemplateRef, Vm};

/// The template booted.
const TEMPLATE: &str = "default";

/// Sequential boots for the boot-to-ready figure.
const BOOTS: usize = 10;

/// Bare request round trips.
const REQUESTS: usize = 1000;

/// Exec round trips (each one forks in the guest, slow under TCG).
const EXECS: usize = 300;

/// `write_file` round trips per payload size.
const WRITES: usize = 300;

/// The small and the large `write_file` payloads.
const SMALL_PAYLOAD_BYTES: usize = 16;
const LARGE_PAYLOAD_BYTES: usize = 4096;

/// The recipe's boot-to-ready figure; printed for reference, not asserted.
const REFERENCE_BOOT_SECS: f64 = 1.30;

/// How long one boot may take to report ready (TCG on a busy 2-core host is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long QEMU gets to exit on `SIGTERM`.
const GRACE: Duration = Duration::from_secs(5);

/// How long the agent may take to accept the benchmark's connection.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

struct Summary {
    median: Duration,
    p90: Duration,
}

fn summary(name: &str, mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p90 = samples[samples.len() * 9 / 10];
    println!(
        "{name:<40} median {:>8.1} µs   p90 {:>8.1} µs",
        micros(median),
        micros(p90)
    );
    Summary { median, p90 }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The launcher configuration from the environment with a private run root, once
/// QEMU, `qemu-img`, `vhost-device-vsock` and the template are known to be there.
fn require_microvms() -> LauncherConfig {
    let mut config = LauncherConfig::from_env()
        .unwrap_or_else(|error| panic!("no launcher configuration: {}", error_chain(&error)));
    let mut missing = Vec::new();
    for program in [&config.qemu_path, &config.qemu_img_path, &config.vhost_path] {
        if sandbox_vmm::launcher::accel::find_program(program).is_none() {
            missing.push(format!("{} (run scripts/setup.sh)", program.display()));
        }
    }
    let template = config.templates_root().join(TEMPLATE).join("template.json");
    if !template.is_file() {
        missing.push(format!(
            "{} (build it: sandbox-rootfs build)",
            template.display()
        ));
    }
    assert!(
        missing.is_empty(),
        "the microVM benchmark needs: {}",
        missing.join(", ")
    );
    // Short: the sockets inside must fit in 108 bytes.
    config.run_root = PathBuf::from(format!("/tmp/sbx-bench-{}", std::process::id()));
    config
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

async fn boot(launcher: &Launcher, transport: Option<AgentTransport>) -> Vm {
    let mut spec = BootSpec::new(TemplateRef::parse(TEMPLATE));
    spec.ready_timeout = READY_TIMEOUT;
    spec.transport = transport;
    // Boot-to-ready of the kernel: not a restore from the template's ready snapshot
    // (`cargo bench --bench snapshots` measures those).
    spec.cold = true;
    match launcher.boot(spec).await {
        Ok(vm) => vm,
        Err(error) => panic!(
            "booting the {} template failed: {}\nrun `sandboxctl doctor` to see what is missing",
            TEMPLATE,
            error_chain(&error)
        ),
    }
}

async fn stop(vm: Vm) {
    if let Err(error) = vm.shutdown(GRACE).await {
        panic!("stopping the VM failed: {}", error_chain(&error));
    }
}

fn exec_true() -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Argv(vec!["true".into()])),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

/// The medians one transport's round trips gave.
struct Trips {
    bare: Duration,
    exec: Duration,
    write: Duration,
    local: Duration,
}

/// Round trips over one kept connection to `vm`.
async fn round_trips(vm: &Vm) -> Trips {
    let url = vm.agent_url();
    let deadline = tokio::time::Instant::now() + CONNECT_DEADLINE;
    let client = Client::connect_with_retry(
        &url.parse().expect("the launcher's agent URL"),
        &vm.connect_options(ConnectOptions::default().connect_timeout),
        deadline,
    )
    .await
    .unwrap_or_else(|error| panic!("cannot connect to {url}: {}", error_chain(&error)));

    // The bare round trip first, while nothing runs and the table holds at most the
    // footprint's exec (exited).
    for _ in 0..50 {
        client.ps().await.unwrap();
    }
    let table = client.ps().await.unwrap();
    assert!(
        table.len() <= 1 && table.iter().all(|p| p.state != ProcessState::Running),
        "the table is not empty: {table:?}"
    );
    let mut bare = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let start = Instant::now();
        client.ps().await.unwrap();
        bare.push(start.elapsed());
    }

    // Warm up both spawn paths, then interleave so both see the same machine load.
    for _ in 0..20 {
        client.exec(exec_true()).await.unwrap();
        std::process::Command::new("true").status().unwrap();
    }
    let (mut local, mut remote) = (Vec::with_capacity(EXECS), Vec::with_capacity(EXECS));
    // What the agent itself reports each exec took, from the request's arrival to
    // its reply (its own clock): the rest of a round trip is the link and the host.
    let mut in_agent = Vec::with_capacity(EXECS);
    for _ in 0..EXECS {
        let start = Instant::now();
        let status = std::process::Command::new("true").status().unwrap();
        local.push(start.elapsed());
        assert!(status.success());

        let start = Instant::now();
        let reply = client.exec(exec_true()).await.unwrap();
        remote.push(start.elapsed());
        in_agent.push(Duration::from_micros(reply.duration_us));
        assert_eq!(reply.exit.and_then(|e| e.code), Some(0), "{reply:?}");
    }

    let floor = in_guest_spawn(&client).await;

    let small = vec![b's'; SMALL_PAYLOAD_BYTES];
    let large = vec![b'l'; LARGE_PAYLOAD_BYTES];
    let (mut small_writes, mut large_writes) =
        (Vec::with_capacity(WRITES), Vec::with_capacity(WRITES));
    for _ in 0..WRITES {
        let start = Instant::now();
        client
            .write_file("/tmp/bench-small", small.clone(), None)
            .await
            .unwrap();
        small_writes.push(start.elapsed());

        let start = Instant::now();
        client
            .write_file("/tmp/bench-large", large.clone(), None)
            .await
            .unwrap();
        large_writes.push(start.elapsed());
    }
    assert_eq!(client.read_file("/tmp/bench-large").await.unwrap(), large);

    println!(
        "one VM, one kept connection over {} ({url})",
        vm.transport()
    );
    let bare = summary(&format!("request round trip (ps) x{REQUESTS}"), bare);
    let local = summary(&format!("local fork/exec of true x{EXECS}"), local);
    let remote = summary(&format!("VM exec of true x{EXECS}"), remote);
    let in_agent = summary("  of which in the agent (its clock)", in_agent);
    let small = summary(
        &format!("write_file {SMALL_PAYLOAD_BYTES} B x{WRITES}"),
        small_writes,
    );
    let large = summary(
        &format!("write_file {LARGE_PAYLOAD_BYTES} B x{WRITES}"),
        large_writes,
    );
    println!(
        "VM exec / local spawn: {:.2}x (p90 {:.2}x); VM exec overhead {:.1} µs",
        ratio(remote.median, local.median),
        ratio(remote.p90, local.p90),
        micros(remote.median.saturating_sub(local.median))
    );
    println!(
        "VM exec / a fork+exec of true inside the guest ({:.1} µs, busybox sh, median of {FLOOR_ROUNDS} \
         loops of {FLOOR_SPAWNS}): {:.2}x",
        micros(floor),
        ratio(remote.median, floor)
    );
    println!(
        "VM exec in the agent / a fork+exec of true inside the guest: {:.2}x; the rest of \
         the round trip {:.1} µs",
        ratio(in_agent.median, floor),
        micros(remote.median.saturating_sub(in_agent.median))
    );
    println!(
        "VM exec / bare request: {:.2}x; bare request / local spawn: {:.2}x",
        ratio(remote.median, bare.median),
        ratio(bare.median, local.median)
    );
    println!(
        "write_file {LARGE_PAYLOAD_BYTES} B / {SMALL_PAYLOAD_BYTES} B: {:.2}x; \
         write_file {SMALL_PAYLOAD_BYTES} B / bare request: {:.2}x",
        ratio(large.median, small.median),
        ratio(small.median, bare.median)
    );
    Trips {
        bare: bare.median,
        exec: remote.median,
        write: small.median,
        local: local.median,
    }
}

/// Spawns per in-guest loop, and loops (interleaved with empty ones).
const FLOOR_SPAWNS: usize = 200;
const FLOOR_ROUNDS: usize = 5;

/// The in-guest floor of an exec: one fork+exec of `true` by the guest's own shell,
/// as (a loop of [`FLOOR_SPAWNS`] `true`s minus the same loop without them) per
/// spawn, both run as one exec each and timed from here (busybox has no clock
/// finer than a second), the median of [`FLOOR_ROUNDS`] interleaved pairs.
async fn in_guest_spawn(client: &Client) -> Duration {
    let script =
        |body: &str| format!("i=0; while [ $i -lt {FLOOR_SPAWNS} ]; do {body}i=$((i+1)); done");
    let (with, without) = (script("/bin/true; "), script(""));
    let mut per_spawn = Vec::with_capacity(FLOOR_ROUNDS);
    for _ in 0..FLOOR_ROUNDS {
        let full = timed_shell(client, &with).await;
        let empty = timed_shell(client, &without).await;
        per_spawn.push(full.saturating_sub(empty) / u32::try_from(FLOOR_SPAWNS).unwrap());
    }
    per_spawn.sort();
    per_spawn[FLOOR_ROUNDS / 2]
}

/// One exec of a shell script that must succeed, timed from here.
async fn timed_shell(client: &Client, script: &str) -> Duration {
    let request = ExecRequest {
        spec: ProcessSpec::new(Command::Shell(script.to_owned())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    };
    let start = Instant::now();
    let reply = client.exec(request).await.unwrap();
    assert_eq!(reply.exit.and_then(|e| e.code), Some(0), "{reply:?}");
    start.elapsed()
}

/// The agent's size on disk (`/init`) and what it holds resident as an idle PID 1,
/// read in the guest before any request but this one has run.
async fn agent_footprint(vm: &Vm) {
    let client = vm.client(&ConnectOptions::default()).await.unwrap();
    let script = "stat -c %s /init; grep -E '^(VmRSS|RssAnon|RssShmem):' /proc/1/status";
    let request = sandbox_protocol::ExecRequest {
        spec: sandbox_protocol::ProcessSpec::new(sandbox_protocol::Command::Shell(script.into())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    };
    let reply = client.exec(request).await.unwrap();
    let text = String::from_utf8_lossy(&reply.stdout);
    let mut lines = text.lines();
    let bytes: f64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0.0);
    let rest: Vec<String> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    println!(
        "agent as PID 1: {:.2} MiB on disk ({bytes:.0} B; aim 3 MiB); idle {}",
        bytes / 1048576.0,
        rest.join(", ")
    );
}

fn main() {
    let config = require_microvms();
    let run_root = config.run_root.clone();
    let launcher = Launcher::new(config);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("load average at start: {}", load_average());
    runtime.block_on(async {
        // This boot also warms up the accelerator decision and the page cache; it is
        // not one of the samples.
        let vm = boot(&launcher, Some(AgentTransport::Vsock)).await;
        println!(
            "template {}, {} ({}), {} vCPU / {} MiB",
            TEMPLATE,
            vm.accel().accel,
            vm.accel().reason,
            vm.size().vcpus,
            vm.size().memory_mib
        );
        agent_footprint(&vm).await;
        let vsock = round_trips(&vm).await;
        stop(vm).await;
        let vm = boot(&launcher, Some(AgentTransport::Serial)).await;
        let serial = round_trips(&vm).await;
        stop(vm).await;
        println!(
            "serial link / vsock: request {:.2}x, exec {:.2}x, write_file {:.2}x \
             (local fork/exec drift between the two runs: {:.2}x)",
            ratio(serial.bare, vsock.bare),
            ratio(serial.exec, vsock.exec),
            ratio(serial.write, vsock.write),
            ratio(serial.local, vsock.local)
        );

        let (mut ready, mut calls) = (Vec::with_capacity(BOOTS), Vec::with_capacity(BOOTS));
        for _ in 0..BOOTS {
            let start = Instant::now();
            let vm = boot(&launcher, None).await;
            calls.push(start.elapsed());
            ready.push(vm.boot_duration());
            stop(vm).await;
        }
        ready.sort();
        calls.sort();
        let all: Vec<String> = ready.iter().map(|d| format!("{:.0}", millis(*d))).collect();
        let median = ready[BOOTS / 2];
        println!(
            "boot-to-ready over {BOOTS} sequential boots (QEMU start to Ready), {} transport",
            launcher.config().transport
        );
        println!(
            "boot-to-ready                            median {:>8.1} ms   min {:.1} ms   max {:.1} ms",
            millis(median),
            millis(ready[0]),
            millis(ready[BOOTS - 1])
        );
        println!("all boots (ms, sorted): {}", all.join(" "));
        println!(
            "Launcher::boot call                      median {:>8.1} ms",
            millis(calls[BOOTS / 2])
        );
        println!(
            "reference (the recipe's figure)                 {:>8.1} ms   measured / reference: {:.2}x",
            REFERENCE_BOOT_SECS * 1e3,
            median.as_secs_f64() / REFERENCE_BOOT_SECS
        );
    });
    let left = launcher.list().expect("list run folders");
    assert!(left.is_empty(), "run folders left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&run_root);
    println!("load average at end: {}", load_average());
}
