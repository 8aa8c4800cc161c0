//! The agent in real microVMs, through real virtio-vsock (hybrid vsock served by
//! `vhost-device-vsock`), as the guest's PID 1.
//!
//! A boot costs about 1.5 CPU-seconds under TCG, so this file boots two VMs, at once,
//! in one test:
//! - VM A serves every section whose state cannot disturb another's, one after the
//!   other (each section uses its own paths and processes), and is powered off last
//!   by a `shutdown` request;
//! - VM B shows that two VMs answer at once with different boot ids, then powers off
//!   on `kill -TERM 1`, in the background while A's sections run.
//!
//! Needs QEMU, `vhost-device-vsock` and the default template (see `sandbox_tests::vm`);
//! `SANDBOX_SKIP_VM_TESTS=1` skips, saying so.

// Section helpers unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandbox_protocol::limits::{MAX_FRAME_BYTES, READ_FILE_CAP_BYTES, RING_BYTES};
use sandbox_protocol::{
    AgentMsg, ClientMsg, ErrorKind, ExecReply, ExecRequest, FileKind, Hello, Pid, ProcessKind,
    ProcessState, PtyOpenRequest, Ready, RequestId, Stream, WindowSize, MAGIC, PROTOCOL_VERSION,
};
use sandbox_tests::screen::Screen;
use sandbox_tests::vm::{options_for, RawConnection, Sections, VmHost};
use sandbox_tests::{argv, exec_sh, follow_to_end, ps_entry, shell, wait_exit, within};
use sandbox_vmm::client::{AgentUrl, Client};
use sha2::{Digest, Sha256};

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_vm_serves_every_feature_and_a_second_one_runs_alongside() {
    let Some(host) = VmHost::get("microvm") else {
        return;
    };
    let started = Instant::now();
    let (a, b) = tokio::join!(host.boot_default(), host.boot_default());
    eprintln!(
        "two VMs ready in {:.2?} (boot-to-ready {:.2?} and {:.2?}, {})",
        started.elapsed(),
        a.vm().boot_duration(),
        b.vm().boot_duration(),
        a.vm().accel().reason
    );
    let client = a.client().clone();
    let url = a.vm().agent_url();
    let boot_id = client.hello().boot_id.clone();
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
    sections.run("exec", exec(client.clone())).await;
    sections
        .run("spawn_logs_follow", spawn_logs(client.clone()))
        .await;
    sections
        .run("kill_and_ps", kill_and_ps(client.clone()))
        .await;
    sections.run("pty", pty(client.clone(), url.clone())).await;
    sections.run("files", files(client.clone())).await;
    sections
        .run("put_get_64_mib", put_get(client.clone()))
        .await;
    sections
        .run("pid1_duties", pid1_duties(client.clone()))
        .await;
    sections
        .run(
            "malformed_frames_over_real_vsock",
            malformed_frames(a.vm().agent_socket(), a.vm().agent_port(), url, boot_id),
        )
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

/// Runs `script` and returns its stdout as text, asserting it exited 0.
async fn sh(client: &Client, script: &str) -> String {
    let reply = within(60, client.exec(exec_sh(script))).await.unwrap();
    assert_eq!(
        reply.exit.unwrap().code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&reply.stderr)
    );
    String::from_utf8(reply.stdout).unwrap()
}

