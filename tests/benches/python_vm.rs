//! The `python` template in a real microVM, each figure next to its baseline measured
//! in the same run (these machines are noisy: read the ratios).
//! Run: `cargo bench -p sandbox-tests --bench python_vm`.
//!
//! Prints:
//! - in one VM, `1+1` evaluated in the template's warm session next to an exec of
//!   `python3 -c 'print(1+1)'` (what a snippet costs without sessions), interleaved:
//!   medians, 90th percentiles and the ratio;
//! - the first `eval` of `1+1` on a freshly claimed sandbox (a boot that restores the
//!   template's ready snapshot, a client, the eval) next to a cold boot and the same
//!   first eval, alternated: medians of the boot to a connected client, of the eval,
//!   and of both, and the ratio.
//!
//! Needs what the microVM tests need plus the python template; a missing one panics
//! with what to install or the command that builds it (`SANDBOX_SKIP_VM_TESTS` does
//! not apply). The VMs run under a private run root in the temp dir.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, EvalReply, EvalRequest, ExecRequest, Language, ProcessSpec};
use sandbox_tests::vm::{python_template, python_template_missing, TestVm, VmHost};
use sandbox_vmm::client::Client;
use sandbox_vmm::launcher::BootSpec;

/// The session the template warms at boot.
const WARM_SESSION: &str = "default";

/// Interleaved pairs of eval and exec (an exec of `python3` takes about half a
/// second under TCG).
const PAIRS: usize = 30;

/// Claims, and cold boots, alternated (a cold boot of this template starts an
/// interpreter before the agent answers: seconds under TCG).
const BOOTS: usize = 4;

fn eval_request() -> EvalRequest {
    EvalRequest {
        session: WARM_SESSION.to_owned(),
        language: Language::Python,
        code: "1+1".to_owned(),
        timeout_ms: None,
        restart: false,
    }
}

fn exec_request() -> ExecRequest {
    ExecRequest {
        spec: ProcessSpec::new(Command::Argv(vec![
            "python3".into(),
            "-c".into(),
            "print(1+1)".into(),
        ])),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

/// `1+1` in the warm session, which must answer `2` without starting anew.
async fn eval(client: &Client) -> EvalReply {
    let reply = client.eval(eval_request()).await.unwrap();
    assert_eq!(reply.value.as_deref(), Some("2"), "{reply:?}");
    assert!(!reply.session.started, "the warm session was not there");
    reply
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn p90(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() * 9 / 10]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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

/// One sandbox to its first answer: the boot to a connected client, then the eval.
struct FirstEval {
    boot: Duration,
    eval: Duration,
}

/// Boots the template (cold, or from its ready snapshot), then evaluates `1+1`.
async fn first_eval(host: &VmHost, cold: bool) -> (FirstEval, TestVm) {
    let mut spec = BootSpec::new(python_template());
    spec.cold = cold;
    let started = Instant::now();
    let vm = host.boot_spec(spec).await;
    let boot = started.elapsed();
    let started = Instant::now();
    let reply = eval(vm.client()).await;
    let eval = started.elapsed();
    assert_eq!(reply.session.evaluations, 1, "not the sandbox's first eval");
    let restored = vm.vm().record().restored_from.is_some();
    assert_eq!(restored, !cold, "cold {cold} but restored {restored}");
    (FirstEval { boot, eval }, vm)
}

async fn run() {
    let host = VmHost::for_bench();
    if let Some(what) = python_template_missing() {
        panic!("the benchmark cannot run: {what}");
    }
    println!("load average at start: {}", load_average());
    // This boot also warms the page cache and, the first time, takes the template's
    // ready snapshot; it is no sample.
    let vm = host.boot(python_template()).await;
    let client = vm.client();
    println!(
        "template python, {} ({}), {} vCPU / {} MiB",
        vm.vm().accel().accel,
        vm.vm().accel().reason,
        vm.vm().size().vcpus,
        vm.vm().size().memory_mib
    );
    for _ in 0..3 {
        eval(client).await;
        client.exec(exec_request()).await.unwrap();
    }
    let (mut evals, mut execs) = (Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        let started = Instant::now();
        let reply = client.exec(exec_request()).await.unwrap();
        execs.push(started.elapsed());
        assert_eq!(reply.stdout, b"2\n", "{reply:?}");

        let started = Instant::now();
        eval(client).await;
        evals.push(started.elapsed());
    }
    vm.shutdown().await;

    let (mut claims, mut colds) = (Vec::new(), Vec::new());
    for _ in 0..BOOTS {
        let (cold, vm) = first_eval(&host, true).await;
        vm.shutdown().await;
        colds.push(cold);
        let (claim, vm) = first_eval(&host, false).await;
        vm.shutdown().await;
        claims.push(claim);
    }

    let (eval_median, exec_median) = (median(&evals), median(&execs));
    println!("| measure | median | p90 | next to the baseline |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| exec of python3 -c 'print(1+1)' (x{PAIRS}, baseline) | {:.1} ms | {:.1} ms | 1x |",
        ms(exec_median),
        ms(p90(&execs))
    );
    println!(
        "| eval of 1+1 in the warm session (x{PAIRS}) | {:.1} ms | {:.1} ms | {:.3}x ({:.0}x faster) |",
        ms(eval_median),
        ms(p90(&evals)),
        eval_median.as_secs_f64() / exec_median.as_secs_f64(),
        exec_median.as_secs_f64() / eval_median.as_secs_f64()
    );
    let part = |runs: &[FirstEval], pick: fn(&FirstEval) -> Duration| {
        median(&runs.iter().map(pick).collect::<Vec<_>>())
    };
    let total = |run: &FirstEval| run.boot + run.eval;
    let cold_total = part(&colds, total);
    let claim_total = part(&claims, total);
    for (what, runs) in [
        ("cold boot", &colds),
        ("claim (restore the ready snapshot)", &claims),
    ] {
        println!(
            "| {what}, then the first eval (x{BOOTS}): boot to a client + eval | {:.0} + {:.0} ms | | |",
            ms(part(runs, |r| r.boot)),
            ms(part(runs, |r| r.eval)),
        );
    }
    println!(
        "| cold boot to the first eval's answer (baseline) | {:.0} ms | | 1x |",
        ms(cold_total)
    );
    println!(
        "| claim to the first eval's answer | {:.0} ms | | {:.3}x ({:.1}x faster) |",
        ms(claim_total),
        claim_total.as_secs_f64() / cold_total.as_secs_f64(),
        cold_total.as_secs_f64() / claim_total.as_secs_f64()
    );
    println!("load average at end: {}", load_average());
    host.assert_no_run_folders();
}

fn main() {
    sandbox_tests::vm::block_on(run());
}
