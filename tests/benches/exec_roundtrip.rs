//! Exec round trip of `true` through the agent over one kept Unix-socket connection,
//! next to a local fork/exec of `true` measured in the same run (these machines are
//! noisy, so only the ratio means much). Run: `cargo bench -p sandbox-tests`.
//!
//! Prints medians and 90th percentiles of: a bare request round trip (`ps` on an
//! empty table), a local `std::process::Command::new("true").status()`, and an agent
//! exec of `true`; then the agent's overhead over the local spawn. Then `1+1` in
//! Python both ways through the agent: an `eval` in a warm session, and a cold exec
//! of `python3 -c 1+1` (what running a snippet costs without sessions); their ratio.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, EvalRequest, ExecRequest, Language, ProcessSpec};
use sandbox_tests::TestAgent;

const RUNS: usize = 1000;

/// Runs of the Python comparison: a cold interpreter costs tens of milliseconds.
const PYTHON_RUNS: usize = 200;

fn summary(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p90 = samples[samples.len() * 9 / 10];
    println!(
        "{name:<34} median {:>7.1} µs   p90 {:>7.1} µs",
        micros(median),
        micros(p90)
    );
    median
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let agent = TestAgent::start();
    runtime.block_on(async {
        let client = agent.client().await;
        let true_request = ExecRequest {
            spec: ProcessSpec::new(Command::Argv(vec!["true".into()])),
            stdin: Vec::new(),
            timeout_ms: None,
            stream: false,
        };
        // Warm up both paths (page cache, allocator, lazy statics).
        for _ in 0..50 {
            client.exec(true_request.clone()).await.unwrap();
            std::process::Command::new("true").status().unwrap();
        }
        // The bare round trip first, while the process table is small.
        let mut bare = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let start = Instant::now();
            client.ps().await.unwrap();
            bare.push(start.elapsed());
        }
        // Interleave so both see the same machine load.
        let (mut local, mut remote) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
        for _ in 0..RUNS {
            let start = Instant::now();
            let status = std::process::Command::new("true").status().unwrap();
            local.push(start.elapsed());
            assert!(status.success());

            let start = Instant::now();
            let reply = client.exec(true_request.clone()).await.unwrap();
            remote.push(start.elapsed());
            assert_eq!(reply.exit.and_then(|e| e.code), Some(0));
        }
        println!("{RUNS} runs each, one kept connection");
        summary("request round trip (ps)", bare);
        let local = summary("local fork/exec of true", local);
        let remote = summary("agent exec of true (unix socket)", remote);
        println!(
            "agent exec / local spawn: {:.2}x; agent overhead {:.1} µs",
            remote.as_secs_f64() / local.as_secs_f64(),
            micros(remote.saturating_sub(local))
        );

        let cold_request = ExecRequest {
            spec: ProcessSpec::new(Command::Argv(vec![
                "python3".into(),
                "-c".into(),
                "1+1".into(),
            ])),
            ..true_request
        };
        let eval_request = EvalRequest {
            session: "bench".into(),
            language: Language::Python,
            code: "1+1".into(),
            timeout_ms: None,
            restart: false,
        };
        // The session's start (and a first cell) is not what is measured.
        for _ in 0..10 {
            let reply = client.eval(eval_request.clone()).await.unwrap();
            assert_eq!(reply.value.as_deref(), Some("2"));
            client.exec(cold_request.clone()).await.unwrap();
        }
        let (mut cold, mut warm) = (
            Vec::with_capacity(PYTHON_RUNS),
            Vec::with_capacity(PYTHON_RUNS),
        );
        for _ in 0..PYTHON_RUNS {
            let start = Instant::now();
            let reply = client.exec(cold_request.clone()).await.unwrap();
            cold.push(start.elapsed());
            assert_eq!(reply.exit.and_then(|e| e.code), Some(0));

            let start = Instant::now();
            let reply = client.eval(eval_request.clone()).await.unwrap();
            warm.push(start.elapsed());
            assert_eq!(reply.value.as_deref(), Some("2"));
        }
        println!("{PYTHON_RUNS} runs each, the same connection");
        let cold = summary("exec of python3 -c 1+1 (cold)", cold);
        let warm = summary("eval of 1+1 (warm session)", warm);
        println!(
            "warm eval / cold exec: {:.3}x ({:.1}x faster)",
            warm.as_secs_f64() / cold.as_secs_f64(),
            cold.as_secs_f64() / warm.as_secs_f64()
        );
    });
}
