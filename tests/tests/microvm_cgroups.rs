//! Confinement in cgroups v2, in a real microVM whose agent is this workspace's: a
//! timeout or a deadline reaches background, double-forked and `setsid`'d children;
//! a fork bomb neither starves the agent nor outlives its exec; a memory hog is
//! reported as killed by the OOM killer; what a finished exec leaves behind is listed
//! and killable, and a finished exec's empty cgroup goes to the next exec; the agent
//! sits in its own cgroup and survives all of it.
//!
//! The test builds its own template (the busybox base with the agent built from this
//! checkout) into a folder of its own, so it never touches the shared `default`.
//! Measured figures (the worst `ps` round trip under the fork bomb, how long killing a
//! cgroup took) are printed; run with `--nocapture` to see them.

// Helpers unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sandbox_protocol::{
    Command, ConfinementMode, ErrorKind, ExecReply, ExecRequest, Pid, ProcessDetail, ProcessSpec,
    ProcessState, PtyOpenRequest, User, WindowSize,
};
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_tests::vm::{build_template, VmHost, CONNECT_SECS, POWER_OFF_SECS, READY_TIMEOUT_SECS};
use sandbox_tests::{binaries, exec_sh, TempDir};
use sandbox_vmm::client::{Client, ConnectOptions, ExecEvent};
use sandbox_vmm::launcher::{BootSpec, TemplateRef};

/// The longest a `ps` round trip may take while a fork bomb runs.
const PS_UNDER_BOMB_LIMIT: Duration = Duration::from_secs(2);

/// How long the fork bomb's cgroup may take to empty after its deadline: every task
/// has `SIGKILL` at once, but under TCG each exit costs a few milliseconds of
/// emulated CPU (about 3 s for 1,000 tasks measured), and the bomb reaches
/// `pids.max` (thousands). Under KVM it empties well within the exec's grace.
const BOMB_EMPTY_SECS: u64 = 30;

/// Runs `script` with a timeout and returns the reply and its wall time.
async fn exec_timed(client: &Client, script: &str, timeout: Duration) -> (ExecReply, Duration) {
    let mut request = exec_sh(script);
    request.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap());
    let started = Instant::now();
    let reply = client.exec(request).await.unwrap();
    (reply, started.elapsed())
}

/// Runs `script` and returns its stdout, asserting it exited 0.
async fn sh(client: &Client, script: &str) -> String {
    let reply = client.exec(exec_sh(script)).await.unwrap();
    assert_eq!(
        reply.exit.unwrap().code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&reply.stderr)
    );
    String::from_utf8(reply.stdout).unwrap()
}

/// How many `sleep` processes run in the guest (read from /proc, not `ps`).
async fn sleeps(client: &Client) -> usize {
    let script = r#"for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && echo $p; done; true"#;
    sh(client, script).await.lines().count()
}

