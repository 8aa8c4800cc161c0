//! Snapshots of a real microVM of the `default` template, next to the cold boot
//! measured in the same run (these machines are noisy: the ratios are what to read).
//! Run: `cargo bench -p sandbox-vmm --bench snapshots`.
//!
//! Prints:
//! - cold boot (`Launcher::boot` to a connected client), median of [`COLD_BOOTS`];
//! - the checkpoint pause of an idle VM (`stop` to `cont`), median of [`CHECKPOINTS`],
//!   and the whole call;
//! - the pause and call of a paused capture next to a live one (RAM copied while the
//!   guest runs) of one VM after its guest dirtied 0, 64 and 256 MiB; then the size,
//!   pause and call of a second checkpoint after 16 MiB more, incremental next to
//!   whole, for each method;
//! - start from a checkpoint (`branch -n 1` to a connected client) and a plain
//!   `Launcher::boot` that restores the template's ready snapshot, next to the cold
//!   boot;
//! - `fork -n N` to all N children answering, for N in [`FORKS`];
//! - memory per child (PSS of its QEMU from `/proc/PID/smaps_rollup`), idle and after
//!   each child wrote 32 MiB into its `/tmp`;
//! - hibernate (the call, the image's size on disk) and wake to the first answer.
//!
//! Needs what the microVM tests need; VMs and checkpoints go to private folders
//! under `/tmp`, checked empty at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)] // A benchmark fails by panicking.

use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ExecRequest, ProcessSpec};
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::snapshot::{BranchSpec, CaptureMethod, CheckpointSpec};
use sandbox_vmm::launcher::{BootSpec, Launcher, LauncherConfig, TemplateRef, Vm};

const TEMPLATE: &str = "default";
const COLD_BOOTS: usize = 3;
const CHECKPOINTS: usize = 5;
const FORKS: &[usize] = &[1, 4, 16];
const READY_TIMEOUT: Duration = Duration::from_secs(300);
const GRACE: Duration = Duration::from_secs(5);

fn spec() -> BranchSpec {
    BranchSpec {
        detached: false,
        ready_timeout: READY_TIMEOUT,
    }
}

async fn client(vm: &Vm) -> Client {
    vm.client(&ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("cannot reach VM {}: {}", vm.id(), error_chain(&e)))
}

async fn boot(launcher: &Launcher, cold: bool) -> Vm {
    let mut spec = BootSpec::new(TemplateRef::parse(TEMPLATE));
    spec.ready_timeout = READY_TIMEOUT;
    spec.cold = cold;
    launcher
        .boot(spec)
        .await
        .unwrap_or_else(|e| panic!("boot failed: {}", error_chain(&e)))
}

async fn sh(client: &Client, script: &str) {
    let request = ExecRequest {
        spec: ProcessSpec::new(Command::Shell(script.into())),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    };
    let reply = client.exec(request).await.unwrap();
    assert_eq!(reply.exit.and_then(|e| e.code), Some(0), "{script}");
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = text
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // utime and stime: fields 14 and 15 of stat(5), here 11 and 12 from `state` on.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf takes an integer and returns one.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Duration::from_millis(ticks * 1000 / per_second)
}