/// Polls the guest until `/proc/PID` is gone, or fails after `secs`.
async fn assert_gone(client: &Client, pid: i32, what: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let stat = sh(client, &format!("cat /proc/{pid}/stat 2>/dev/null; true")).await;
        if stat.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} {pid} still in /proc after {secs}s: {stat}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn exec(client: Client) {
    // Each stream keeps its order.
    let reply = client
        .exec(exec_sh("echo a; echo b >&2; echo c; seq 1 20000"))
        .await
        .unwrap();
    let expected: String = std::iter::once("a\nc\n".to_owned())
        .chain((1..=20000).map(|i| format!("{i}\n")))
        .collect();
    assert!(String::from_utf8(reply.stdout).unwrap() == expected);
    assert_eq!(reply.stderr, b"b\n");
    assert!(!reply.stdout_truncated && !reply.stderr_truncated);

    // Past 1 MiB: capped, flagged, and the writer is drained, not blocked.
    let started = Instant::now();
    let reply = within(
        60,
        client.exec(exec_sh("head -c 3000000 /dev/zero; echo done >&2")),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!(reply.stdout.len(), MIB);
    assert!(reply.stdout_truncated && !reply.stderr_truncated);
    assert_eq!(reply.stderr, b"done\n");
    assert_eq!(reply.exit.unwrap().code, Some(0));
    assert!(took < Duration::from_secs(15), "3 MB took {took:?}");

    // A code and a signal are separate fields.
    let status = client.exec(exec_sh("exit 3")).await.unwrap().exit.unwrap();
    assert_eq!((status.code, status.signal), (Some(3), None));
    let status = client
        .exec(exec_sh("kill -9 $$"))
        .await
        .unwrap()
        .exit
        .unwrap();
    assert_eq!((status.code, status.signal), (None, Some(9)));

    // The deadline kills the whole process group, the grandchild too.
    let request = ExecRequest {
        timeout_ms: Some(1000),
        ..exec_sh("sleep 1000 & echo $!; sleep 1000")
    };
    let started = Instant::now();
    let reply = within(30, client.exec(request)).await.unwrap();
    assert!(reply.timed_out, "{reply:?}");
    assert!(started.elapsed() < Duration::from_secs(12), "{reply:?}");
    let grandchild: i32 = String::from_utf8(reply.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_gone(&client, grandchild, "timed-out grandchild", 10).await;

    // Stdin bytes arrive as sent, NULs and all, also past a pipe buffer.
    let small = ExecRequest {
        stdin: b"hello\0world\n".to_vec(),
        ..exec_sh("cat")
    };
    assert_eq!(client.exec(small).await.unwrap().stdout, b"hello\0world\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let request = ExecRequest {
        stdin: big.clone(),
        ..exec_sh("cat")
    };
    let reply: ExecReply = within(60, client.exec(request)).await.unwrap();
    assert!(reply.stdout == big, "300 KB of stdin came back different");
}

fn numbers(from: u32, to: u32) -> Vec<u8> {
    (from..=to)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

async fn spawn_logs(client: Client) {
    // Followed from byte 0 while it writes in bursts: every byte once, in order.
    let script = "for i in 0 1 2 3 4; do seq $((i*2000+1)) $((i*2000+2000)); sleep 0.2; done";
    let pid = client.spawn(shell(script)).await.unwrap();
    let followed = within(60, follow_to_end(&client, pid, 0)).await;
    let expected = numbers(1, 10000);
    assert_eq!(followed.dropped, 0);
    assert_eq!(followed.data.len(), expected.len());
    assert!(followed.data == expected, "followed output differs");
    assert_eq!(followed.end, expected.len() as u64);
    assert_eq!(followed.exit.unwrap().code, Some(0));
    // A replay from the middle starts exactly there.
    let reply = client.logs(pid, Some(12345)).await.unwrap();
    assert_eq!(reply.batch.chunks[0].offset, 12345);
    let data: Vec<u8> = reply
        .batch
        .chunks
        .iter()
        .flat_map(|c| c.data.clone())
        .collect();
    assert!(data == expected[12345..]);

    // Past the 256 KiB ring: the loss is reported, never hidden.
    let total: u64 = 600_000;
    let pid = client
        .spawn(shell(&format!("head -c {total} /dev/zero | tr '\\0' x")))
        .await
        .unwrap();
    let followed = within(60, follow_to_end(&client, pid, 0)).await;
    assert_eq!(followed.dropped + followed.data.len() as u64, total);
    assert_eq!(followed.end, total);
    let reply = client.logs(pid, Some(0)).await.unwrap();
    let held: u64 = reply.batch.chunks.iter().map(|c| c.data.len() as u64).sum();
    assert!(reply.batch.dropped > 0, "600 KB must overflow the ring");
    assert!(held <= RING_BYTES as u64);
    assert_eq!(reply.batch.dropped + held, total);
    assert_eq!(reply.batch.chunks[0].offset, reply.batch.dropped);
    assert!(reply
        .batch
        .chunks
        .iter()
        .all(|c| c.stream == Stream::Stdout && c.data.iter().all(|&b| b == b'x')));
}

async fn kill_and_ps(client: Client) {
    let sleeper = client.spawn(shell("sleep 1000")).await.unwrap();
    let quick = client.spawn(argv(&["echo", "quick"])).await.unwrap();
    assert_eq!(wait_exit(&client, quick).await.code, Some(0));

    let listed = client.ps().await.unwrap();
    let entry = listed
        .iter()
        .find(|p| p.pid == sleeper)
        .expect("not listed");
    assert_eq!(
        (entry.kind, entry.state),
        (ProcessKind::Spawn, ProcessState::Running)
    );
    let entry = listed.iter().find(|p| p.pid == quick).expect("not listed");
    assert_eq!(entry.kind, ProcessKind::Spawn);
    assert_eq!(entry.argv, ["echo", "quick"]);
    assert!(matches!(entry.state, ProcessState::Exited(_)), "{entry:?}");

    client.kill(sleeper, 15).await.unwrap();
    let status = wait_exit(&client, sleeper).await;
    assert_eq!((status.code, status.signal), (None, Some(15)));
    let entry = ps_entry(&client, sleeper).await.unwrap();
    assert_eq!(entry.state, ProcessState::Exited(status));
    // Killing what already exited succeeds and changes nothing.
    client.kill(sleeper, 15).await.unwrap();
    assert_eq!(
        ps_entry(&client, sleeper).await.unwrap().state,
        ProcessState::Exited(status)
    );
    // The guest's own pid 1 is not a process the agent tracks.
    for pid in [Pid(999_999), Pid(1)] {
        let err = client.kill(pid, 15).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{pid}: {err}");
    }
}

async fn pty(client: Client, url: String) {
    let request = PtyOpenRequest {
        spec: argv(&["sh"]),
        size: WindowSize { rows: 24, cols: 80 },
    };
    let pid = client.pty_open(request).await.unwrap();
    let screen = Screen::follow(&client, pid, 0);
    client
        .pty_input(pid, b"echo $((6*7))\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("\n42").await;
    client
        .pty_input(pid, b"stty size\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("24 80").await;
    let size = WindowSize {
        rows: 40,
        cols: 100,
    };
    client.pty_resize(pid, size).await.unwrap();
    client
        .pty_input(pid, b"stty size\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("40 100").await;
    assert_eq!(ps_entry(&client, pid).await.unwrap().kind, ProcessKind::Pty);
    screen.task.abort();
    drop(client);

    // A new connection replays what the terminal showed and takes it over.
    let url: AgentUrl = url.parse().unwrap();
    let client = Client::connect(&url, &options_for(&url)).await.unwrap();
    let replay = client.logs(pid, None).await.unwrap();
    let shown: Vec<u8> = replay
        .batch
        .chunks
        .iter()
        .flat_map(|c| c.data.clone())
        .collect();
    let shown = String::from_utf8_lossy(&shown);
    assert!(
        shown.contains("\n42") && shown.contains("40 100"),
        "{shown}"
    );
    let screen = Screen::follow(&client, pid, replay.batch.end);
    client
        .pty_input(pid, b"echo again-$((6*7))\n".to_vec())
        .await
        .unwrap();
    screen.wait_for("\nagain-42").await;
    assert!(!screen.contents().contains("40 100"), "replayed twice");
    client.pty_input(pid, b"exit 7\n".to_vec()).await.unwrap();
    let exit = within(20, screen.task).await.unwrap();
    assert_eq!(exit.unwrap().code, Some(7));
}

async fn files(client: Client) {
    let dir = PathBuf::from("/root/e2e-files");
    client.mkdir(&dir, true, None).await.unwrap();

    let text = dir.join("hello.txt");
    let data = b"hello \xff\x00 world\n".to_vec();
    client
        .write_file(&text, data.clone(), Some(0o640))
        .await
        .unwrap();
    assert_eq!(client.read_file(&text).await.unwrap(), data);
    let stat = client.stat(&text).await.unwrap();
    assert_eq!(
        (stat.kind, stat.size, stat.mode),
        (FileKind::File, 15, 0o640)
    );
    // Seen the same from inside the guest.
    let listed = sh(&client, &format!("stat -c '%a %s' {}", text.display())).await;
    assert_eq!(listed.trim(), "640 15");

    let cap = READ_FILE_CAP_BYTES;
    sh(
        &client,
        &format!(
            "head -c {cap} /dev/zero > {d}/exact && head -c {} /dev/zero > {d}/big",
            cap + 1,
            d = dir.display()
        ),
    )
    .await;
    let exact = client.read_file(dir.join("exact")).await.unwrap();
    assert_eq!(exact.len() as u64, cap);
    let cases: [(PathBuf, ErrorKind, &str); 4] = [
        (dir.join("big"), ErrorKind::TooLarge, "1048576"),
        (dir.clone(), ErrorKind::WrongType, "directory"),
        (
            PathBuf::from("/dev/null"),
            ErrorKind::WrongType,
            "not a regular file",
        ),
        (dir.join("missing"), ErrorKind::NotFound, "missing"),
    ];
    for (path, expected, words) in cases {
        let err = client.read_file(&path).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(expected), "{}: {err}", path.display());
        assert!(err.to_string().contains(words), "{}: {err}", path.display());
    }

    // A name that is not UTF-8 survives both ways.
    let name: &[u8] = b"caf\xe9-\xff";
    let odd = dir.join(OsStr::from_bytes(name));
    client.write_file(&odd, b"hi".to_vec(), None).await.unwrap();
    client.mkdir(dir.join("sub"), false, None).await.unwrap();
    let entries = client.list_dir(&dir).await.unwrap();
    let listed: Vec<_> = entries
        .iter()
        .map(|e| (e.name.clone(), e.kind, e.size))
        .collect();
    assert!(
        listed.contains(&(name.to_vec(), FileKind::File, 2)),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|(n, k, _)| n == b"sub" && *k == FileKind::Dir),
        "{listed:?}"
    );
    assert_eq!(client.read_file(&odd).await.unwrap(), b"hi");
    client.remove(&dir, true).await.unwrap();
    let err = client.stat(&dir).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::NotFound), "{err}");
}

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `len` bytes from a xorshift generator: incompressible and reproducible.
fn pseudo_random(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn put_get(client: Client) {
    const SIZE: usize = 64 * MIB;
    let data = pseudo_random(SIZE);
    let sent = hex(Sha256::digest(&data));
    let remote = Path::new("/tmp/e2e-put.bin");

    let started = Instant::now();
    let (written, mode) = within(120, client.put(remote, Some(0o600), data.as_slice()))
        .await
        .unwrap();
    let put_took = started.elapsed();
    assert_eq!((written, mode), (SIZE as u64, 0o600));
    let guest = sh(&client, &format!("sha256sum {}", remote.display())).await;
    assert_eq!(guest.split_whitespace().next(), Some(sent.as_str()));

    let started = Instant::now();
    let mut back = Vec::with_capacity(SIZE);
    let (read, _) = within(120, client.get(remote, &mut back)).await.unwrap();
    let get_took = started.elapsed();
    assert_eq!((read, back.len()), (SIZE as u64, SIZE));
    assert_eq!(hex(Sha256::digest(&back)), sent);
    client.remove(remote, false).await.unwrap();
    eprintln!("64 MiB over vsock: put {put_took:.2?}, get {get_took:.2?}");
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

    // The OOM killer spares init, not its children.
    assert_eq!(
        sh(&client, "cat /proc/1/oom_score_adj").await.trim(),
        "-1000"
    );
    // Regression: the reset used to come from the agent after the child started, so
    // whatever the child forked at once could keep init's -1000. A subshell forks first.
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
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = sh(&client, &format!("cat /proc/{orphan}/stat")).await;
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(") ").unwrap().1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields[1] == "1" {
            assert_eq!(fields[0], "S", "orphan not sleeping: {stat}");
            break;
        }
        assert!(Instant::now() < deadline, "never adopted by PID 1: {stat}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_gone(&client, orphan, "orphan", 10).await;
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
    let entropy = pseudo_random(64);
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

fn frame_with_body(body: &[u8]) -> Vec<u8> {
    let mut bytes = u32::try_from(body.len()).unwrap().to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

async fn malformed_frames(socket: PathBuf, port: u32, url: String, boot_id: String) {
    // A garbage body: an error under its id, and the connection goes on.
    let mut raw = RawConnection::hello(&socket, port).await;
    raw.write(&frame_with_body(&[5, 1, 1, 0xff, 0xff])).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(
        (id, error.kind),
        (RequestId(5), ErrorKind::BadRequest),
        "{error}"
    );
    raw.assert_serves(6).await;

    // A length prefix one byte over the limit: refused under its id, then the
    // connection closes (frame sync is lost).
    let len = MAX_FRAME_BYTES + 1;
    let mut bytes = u32::try_from(len).unwrap().to_le_bytes().to_vec();
    bytes.push(11);
    raw.write(&bytes).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(
        (id, error.kind),
        (RequestId(11), ErrorKind::TooLarge),
        "{error}"
    );
    assert!(raw.read().await.is_none(), "the connection stayed open");
    drop(raw);

    // A huge length prefix, then a hang-up.
    let mut raw = RawConnection::hello(&socket, port).await;
    raw.write(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await;
    let (_, error) = raw.expect_error().await;
    assert_eq!(error.kind, ErrorKind::TooLarge, "{error}");
    drop(raw);

    // A hello from a future protocol: refused, then closed.
    let mut raw = RawConnection::connect(&socket, port).await;
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION + 1,
        token: None,
    };
    raw.send(0, ClientMsg::Hello(hello)).await;
    let (id, error) = raw.expect_error().await;
    assert_eq!(
        (id, error.kind),
        (RequestId(0), ErrorKind::VersionMismatch),
        "{error}"
    );
    assert!(raw.read().await.is_none(), "connection left open");

    // Plain text instead of a hello, then a connection cut mid-frame.
    let mut raw = RawConnection::connect(&socket, port).await;
    raw.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    if let Some(frame) = raw.read().await {
        assert!(matches!(frame.msg, AgentMsg::Error(_)), "{frame:?}");
    }
    let mut raw = RawConnection::hello(&socket, port).await;
    raw.write(&[100, 0, 0, 0, 1, 2, 3]).await;
    drop(raw);

    // The same agent (same boot id) still serves a normal client.
    let url: AgentUrl = url.parse().unwrap();
    let client = Client::connect(&url, &options_for(&url)).await.unwrap();
    let info = client.info().await.unwrap();
    assert_eq!(info.boot_id, boot_id, "the agent restarted");
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
}