/// The `ps_detail` row of `pid`.
async fn detail(client: &Client, pid: Pid) -> ProcessDetail {
    let rows = client.ps_detail().await.unwrap().expect("no ps_detail");
    rows.into_iter()
        .find(|row| row.info.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not listed by ps_detail"))
}

/// Polls `check` every 50 ms until it holds or `limit` passed; returns whether it held.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a fork bomb run measured.
struct Bomb {
    reply: ExecReply,
    /// The exec's wall time.
    took: Duration,
    /// The slowest `ps` round trip on the prober's connection, from the start until
    /// the bomb's cgroup was empty.
    worst_ps: Duration,
    probes: usize,
    /// From the exec's deadline until its cgroup held no process.
    gone_after_deadline: Duration,
    /// `pids.peak` of its cgroup.
    peak: String,
    cgroup: String,
}

/// The fork bomb's exec deadline.
const BOMB_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `script` (a fork bomb) with [`BOMB_TIMEOUT`] on `client` while `prober`
/// sends `ps` every 100 ms, until the bomb's cgroup is empty; panics if that takes
/// more than [`BOMB_EMPTY_SECS`] past the deadline.
async fn fork_bomb(client: &Client, prober: &Client, script: &'static str) -> Bomb {
    let started = Instant::now();
    let bomb_client = client.clone();
    let bomb = tokio::spawn(async move { exec_timed(&bomb_client, script, BOMB_TIMEOUT).await });
    let mut worst_ps = Duration::ZERO;
    let mut probes = 0;
    let probe = || async {
        let sent = Instant::now();
        prober.ps().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        sent.elapsed() - Duration::from_millis(100)
    };
    while !bomb.is_finished() {
        worst_ps = worst_ps.max(probe().await);
        probes += 1;
    }
    let (reply, took) = bomb.await.unwrap();
    let give_up = started + BOMB_TIMEOUT + Duration::from_secs(BOMB_EMPTY_SECS);
    let gone = loop {
        let row = detail(prober, reply.pid).await;
        if started.elapsed() > BOMB_TIMEOUT && row.live_pids == 0 {
            break started.elapsed() - BOMB_TIMEOUT;
        }
        assert!(
            Instant::now() < give_up,
            "the fork bomb's cgroup still holds tasks {BOMB_EMPTY_SECS}s after its deadline: {row:?}"
        );
        worst_ps = worst_ps.max(probe().await);
        probes += 1;
    };
    let cgroup = detail(prober, reply.pid).await.cgroup.unwrap();
    let peak = sh(client, &format!("cat /sys/fs/cgroup{cgroup}/pids.peak")).await;
    Bomb {
        reply,
        took,
        worst_ps,
        probes,
        gone_after_deadline: gone,
        peak: peak.trim().to_owned(),
        cgroup,
    }
}

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "workloads_are_confined_in_cgroups",
            run: || block_on(workloads_are_confined_in_cgroups()),
        },
        VmTest {
            name: "a_workload_that_breaks_the_cgroup_mount_or_proc_keeps_exec",
            run: || block_on(a_broken_cgroup_mount_keeps_exec()),
        },
    ])
}

/// A finished exec's empty cgroup goes to the next exec: execs sent one after
/// another keep to a few cgroups (they held one each for their records' five
/// minutes, 26 KiB of kernel memory apiece); one that leaves a process behind
/// keeps its own; a recycled cgroup removed under the agent is replaced.
async fn finished_execs_give_their_cgroups_on(client: &Client) {
    let count = async || {
        let listed = sh(client, "ls -d /sys/fs/cgroup/workload/exec-* | wc -l").await;
        listed.trim().parse::<usize>().unwrap()
    };
    let before = count().await;
    for _ in 0..20 {
        sh(client, "true").await;
    }
    let after = count().await;
    assert!(
        after <= before + 1,
        "20 execs made {} cgroups",
        after - before
    );

    let (left, _) = exec_timed(
        client,
        "sleep 600 >/dev/null 2>&1 &",
        Duration::from_secs(60),
    )
    .await;
    let kept = detail(client, left.pid).await.cgroup.unwrap();
    let next = exec_cgroup(client, "an exec that left a process").await;
    assert_ne!(
        next,
        format!("0::{kept}\n"),
        "a cgroup with a process went on"
    );
    assert_eq!(detail(client, left.pid).await.live_pids, 1);
    client.kill(left.pid, libc::SIGKILL).await.unwrap();

    // The last exec's cgroup waits for the next; a spawned process removes it.
    let waiting = exec_cgroup(client, "the kill").await;
    let path = format!("/sys/fs/cgroup{}", waiting.trim().trim_start_matches("0::"));
    client
        .spawn(ProcessSpec::new(Command::Shell(format!("rmdir {path}"))))
        .await
        .unwrap();
    let removed = eventually(Duration::from_secs(30), async || {
        client.stat(&path).await.is_err()
    })
    .await;
    assert!(removed, "{path} was not removed");
    let replaced = exec_cgroup(client, "the removal of a recycled cgroup").await;
    assert_ne!(replaced, waiting);
    assert!(replaced.starts_with("0::/workload/exec-"), "{replaced}");
}

