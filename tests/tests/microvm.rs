//! The agent in real microVMs, through real virtio-vsock (hybrid vsock served by
//! `vhost-device-vsock`), as the guest's PID 1.
//!
//! What only a microVM has; every transport-independent scenario runs in a microVM
//! too, from the `suite` target. A boot costs about 1.5 CPU-seconds under TCG, so this
//! file boots two VMs, at once, in one test:
//! - VM A serves the sections on readiness, PID 1's duties and `resumed` (which
//!   changes the machine's identity, so it comes last), one after the other, and is
//!   powered off by a `shutdown` request;
//! - VM B shows that two VMs answer at once with different boot ids, then powers off
//!   on `kill -TERM 1`, in the background while A's sections run.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` shows the
//! test as ignored (this target runs on `libtest-mimic`).

// Section helpers unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandbox_protocol::{Ready, MAGIC, PROTOCOL_VERSION};
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_tests::vm::{Sections, VmHost};
use sandbox_tests::{eventually, exec_sh, sh, wait_until_gone, within};
use sandbox_vmm::client::Client;

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "a_vm_is_ready_does_pid1_duties_and_powers_off_and_a_second_one_runs_alongside",
        run: || block_on(two_vms()),
    }])
}

async fn two_vms() {
    let host = VmHost::get("microvm").expect("run only with the gate open");
    let started = Instant::now();
    let (a, b) = tokio::join!(host.boot_default_cold(), host.boot_default_cold());
    eprintln!(
        "two VMs ready in {:.2?} (boot-to-ready {:.2?} and {:.2?}, {})",
        started.elapsed(),
        a.vm().boot_duration(),
        b.vm().boot_duration(),
        a.vm().accel().reason
    );
    let client = a.client().clone();
    let mut sections = Sections::new();

    sections
        .run(
            "readiness_reports_the_agent_version_and_boot_id",
            readiness(a.vm().ready().clone(), client.clone()),
        )
        .await;
    sections
        .run(
            "two_vms_answer_at_once_with_different_boot_ids",
            two_vms_at_once(client.clone(), b.client().clone()),
        )
        .await;
    sections.start("sigterm_to_pid_1_powers_the_guest_off", async move {
        let client = b.client().clone();
        let (console, took) = b
            .power_off(async move {
                // The reply may or may not beat the power-off; QEMU exiting is the test.
                let sent = within(10, client.exec(exec_sh("kill -TERM 1"))).await;
                eprintln!("`kill -TERM 1` answered {:?}", sent.map(|r| r.exit));
            })
            .await;
        assert!(
            console.contains("SIGTERM"),
            "agent never logged SIGTERM:\n{console}"
        );
        eprintln!("VM B powered off {took:.2?} after SIGTERM to PID 1");
    });
    sections
        .run("pid1_duties", pid1_duties(client.clone()))
        .await;
    // Changes the machine's identity, so it comes after everything that reads it.
    sections.run("resumed", resumed(client.clone())).await;
    drop(client);
    sections
        .run("shutdown_request_powers_the_guest_off", async move {
            let took = a.shutdown().await;
            eprintln!("VM A powered off {took:.2?} after the shutdown request");
        })
        .await;
    sections.finish().await;
    host.assert_no_run_folders();
}

async fn readiness(ready: Ready, client: Client) {
    let hello = client.hello();
    assert_eq!(ready.magic, MAGIC);
    assert_eq!(ready.version, PROTOCOL_VERSION);
    // The workspace shares one version, so a different one means a stale template.
    assert_eq!(
        ready.agent_version,
        env!("CARGO_PKG_VERSION"),
        "the template's agent is from another version: rebuild it (sandbox-rootfs build)"
    );
    assert_eq!(ready.agent_version, hello.agent_version);
    assert!(!ready.boot_id.is_empty());
    assert_eq!(ready.boot_id, hello.boot_id);
    assert!(ready.uptime_ms > 0);
    let info = client.info().await.unwrap();
    assert_eq!(info.boot_id, ready.boot_id);
    assert!(info.is_init, "the agent is not the guest's init: {info:?}");
    // `Ready` counts from the kernel's boot, `info` from the agent's start.
    let uptime = sh(&client, "cat /proc/uptime").await;
    let kernel_ms = uptime
        .split_whitespace()
        .next()
        .and_then(|secs| secs.parse::<f64>().ok())
        .map(|secs| secs * 1000.0)
        .unwrap();
    assert!(
        kernel_ms >= ready.uptime_ms as f64,
        "kernel uptime {kernel_ms} ms is less than {ready:?}"
    );
    assert!(
        (info.uptime_ms as f64) <= kernel_ms,
        "the agent started before the kernel: {info:?}, kernel {kernel_ms} ms"
    );
}

