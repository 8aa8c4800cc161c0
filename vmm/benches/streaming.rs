//! Output that costs what it weighs: a streamed exec next to the same command with
//! its output to `/dev/null`, in the same guest and the same run (these machines
//! are noisy, so the runs are interleaved and only the ratios mean much).
//! Run: `cargo bench -p sandbox-vmm --bench streaming`.
//!
//! Prints, for `seq 1 2000000`, `head -c 20000000 /dev/zero | cat` and
//! `dd if=/dev/zero bs=1M count=20`:
//! - in a microVM of the `default` template over its serial link (the default
//!   transport): the median of [`TRIALS`] streamed execs (every chunk read by the
//!   client), the median of as many execs of `CMD > /dev/null`, their ratio, and the
//!   bytes and chunks the client received;
//! - on the workspace's agent over a Unix socket on this host: the same streamed
//!   exec next to `sh -c 'CMD > /dev/null'` run locally.
//!
//! Needs QEMU, `qemu-img`, the `default` template and the agent's musl build (both
//! made by `sandbox-rootfs build`); a missing one panics with what to do.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions, ExecEvent};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::{AgentTransport, BootSpec, Launcher, LauncherConfig, TemplateRef};

/// The template booted.
const TEMPLATE: &str = "default";

/// Runs of each command each way.
const TRIALS: usize = 3;

/// The commands measured.
const COMMANDS: [&str; 3] = [
    "seq 1 2000000",
    "head -c 20000000 /dev/zero | cat",
    "dd if=/dev/zero bs=1M count=20 2>/dev/null",
];

/// How long a boot may take to report ready (TCG on a busy 2-core host is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long QEMU gets to exit on `SIGTERM`.
const GRACE: Duration = Duration::from_secs(5);

/// What one streamed exec delivered.
struct Streamed {
    took: Duration,
    bytes: u64,
    chunks: u64,
}

fn request(script: &str, stream: bool) -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Shell(script.into())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream,
    }
}

/// Runs `script` streamed, reading every chunk, to its end.
async fn streamed(client: &Client, script: &str) -> Streamed {
    let started = Instant::now();
    let mut stream = client.exec_stream(request(script, true)).unwrap();
    let (mut bytes, mut chunks) = (0u64, 0u64);
    loop {
        match stream.next().await.unwrap() {
            ExecEvent::Started(_) => {}
            ExecEvent::Output(chunk) => {
                bytes += chunk.data.len() as u64;
                chunks += 1;
            }
            ExecEvent::Finished(reply) => {
                assert_eq!(
                    reply.exit.and_then(|e| e.code),
                    Some(0),
                    "{script}: {reply:?}"
                );
                break;
            }
        }
    }
    Streamed {
        took: started.elapsed(),
        bytes,
        chunks,
    }
}

/// Runs `script > /dev/null` in the same guest.
async fn discarded(client: &Client, script: &str) -> Duration {
    let started = Instant::now();
    let reply = client
        .exec(request(&format!("{{ {script}; }} > /dev/null"), false))
        .await
        .unwrap();
    assert_eq!(
        reply.exit.and_then(|e| e.code),
        Some(0),
        "{script} > /dev/null: {reply:?}"
    );
    started.elapsed()
}

/// Runs `script > /dev/null` on this host.
fn local(script: &str) -> Duration {
    let started = Instant::now();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{{ {script}; }} > /dev/null"))
        .status()
        .unwrap();
    assert!(status.success(), "{script} locally: {status}");
    started.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Each command streamed next to its baseline, interleaved; `baseline` is run
/// between the streamed runs.
async fn compare<F, Fut>(label: &str, client: &Client, mut baseline: F)
where
    F: FnMut(&'static str) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    for command in COMMANDS {
        let (mut streams, mut bases) = (Vec::new(), Vec::new());
        let (mut bytes, mut chunks) = (0, 0);
        for _ in 0..TRIALS {
            let run = streamed(client, command).await;
            streams.push(run.took);
            (bytes, chunks) = (run.bytes, run.chunks);
            bases.push(baseline(command).await);
        }
        let (stream, base) = (median(streams), median(bases));
        println!(
            "{label:<8} {command:<44} streamed {:>8.0} ms  baseline {:>8.0} ms  = {:>5.2}x  \
             ({bytes} B in {chunks} chunks, {:.0} B each)",
            millis(stream),
            millis(base),
            stream.as_secs_f64() / base.as_secs_f64(),
            bytes as f64 / chunks.max(1) as f64,
        );
    }
}

fn require_microvms() -> LauncherConfig {
    let mut config = LauncherConfig::from_env()
        .unwrap_or_else(|error| panic!("no launcher configuration: {}", error_chain(&error)));
    let template = config.templates_root().join(TEMPLATE).join("template.json");
    assert!(
        template.is_file(),
        "the streaming benchmark needs {} (build it: sandbox-rootfs build)",
        template.display()
    );
    // Short: the sockets inside must fit in 108 bytes.
    config.run_root = PathBuf::from(format!("/tmp/sbx-stream-{}", std::process::id()));
    config
}

/// The workspace's musl agent, as `sandbox-rootfs build` leaves it.
fn agent_binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let binary = target.join("x86_64-unknown-linux-musl/agent/sandbox-agent");
    assert!(
        binary.is_file(),
        "the streaming benchmark needs {} (sandbox-rootfs build makes it)",
        binary.display()
    );
    binary
}

fn main() {
    let config = require_microvms();
    let run_root = config.run_root.clone();
    let launcher = Launcher::new(config);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut spec = BootSpec::new(TemplateRef::parse(TEMPLATE));
        spec.ready_timeout = READY_TIMEOUT;
        spec.transport = Some(AgentTransport::Serial);
        let vm = launcher
            .boot(spec)
            .await
            .unwrap_or_else(|error| panic!("booting {TEMPLATE} failed: {}", error_chain(&error)));
        println!(
            "template {TEMPLATE}, {} vCPU / {} MiB, {}, serial link; {TRIALS} runs each, medians",
            vm.size().vcpus,
            vm.size().memory_mib,
            vm.accel().accel,
        );
        let client = vm.client(&ConnectOptions::default()).await.unwrap();
        compare("microVM", &client, |command| discarded(&client, command)).await;
        drop(client);
        vm.shutdown(GRACE).await.unwrap();

        let socket = run_root.join("agent.sock");
        std::fs::create_dir_all(&run_root).unwrap();
        let mut agent = std::process::Command::new(agent_binary())
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .env("SANDBOX_AGENT_TOKEN", "bench")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let url: AgentUrl = format!("unix://{}", socket.display()).parse().unwrap();
        let options = ConnectOptions {
            token: Some("bench".into()),
            ..ConnectOptions::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let client = Client::connect_with_retry(&url, &options, deadline)
            .await
            .unwrap();
        compare("local", &client, |command| async move { local(command) }).await;
        drop(client);
        agent.kill().unwrap();
        agent.wait().unwrap();
    });
    std::fs::remove_dir_all(&run_root).ok();
}