/// The cgroup a fresh exec runs in, asserting it ran.
async fn exec_cgroup(client: &Client, after: &str) -> String {
    let reply = client
        .exec(exec_sh("cat /proc/self/cgroup"))
        .await
        .unwrap_or_else(|error| panic!("exec after {after}: {error}"));
    assert_eq!(
        reply.exit.as_ref().and_then(|e| e.code),
        Some(0),
        "exec after {after}: {}",
        String::from_utf8_lossy(&reply.stderr)
    );
    String::from_utf8(reply.stdout).unwrap()
}

/// Regression (issue 22, item 8): `umount -l /sys/fs/cgroup` (or `/proc`) in the
/// guest made every exec, spawn and eval fail with "Cannot make a cgroup" until the
/// VM stopped. Each way a root workload breaks the mount leaves exec working, back in
/// a cgroup of its own; one the agent cannot undo runs execs in process groups, says
/// so in `confinement`, and confines again once the mount is back.
async fn a_broken_cgroup_mount_keeps_exec() {
    let host = VmHost::get("microvm_cgroups").expect("run only with the gate open");
    let scratch = TempDir::new("cgroups-broken");
    let name = format!("e2e-cgroups-broken-{}", std::process::id());
    let built = build_template(&name, "busybox", &scratch.path().join("template"));
    let mut spec = BootSpec::new(TemplateRef::Path(built.dir.clone()));
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    let mut vm = host.launcher().boot(spec).await.unwrap();
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(CONNECT_SECS),
        ..ConnectOptions::default()
    };
    let client = vm.client(&options).await.unwrap();
    assert!(exec_cgroup(&client, "boot")
        .await
        .starts_with("0::/workload/exec-"));

    for attack in [
        "umount -l /sys/fs/cgroup",
        "mount -t tmpfs none /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/workload",
        "mount -o remount,ro /sys/fs/cgroup",
        "umount -l /proc",
        "umount -l /sys/fs/cgroup && umount -l /proc",
    ] {
        let reply = client.exec(exec_sh(attack)).await.unwrap();
        assert_eq!(
            reply.exit.as_ref().and_then(|e| e.code),
            Some(0),
            "{attack}: {}",
            String::from_utf8_lossy(&reply.stderr)
        );
        let own = exec_cgroup(&client, attack).await;
        assert!(
            own.starts_with("0::/workload/exec-"),
            "after {attack}: {own}"
        );
        let confinement = client.confinement().await.unwrap().unwrap();
        assert_eq!(
            confinement.mode,
            ConfinementMode::Cgroups,
            "after {attack}: {confinement:?}"
        );
        // The tree is the one set up at boot, limits and all.
        assert_eq!(
            sh(&client, "cat /sys/fs/cgroup/workload/pids.max")
                .await
                .trim(),
            confinement.pids_max.unwrap().to_string(),
            "after {attack}"
        );
        let spawned = client
            .spawn(ProcessSpec::new(Command::Shell("sleep 1".into())))
            .await
            .unwrap_or_else(|error| panic!("spawn after {attack}: {error}"));
        assert!(
            detail(&client, spawned).await.cgroup.is_some(),
            "after {attack}"
        );
    }

    // A cover the agent cannot lift (a read-only tmpfs over /sys/fs, where it would
    // make the mount point): execs run in process groups, and confinement says so.
    sh(&client, "mount -t tmpfs -o ro none /sys/fs").await;
    let own = exec_cgroup(&client, "a read-only /sys/fs").await;
    assert!(!own.contains("/workload/"), "{own}");
    let confinement = client.confinement().await.unwrap().unwrap();
    assert_eq!(
        confinement.mode,
        ConfinementMode::ProcessGroups,
        "{confinement:?}"
    );
    let reason = confinement.reason.unwrap_or_default();
    assert!(reason.contains("process groups"), "{reason}");
    let fresh = vm.client(&options).await.unwrap();
    assert!(
        !fresh.hello().capabilities.iter().any(|c| c == "cgroups"),
        "{:?}",
        fresh.hello()
    );
    drop(fresh);
    // Lifted, the next exec finds the tree whole again.
    sh(&client, "umount /sys/fs").await;
    let own = exec_cgroup(&client, "/sys/fs uncovered").await;
    assert!(own.starts_with("0::/workload/exec-"), "{own}");
    let confinement = client.confinement().await.unwrap().unwrap();
    assert_eq!(
        confinement.mode,
        ConfinementMode::Cgroups,
        "{confinement:?}"
    );
    assert_eq!(confinement.reason, None);

    assert!(client.info().await.unwrap().is_init);
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown(false)).await;
    let _ = tokio::time::timeout(Duration::from_secs(POWER_OFF_SECS), vm.wait_exit()).await;
    drop(vm);
    std::fs::remove_dir_all(&built.dir).unwrap();
}