async fn two_vms_at_once(a: Client, b: Client) {
    assert_ne!(a.hello().boot_id, b.hello().boot_id);
    let script = "cat /proc/sys/kernel/random/boot_id";
    let (in_a, in_b) = tokio::join!(a.exec(exec_sh(script)), b.exec(exec_sh(script)));
    let (in_a, in_b) = (in_a.unwrap(), in_b.unwrap());
    assert_eq!(in_a.exit.unwrap().code, Some(0));
    assert_eq!(in_b.exit.unwrap().code, Some(0));
    assert_eq!(in_a.stdout.len(), 37, "{in_a:?}");
    assert_ne!(in_a.stdout, in_b.stdout, "two guests, one kernel boot id");
    let (info_a, info_b) = tokio::join!(a.info(), b.info());
    assert_ne!(info_a.unwrap().boot_id, info_b.unwrap().boot_id);
}

async fn pid1_duties(client: Client) {
    // Mounts.
    let mounts = sh(&client, "cat /proc/self/mounts").await;
    let mounted: Vec<(&str, &str)> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _source = fields.next()?;
            Some((fields.next()?, fields.next()?))
        })
        .collect();
    for (point, fstype) in [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/dev", "devtmpfs"),
        ("/dev/pts", "devpts"),
        ("/dev/shm", "tmpfs"),
        ("/run", "tmpfs"),
        ("/tmp", "tmpfs"),
    ] {
        assert!(
            mounted.contains(&(point, fstype)),
            "{point} ({fstype}) not mounted:\n{mounts}"
        );
    }

    // Hostname and loopback.
    assert_eq!(
        sh(&client, "cat /proc/sys/kernel/hostname").await,
        "sandbox\n"
    );
    let flags = sh(&client, "cat /sys/class/net/lo/flags").await;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
    let up = u32::try_from(libc::IFF_UP).unwrap();
    assert_eq!(flags & up, up, "lo is down");

    // The OOM killer spares the machine's init whatever its score, so the agent
    // leaves it at the default, and its children start there with nothing to reset.
    assert_eq!(sh(&client, "cat /proc/1/oom_score_adj").await.trim(), "0");
    // Regression: when init kept -1000, the reset used to come from the agent after
    // the child started, so whatever the child forked at once could keep it. A
    // subshell forks first.
    assert_eq!(
        sh(
            &client,
            "(cat /proc/self/oom_score_adj); cat /proc/self/oom_score_adj"
        )
        .await
        .split_whitespace()
        .collect::<Vec<_>>(),
        ["0", "0"]
    );

    // The vsock transport came from the baked-in module list.
    let modules = sh(&client, "cat /proc/modules").await;
    assert!(
        modules
            .lines()
            .any(|l| l.starts_with("vmw_vsock_virtio_transport ")),
        "{modules}"
    );

    // A double-forked orphan (its own session, so no group kill reaches it) is
    // adopted by PID 1 and reaped when it exits: no zombie is left.
    let orphan: i32 = sh(
        &client,
        "setsid sh -c 'sleep 2 </dev/null >/dev/null 2>&1 & echo $!'",
    )
    .await
    .trim()
    .parse()
    .unwrap();
    let stat_of_orphan = format!("cat /proc/{orphan}/stat");
    eventually(
        Duration::from_secs(10),
        "the orphan's adoption by PID 1",
        || async {
            let stat = sh(&client, &stat_of_orphan).await;
            // pid (comm) state ppid ...
            let after = stat.rsplit_once(") ").unwrap().1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let adopted = fields[1] == "1";
            if adopted {
                // Alive under PID 1: asleep, or still running on its way to the
                // sleep (seen right after a fast spawn), never a zombie.
                assert!(
                    matches!(fields[0], "S" | "R"),
                    "orphan neither sleeping nor running: {stat}"
                );
            }
            adopted.then_some(())
        },
    )
    .await;
    wait_until_gone(&client, orphan, "an orphan's exit and PID 1's reaping").await;
}

async fn resumed(client: Client) {
    let before = client
        .read_file("/etc/machine-id")
        .await
        .unwrap_or_default();
    let generation = client.info().await.unwrap().generation;
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let entropy: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(151) ^ 0x5a).collect();
    let info = client
        .resumed(u64::try_from(now_ns).unwrap(), entropy, true)
        .await
        .unwrap();
    assert_eq!(info.generation, generation + 1);
    let after = client.read_file("/etc/machine-id").await.unwrap();
    let id = String::from_utf8(after.clone()).unwrap();
    let id = id.trim();
    assert_eq!(id.len(), 32, "{id:?}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id:?}");
    assert_ne!(after, before, "machine-id unchanged");
    assert_eq!(client.info().await.unwrap().generation, generation + 1);
    // The guest clock was set to ours.
    let guest_secs: u64 = sh(&client, "date +%s").await.trim().parse().unwrap();
    let host_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        guest_secs.abs_diff(host_secs) <= 5,
        "guest clock {guest_secs}, host {host_secs}"
    );
}