/// PSS of a process in MiB (`Pss:` of `/proc/PID/smaps_rollup`).
fn pss_mib(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let kib: f64 = text
        .lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Pause and call of each capture method on one VM as its guest dirties more RAM
/// (random bytes into a tmpfs, so they are neither zero nor freed).
async fn dirtied_checkpoints(launcher: &Launcher) {
    const ROUNDS: usize = 2;
    let vm = boot(launcher, false).await;
    let c = client(&vm).await;
    sh(
        &c,
        "mkdir -p /mnt/dirty && mount -t tmpfs -o size=400m tmpfs /mnt/dirty",
    )
    .await;
    let mut dirtied = 0u64;
    let take = |method| {
        let id = vm.id().clone();
        async move {
            let spec = CheckpointSpec {
                method,
                ..CheckpointSpec::default()
            };
            let checkpoint = launcher
                .checkpoint(&id, spec)
                .await
                .unwrap_or_else(|e| panic!("{method:?} checkpoint failed: {}", error_chain(&e)));
            launcher.delete_checkpoint(&checkpoint.manifest.id).unwrap();
            checkpoint
        }
    };
    for target in [0u64, 64, 256] {
        if target > dirtied {
            let bytes = (target - dirtied) << 20;
            sh(
                &c,
                &format!("head -c {bytes} /dev/urandom > /mnt/dirty/{target}"),
            )
            .await;
            dirtied = target;
        }
        let (mut paused, mut live) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            paused.push(take(CaptureMethod::Paused).await);
            live.push(take(CaptureMethod::Live).await);
        }
        let pause = |v: &[sandbox_vmm::launcher::snapshot::Checkpoint]| {
            median(v.iter().map(|c| c.pause).collect())
        };
        let call = |v: &[sandbox_vmm::launcher::snapshot::Checkpoint]| {
            median(v.iter().map(|c| c.total).collect())
        };
        println!(
            "| checkpoint after the guest dirtied {target} MiB: pause paused / live (median of {ROUNDS}) | {:.0} / {:.0} ms | live {:.2}x of paused |",
            ms(pause(&paused)),
            ms(pause(&live)),
            pause(&live).as_secs_f64() / pause(&paused).as_secs_f64()
        );
        println!(
            "| the same, whole call paused / live | {:.0} / {:.0} ms | live {:.2}x of paused |",
            ms(call(&paused)),
            ms(call(&live)),
            call(&live).as_secs_f64() / call(&paused).as_secs_f64()
        );
    }
    // A second checkpoint after 16 MiB more: whole (as before incremental images)
    // next to incremental, each method, on the same first checkpoint.
    let keep = |method, incremental| {
        let id = vm.id().clone();
        async move {
            let spec = CheckpointSpec {
                method,
                incremental,
                ..CheckpointSpec::default()
            };
            launcher
                .checkpoint(&id, spec)
                .await
                .unwrap_or_else(|e| panic!("{method:?} checkpoint failed: {}", error_chain(&e)))
        }
    };
    let first = keep(CaptureMethod::Paused, false).await;
    sh(&c, "head -c 16777216 /dev/urandom > /mnt/dirty/more").await;
    for method in [CaptureMethod::Paused, CaptureMethod::Live] {
        let (mut whole, mut diff) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            for (incremental, into) in [(false, &mut whole), (true, &mut diff)] {
                let second = keep(method, incremental).await;
                launcher.delete_checkpoint(&second.manifest.id).unwrap();
                into.push(second);
            }
        }
        let pick = |v: &[sandbox_vmm::launcher::snapshot::Checkpoint]| {
            (
                median(v.iter().map(|c| c.pause).collect()),
                median(v.iter().map(|c| c.total).collect()),
                v[0].manifest.ram_bytes as f64 / 1048576.0,
            )
        };
        let ((whole_pause, whole_call, whole_mib), (diff_pause, diff_call, diff_mib)) =
            (pick(&whole), pick(&diff));
        println!(
            "| second checkpoint after 16 MiB more, {method:?}: RAM image / pause / call, incremental | {diff_mib:.1} MiB / {:.0} ms / {:.0} ms | whole {whole_mib:.1} MiB / {:.0} ms / {:.0} ms (first {:.1} MiB) |",
            ms(diff_pause),
            ms(diff_call),
            ms(whole_pause),
            ms(whole_call),
            first.manifest.ram_bytes as f64 / 1048576.0,
        );
        println!(
            "| the same, incremental / whole | size {:.3}x, pause {:.2}x, call {:.2}x | |",
            diff_mib / whole_mib,
            diff_pause.as_secs_f64() / whole_pause.as_secs_f64(),
            diff_call.as_secs_f64() / whole_call.as_secs_f64()
        );
    }
    // The first branch of an incremental checkpoint flattens it; the next does not.
    let diff = keep(CaptureMethod::Paused, true).await;
    let mut branches = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        let children = launcher
            .branch(&diff.manifest.id, 1, BranchSpec::default())
            .await
            .unwrap_or_else(|e| panic!("branch failed: {}", error_chain(&e)));
        let _ = client(&children[0]).await;
        branches.push(started.elapsed());
        for child in children {
            child.shutdown(GRACE).await.unwrap();
        }
    }
    println!(
        "| branch -n 1 of an incremental checkpoint to first answer: first (flattens) / next | {:.0} / {:.0} ms | first {:.2}x of next |",
        ms(branches[0]),
        ms(branches[1]),
        branches[0].as_secs_f64() / branches[1].as_secs_f64()
    );
    launcher.delete_checkpoint(&diff.manifest.id).unwrap();
    launcher.delete_checkpoint(&first.manifest.id).unwrap();
    drop(c);
    vm.shutdown(GRACE).await.unwrap();
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let scratch = std::env::temp_dir().join(format!("sbx-snapbench-{}", std::process::id()));
    let mut config = LauncherConfig::from_env().expect("launcher configuration");
    config.run_root = scratch.join("run");
    config.checkpoint_root = scratch.join("checkpoints");
    let launcher = Launcher::new(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Warm-up boot (accelerator decision, page cache, the template's ready
        // snapshot); not a sample.
        boot(&launcher, false).await.shutdown(GRACE).await.unwrap();

        let mut cold = Vec::new();
        for _ in 0..COLD_BOOTS {
            let started = Instant::now();
            let vm = boot(&launcher, true).await;
            client(&vm).await.ps().await.unwrap();
            cold.push(started.elapsed());
            vm.shutdown(GRACE).await.unwrap();
        }
        let cold = median(cold);

        let mut ready = Vec::new();
        for _ in 0..COLD_BOOTS {
            let started = Instant::now();
            let vm = boot(&launcher, false).await;
            client(&vm).await.ps().await.unwrap();
            ready.push(started.elapsed());
            assert!(vm.record().restored_from.is_some(), "the boot did not restore");
            vm.shutdown(GRACE).await.unwrap();
        }
        let ready = median(ready);

        let parent = boot(&launcher, true).await;
        let size = parent.size();
        println!(
            "template {TEMPLATE}: {} vCPU / {} MiB, {}",
            size.vcpus,
            size.memory_mib,
            parent.accel().accel
        );
        let (mut pauses, mut totals) = (Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..CHECKPOINTS {
            let checkpoint = launcher
                .checkpoint(parent.id(), CheckpointSpec::default())
                .await
                .unwrap_or_else(|e| panic!("checkpoint failed: {}", error_chain(&e)));
            pauses.push(checkpoint.pause);
            totals.push(checkpoint.total);
            if let Some(previous) = last.replace(checkpoint.manifest.id.clone()) {
                launcher.delete_checkpoint(&previous).unwrap();
            }
        }
        let checkpoint_id = last.unwrap();
        let manifest = launcher
            .checkpoints()
            .unwrap()
            .into_iter()
            .find(|c| c.manifest.id == checkpoint_id)
            .unwrap()
            .manifest;

        let mut restores = Vec::new();
        for _ in 0..COLD_BOOTS {
            let started = Instant::now();
            let children = launcher.branch(&checkpoint_id, 1, spec()).await.unwrap();
            client(&children[0]).await.ps().await.unwrap();
            restores.push(started.elapsed());
            for vm in children {
                vm.shutdown(GRACE).await.unwrap();
            }
        }
        let restore = median(restores);

        println!("| measure | value | next to a cold boot |");
        println!("| --- | --- | --- |");
        println!(
            "| cold boot to first answer (median of {COLD_BOOTS}) | {:.0} ms | 1.00x |",
            ms(cold)
        );
        println!(
            "| checkpoint pause, idle VM (median of {CHECKPOINTS}) | {:.1} ms | |",
            ms(median(pauses))
        );
        println!(
            "| checkpoint call, idle VM (median) | {:.0} ms | |",
            ms(median(totals))
        );
        println!(
            "| checkpoint size: device state / RAM image on disk | {:.2} MiB / {:.1} MiB | |",
            manifest.state_bytes as f64 / 1048576.0,
            manifest.ram_bytes as f64 / 1048576.0
        );
        println!(
            "| start from checkpoint to first answer (median of {COLD_BOOTS}) | {:.0} ms | {:.1}x faster |",
            ms(restore),
            cold.as_secs_f64() / restore.as_secs_f64()
        );
        println!(
            "| Launcher::boot from the template's ready snapshot (median of {COLD_BOOTS}) | {:.0} ms | {:.1}x faster |",
            ms(ready),
            cold.as_secs_f64() / ready.as_secs_f64()
        );

        dirtied_checkpoints(&launcher).await;

        for &n in FORKS {
            let started = Instant::now();
            let fork = launcher
                .fork(parent.id(), n, spec())
                .await
                .unwrap_or_else(|e| panic!("fork -n {n} failed: {}", error_chain(&e)));
            for child in &fork.children {
                client(child).await.ps().await.unwrap();
            }
            let took = started.elapsed();
            let pids: Vec<u32> = fork.children.iter().filter_map(Vm::qemu_pid).collect();
            // What the children's QEMUs spent to get there: on this machine's cores
            // the fork cannot answer sooner than that work divided among them.
            let cpu: Duration = pids.iter().map(|&p| cpu_time(p)).sum();
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let idle: f64 = pids.iter().map(|&p| pss_mib(p)).sum::<f64>() / n as f64;
            for child in &fork.children {
                sh(&client(child).await, "head -c 33554432 /dev/urandom > /tmp/fill").await;
            }
            let written: f64 = pids.iter().map(|&p| pss_mib(p)).sum::<f64>() / n as f64;
            println!(
                "| fork -n {n} to all answering (pause {:.0} ms) | {:.0} ms | {:.2}x of one cold boot |",
                ms(fork.checkpoint.pause),
                ms(took),
                took.as_secs_f64() / cold.as_secs_f64()
            );
            println!(
                "| fork -n {n}: host CPU of the children's QEMUs until then, per child / over {cores} cores | {:.0} ms / {:.0} ms | {:.0}% of the time to all answering |",
                ms(cpu / u32::try_from(n).unwrap()),
                ms(cpu / u32::try_from(cores).unwrap()),
                100.0 * (cpu.as_secs_f64() / cores as f64) / took.as_secs_f64()
            );
            println!(
                "| PSS per child, {n} children: idle / after writing 32 MiB | {idle:.1} MiB ({:.1}% of RAM) / {written:.1} MiB | |",
                100.0 * idle / size.memory_mib as f64
            );
            for vm in fork.children {
                vm.shutdown(GRACE).await.unwrap();
            }
        }
        parent.shutdown(GRACE).await.unwrap();
        // Hibernate a VM (detached: a held handle would remove its folder when
        // dropped), then wake it.
        let mut spec = BootSpec::new(TemplateRef::parse(TEMPLATE));
        spec.ready_timeout = READY_TIMEOUT;
        spec.detached = true;
        let sleeper = launcher.boot(spec).await.unwrap();
        client(&sleeper).await.ps().await.unwrap();
        let id = sleeper.detach().expect("a detached VM").id;
        let hibernated = launcher.hibernate(&id).await.unwrap();
        let started = Instant::now();
        let woken = launcher.wake(&id).await.unwrap();
        let url = woken.record.agent_url.parse().unwrap();
        let token = std::fs::read_to_string(launcher.config().run_root.join(id.as_str()).join("token")).unwrap();
        let options = ConnectOptions {
            token: Some(token.trim().to_owned()),
            ..ConnectOptions::default()
        };
        Client::connect(&url, &options).await.unwrap().ps().await.unwrap();
        let wake = started.elapsed();
        println!(
            "| hibernate (idle VM): call / image on disk | {:.0} ms / {:.1} MiB | |",
            ms(hibernated.took),
            hibernated.bytes_on_disk as f64 / 1048576.0
        );
        println!(
            "| wake to first answer | {:.0} ms | {:.1}x faster |",
            ms(wake),
            cold.as_secs_f64() / wake.as_secs_f64()
        );
        launcher.stop(&id, GRACE).await.unwrap();
        for checkpoint in launcher.checkpoints().unwrap() {
            launcher.delete_checkpoint(&checkpoint.manifest.id).unwrap();
        }
    });
    let left = launcher.list().unwrap();
    assert!(left.is_empty(), "run folders left: {left:?}");
    let _ = std::fs::remove_dir_all(&scratch);
}