async fn workloads_are_confined_in_cgroups() {
    let host = VmHost::get("microvm_cgroups").expect("run only with the gate open");
    let scratch = TempDir::new("cgroups");
    let name = format!("e2e-cgroups-{}", std::process::id());
    let built = build_template(&name, "busybox", &scratch.path().join("template"));
    // The launcher directly (not `VmHost::boot`): each VM has its own token, which
    // `Vm::client` presents.
    let mut spec = BootSpec::new(TemplateRef::Path(built.dir.clone()));
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    let mut vm = host.launcher().boot(spec).await.unwrap();
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(CONNECT_SECS),
        ..ConnectOptions::default()
    };
    let client = vm.client(&options).await.unwrap();

    // The agent is in its own leaf, every exec in a cgroup of its own.
    let hello = client.hello();
    assert!(
        hello.capabilities.iter().any(|c| c == "cgroups"),
        "{hello:?}"
    );
    let confinement = client.confinement().await.unwrap().unwrap();
    assert_eq!(
        confinement.mode,
        ConfinementMode::Cgroups,
        "{confinement:?}"
    );
    let memory_max = confinement.memory_max_bytes.unwrap();
    eprintln!(
        "workload limits: memory.max {} MiB, pids.max {}",
        memory_max >> 20,
        confinement.pids_max.unwrap()
    );
    assert_eq!(sh(&client, "cat /proc/1/cgroup").await, "0::/agent\n");
    // The child was born in the cgroup its record names (cloned into it).
    let (reply, _) = exec_timed(&client, "cat /proc/self/cgroup", Duration::from_secs(60)).await;
    let own = String::from_utf8_lossy(&reply.stdout).into_owned();
    assert!(own.starts_with("0::/workload/exec-"), "{own}");
    let recorded = detail(&client, reply.pid).await.cgroup.unwrap();
    assert_eq!(own, format!("0::{recorded}\n"));
    finished_execs_give_their_cgroups_on(&client).await;

    // Spawns and terminals get a cgroup of their own too.
    let spawned = client
        .spawn(ProcessSpec::new(Command::Shell("exec sleep 1000".into())))
        .await
        .unwrap();
    let terminal = client
        .pty_open(PtyOpenRequest {
            spec: ProcessSpec::new(Command::Shell("exec sleep 1001".into())),
            size: WindowSize { rows: 24, cols: 80 },
        })
        .await
        .unwrap();
    for (pid, kind) in [(spawned, "spawn"), (terminal, "pty")] {
        let cgroup = client
            .read_file(&format!("/proc/{pid}/cgroup"))
            .await
            .unwrap();
        let cgroup = String::from_utf8(cgroup).unwrap();
        assert!(
            cgroup.starts_with(&format!("0::/workload/{kind}-")),
            "{cgroup}"
        );
        let recorded = detail(&client, pid).await.cgroup.unwrap();
        assert_eq!(cgroup, format!("0::{recorded}\n"));
        client.kill(pid, libc::SIGKILL).await.unwrap();
    }

    // What the child does between clone and exec: a user switch (raw calls, never
    // libc's, which would change every thread of the agent), and an exec that fails.
    let mut request = exec_sh("id -u; id -g; cat /proc/self/oom_score_adj");
    request.spec.user = Some(User::Uid(65534));
    let reply = client.exec(request).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&reply.stdout), "65534\n65534\n0\n");
    assert_eq!(
        sh(&client, "id -u").await,
        "0\n",
        "the agent's user changed"
    );
    let missing = ExecRequest {
        spec: ProcessSpec::new(Command::Argv(vec!["/no/such/program".into()])),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    };
    let error = client.exec(missing).await.unwrap_err();
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    let client2 = client.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client2.clone();
            async move { sleeps(&client).await == 0 }
        })
        .await,
        "a killed spawn or terminal survived"
    );

    // A finished exec's leftover is listed, and `kill` of the exec's pid ends it.
    let (reply, _) = exec_timed(&client, "sleep 1000 & echo bg", Duration::from_secs(120)).await;
    assert_eq!(reply.exit.unwrap().code, Some(0));
    let row = detail(&client, reply.pid).await;
    assert!(matches!(row.info.state, ProcessState::Exited(_)), "{row:?}");
    assert_eq!(row.live_pids, 1, "{row:?}");
    assert_eq!(sleeps(&client).await, 1);
    client.kill(reply.pid, libc::SIGKILL).await.unwrap();
    let client2 = client.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client2.clone();
            async move { detail(&client, reply.pid).await.live_pids == 0 }
        })
        .await,
        "the leftover survived kill"
    );
    assert_eq!(sleeps(&client).await, 0);

    // `sh -c 'sleep 1000 & echo started'` returns at once; at its deadline the sleep goes.
    let deadline = Duration::from_secs(3);
    let started = Instant::now();
    let (reply, took) = exec_timed(&client, "sleep 1000 & echo started", deadline).await;
    assert!(
        !reply.timed_out && took < deadline,
        "{reply:?} after {took:?}"
    );
    assert_eq!(String::from_utf8_lossy(&reply.stdout), "started\n");
    assert_eq!(
        sleeps(&client).await,
        1,
        "the background sleep is not running"
    );
    tokio::time::sleep_until((started + deadline).into()).await;
    let client2 = client.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client2.clone();
            async move { sleeps(&client).await == 0 }
        })
        .await,
        "a background sleep outlived its exec's deadline"
    );
    eprintln!(
        "leftover of a finished exec gone {:.2?} after its deadline",
        started.elapsed() - deadline
    );

    // A `setsid`'d child (its own session and process group) dies at the timeout too.
    let (reply, took) = exec_timed(&client, "setsid sleep 999 & sleep 1000", deadline).await;
    assert!(reply.timed_out, "{reply:?}");
    assert_eq!(
        sleeps(&client).await,
        0,
        "a setsid'd child escaped the timeout"
    );
    eprintln!(
        "setsid'd child: reply (cgroup empty) {:.2?} after the deadline",
        took - deadline
    );

    // A cancelled exec goes with everything it started, as a timed-out one does.
    let mut request = exec_sh("setsid sleep 1002 & sleep 1000");
    request.stream = true;
    let mut stream = client.exec_stream(request).unwrap();
    assert!(matches!(
        stream.next().await.unwrap(),
        ExecEvent::Started(_)
    ));
    let client2 = client.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client2.clone();
            async move { sleeps(&client).await == 2 }
        })
        .await,
        "the cancel test's sleeps did not start"
    );
    stream.cancel().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client2.clone();
            async move { sleeps(&client).await == 0 }
        })
        .await,
        "a setsid'd child outlived its cancelled exec"
    );

    // A memory hog under a lowered limit is reported as OOM-killed.
    let hog = "echo 33554432 > /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max; \
               head -c 200000000 /dev/zero | tail; echo survived";
    let (reply, _) = exec_timed(&client, hog, Duration::from_secs(60)).await;
    assert!(!reply.timed_out, "{reply:?}");
    assert_eq!(reply.exit.unwrap().signal, Some(libc::SIGKILL), "{reply:?}");
    let oom = client
        .exec_oom_kill(&reply)
        .await
        .expect("no OOM kill reported");
    assert!(oom.kills >= 1);
    assert_eq!(oom.memory_max_bytes, Some(32 << 20));
    let text = oom.to_string();
    assert!(
        text.starts_with("killed by the OOM killer (") && text.contains("memory limit 32 MiB"),
        "{text}"
    );
    assert_eq!(detail(&client, reply.pid).await.oom, Some(oom));
    eprintln!("memory hog: {text}");

    // sandboxctl says so after the command's output, in `ps`, and `info` names the mode.
    let sandboxctl = |args: &[&str]| {
        let output = std::process::Command::new(&binaries().sandboxctl)
            .arg("--agent")
            .arg(vm.agent_url())
            .args(["--token", vm.token()])
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, _, stderr) = tokio::task::block_in_place(|| sandboxctl(&["sh", hog]));
    assert_eq!(code, Some(137), "{stderr}");
    assert!(stderr.contains(": killed by the OOM killer ("), "{stderr}");
    let (_, ps, _) = tokio::task::block_in_place(|| sandboxctl(&["ps"]));
    assert!(ps.contains(": killed by the OOM killer ("), "{ps}");
    let (_, info, _) = tokio::task::block_in_place(|| sandboxctl(&["info"]));
    assert!(
        info.lines()
            .any(|l| l.starts_with("confinement") && l.contains("cgroups (workload memory.max")),
        "{info}"
    );

    // A fork bomb under a 10 s timeout, twice: as reported (the shell returns at once
    // and the bomb runs on: killed at the exec's deadline) and with the shell still
    // running (killed by the timeout). The agent answers `ps` throughout, and
    // everything in the bomb's cgroup is killed at the deadline.
    let prober = vm.client(&options).await.unwrap();
    for (what, script, times_out) in [
        ("returns at once", "f() { f | f & }; f", false),
        (
            "runs on",
            "(f() { f | f & }; f) 2>/dev/null; exec sleep 100",
            true,
        ),
    ] {
        let bomb = fork_bomb(&client, &prober, script).await;
        eprintln!(
            "fork bomb that {what}: {} tasks at its peak; worst ps round trip {:.2?} over \
             {} probes; exec reply after {:.2?} (agent-side {:.2?}); every task gone \
             {:.2?} after the deadline",
            bomb.peak,
            bomb.worst_ps,
            bomb.probes,
            bomb.took,
            Duration::from_micros(bomb.reply.duration_us),
            bomb.gone_after_deadline,
        );
        assert_eq!(bomb.reply.timed_out, times_out, "{:?}", bomb.reply);
        assert!(
            bomb.worst_ps < PS_UNDER_BOMB_LIMIT,
            "ps took {:?} under the fork bomb",
            bomb.worst_ps
        );
        assert_eq!(
            sh(
                &client,
                &format!("cat /sys/fs/cgroup{}/cgroup.procs", bomb.cgroup)
            )
            .await,
            ""
        );
    }

    // The agent survived all of it, still in its own cgroup.
    assert_eq!(sh(&client, "cat /proc/1/cgroup").await, "0::/agent\n");
    assert!(client.info().await.unwrap().is_init);
    let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown(false)).await;
    let _ = tokio::time::timeout(Duration::from_secs(POWER_OFF_SECS), vm.wait_exit()).await;
    drop(vm);
    std::fs::remove_dir_all(&built.dir).unwrap();
    // Only succeeds when empty: the launcher's run root of this test process.
    let _ = std::fs::remove_dir(&host.launcher().config().run_root);
}
