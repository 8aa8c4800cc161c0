//! Snapshots of real microVMs: checkpoint, branch, fork (and a fork of a fork), with
//! what users rely on checked in the guests: children see the parent's files and
//! processes at the fork point and diverge afterwards; each child draws its own random
//! numbers, has its own machine id, hostname and token; the guest clock is within
//! 250 ms of the host's after every restore; a checkpoint made by one process is
//! branched by another (`sandboxctl vm branch`); deleting a checkpoint in use is
//! refused; a failed fork leaves no VM, daemon or file; a VM on an ext4 root disk
//! checkpoints and branches too.
//!
//! Checkpoints go to a folder of this test process (`LauncherConfig::checkpoint_root`),
//! checked empty at the end. Timings are printed; run with `--nocapture` to see them.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_protocol::{Command, ProcessSpec, ProcessState};
use sandbox_tests::vm::{block_on, vm_main, VmTest};
use sandbox_tests::vm::{build_template_with, default_template, READY_TIMEOUT_SECS};
use sandbox_tests::{binaries, sh, TempDir};
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::launcher::snapshot::{
    BranchSpec, CaptureMethod, CheckpointSpec, RamImage, SnapshotError,
};
use sandbox_vmm::launcher::{BootSpec, Launcher, LauncherConfig, TemplateRef, Vm, VmId};

/// The largest distance allowed between a restored guest's wall clock and the host's.
/// Without the fix a restored clock is off by the checkpoint's age (seconds at least);
/// with it, by the time the `resumed` request takes to arrive, which the launcher keeps
/// small by resending the time until a round trip is fast (one resend on a loaded host
/// under TCG was seen 50-300 ms behind).
const CLOCK_SKEW_LIMIT: Duration = Duration::from_millis(250);

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "fork_children_share_the_fork_point_then_diverge_with_their_own_identity",
            run: || block_on(fork_children_share_the_fork_point_then_diverge()),
        },
        VmTest {
            name: "a_checkpoint_is_branched_by_another_process_and_kept_while_in_use",
            run: || block_on(a_checkpoint_is_branched_by_another_process()),
        },
        VmTest {
            name: "bad_states_get_clear_errors_and_a_full_disk_leaves_nothing",
            run: || block_on(bad_states()),
        },
        VmTest {
            name: "a_failed_fork_leaves_no_vm_daemon_or_file",
            run: || block_on(a_failed_fork_leaves_nothing()),
        },
        VmTest {
            name: "hibernate_frees_the_vm_and_wake_brings_back_files_processes_and_logs",
            run: || block_on(hibernate_and_wake()),
        },
        VmTest {
            name: "concurrent_wakes_of_one_vm_share_one_restore_and_keep_its_ram",
            run: || block_on(concurrent_wakes_share_one_restore()),
        },
        VmTest {
            name: "boots_restore_the_templates_ready_snapshot_and_promote_makes_a_template",
            run: || block_on(ready_snapshots_and_promote()),
        },
        VmTest {
            name: "a_live_checkpoint_of_a_guest_writing_all_along_is_consistent",
            run: || block_on(a_live_checkpoint_of_a_busy_guest_is_consistent()),
        },
        VmTest {
            name: "an_incremental_checkpoint_keeps_what_changed_and_restores_whole",
            run: || block_on(an_incremental_checkpoint_keeps_what_changed()),
        },
        VmTest {
            name: "a_vm_on_an_ext4_root_disk_checkpoints_and_branches",
            run: || block_on(a_disk_vm_checkpoints_and_branches()),
        },
    ])
}

/// A launcher of this test alone: its own run root and checkpoint folder.
struct Host {
    launcher: Launcher,
    _scratch: TempDir,
}

impl Host {
    fn new(tag: &str) -> Option<Self> {
        if !sandbox_tests::vm::require(&format!("microvm_snapshots::{tag}")) {
            return None;
        }
        let scratch = TempDir::new(&format!("snap-{tag}"));
        let mut config = LauncherConfig::from_env().unwrap();
        config.run_root = scratch.path().join("run");
        config.checkpoint_root = scratch.path().join("checkpoints");
        Some(Self {
            launcher: Launcher::new(config),
            _scratch: scratch,
        })
    }

    async fn boot(&self, template: TemplateRef) -> Vm {
        let mut spec = BootSpec::new(template);
        spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
        self.launcher
            .boot(spec)
            .await
            .unwrap_or_else(|e| panic!("boot failed: {}", sandbox_vmm::error_chain(&e)))
    }

    fn checkpoint_root(&self) -> &Path {
        &self.launcher.config().checkpoint_root
    }

    /// Nothing left: no run folder, no checkpoint (nor a half-written one).
    fn assert_empty(&self) {
        let left = self.launcher.list().unwrap();
        assert!(left.is_empty(), "run folders left: {left:?}");
        let checkpoints: Vec<_> = std::fs::read_dir(self.checkpoint_root())
            .map(|dir| dir.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            checkpoints.is_empty(),
            "checkpoint files left: {checkpoints:?}"
        );
    }
}

fn branch_spec() -> BranchSpec {
    BranchSpec {
        detached: false,
        ready_timeout: Duration::from_secs(READY_TIMEOUT_SECS),
    }
}

async fn client(vm: &Vm) -> Client {
    vm.client(&ConnectOptions::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach VM {}: {}",
                vm.id(),
                sandbox_vmm::error_chain(&e)
            )
        })
}

/// Asserts the guest's wall clock is within [`CLOCK_SKEW_LIMIT`] of the host's
/// (allowing for the round trip the reading took). The guest's time is the mtime it
/// gives a file it writes (busybox `date` has no nanoseconds).
async fn assert_clock(client: &Client, what: &str) {
    let before = unix_ms();
    client
        .write_file("/tmp/.clock", Vec::new(), None)
        .await
        .unwrap();
    let after = unix_ms();
    let guest = i128::from(client.stat("/tmp/.clock").await.unwrap().modified_ms);
    let limit = CLOCK_SKEW_LIMIT.as_millis() as i128;
    assert!(
        guest >= before - limit && guest <= after + limit,
        "{what}: guest clock {guest} ms is off the host's [{before}, {after}] by more than {CLOCK_SKEW_LIMIT:?}"
    );
    eprintln!(
        "{what}: guest clock {} ms after the start and {} ms before the end of the host's reading window",
        guest - before,
        after - guest
    );
}

fn unix_ms() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128
}

/// A counter that appends a line to a file and its log every 100 ms.
fn ticker() -> ProcessSpec {
    ProcessSpec::new(Command::Shell(
        "i=0; while true; do i=$((i+1)); echo tick $i; echo $i >> /tmp/ticks; sleep 0.1; done"
            .into(),
    ))
}

async fn fork_children_share_the_fork_point_then_diverge() {
    let Some(host) = Host::new("fork") else {
        return;
    };
    let parent = host.boot(default_template()).await;
    let parent_client = client(&parent).await;
    sh(&parent_client, "echo before-fork > /tmp/state").await;
    let ticker = parent_client.spawn(ticker()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A fresh boot may have no machine id yet: "none" then.
    let parent_id = sh(
        &parent_client,
        "cat /etc/machine-id 2>/dev/null || echo none",
    )
    .await;

    let started = Instant::now();
    let fork = host
        .launcher
        .fork(parent.id(), 2, branch_spec())
        .await
        .unwrap_or_else(|e| panic!("fork failed: {}", sandbox_vmm::error_chain(&e)));
    eprintln!(
        "fork -n 2: pause {:?}, all children answering after {:?}",
        fork.checkpoint.pause,
        started.elapsed()
    );
    assert_eq!(fork.children.len(), 2);
    assert!(fork.checkpoint.manifest.ephemeral);
    // The parent goes on, with its clock corrected after the pause.
    assert_eq!(sh(&parent_client, "cat /tmp/state").await, "before-fork\n");
    assert_clock(&parent_client, "parent after the checkpoint").await;

    let mut ids = vec![parent_id.clone()];
    let mut draws = Vec::new();
    for (n, child) in fork.children.iter().enumerate() {
        let c = client(child).await;
        assert_clock(&c, &format!("child {n}")).await;
        // The parent's files and processes at the fork point.
        assert_eq!(sh(&c, "cat /tmp/state").await, "before-fork\n");
        let ps = c.ps().await.unwrap();
        assert!(
            ps.iter()
                .any(|p| p.pid == ticker && p.state == ProcessState::Running),
            "the spawned ticker is not running in child {n}: {ps:?}"
        );
        let logs = c.logs(ticker, Some(0)).await.unwrap();
        let text: Vec<u8> = logs
            .batch
            .chunks
            .iter()
            .flat_map(|c| c.data.clone())
            .collect();
        assert!(
            String::from_utf8_lossy(&text).contains("tick 1\n"),
            "child {n} lost the ticker's log"
        );
        // It keeps ticking in the child.
        let before: u64 = sh(&c, "tail -n1 /tmp/ticks").await.trim().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let after: u64 = sh(&c, "tail -n1 /tmp/ticks").await.trim().parse().unwrap();
        assert!(
            after > before,
            "the ticker stopped in child {n}: {before} -> {after}"
        );
        // Diverge.
        sh(&c, &format!("echo child-{n} > /tmp/state")).await;
        assert_eq!(sh(&c, "cat /tmp/state").await, format!("child-{n}\n"));
        ids.push(sh(&c, "cat /etc/machine-id").await);
        draws.push(sh(&c, "head -c 32 /dev/urandom | od -An -tx1").await);
        let hostname = sh(&c, "hostname").await;
        assert_eq!(hostname.trim(), format!("sandbox-{}", child.id()));
        // Its own token: the parent's is refused.
        assert_ne!(child.token(), parent.token());
        let stale = ConnectOptions {
            token: Some(parent.token().to_owned()),
            ..ConnectOptions::default()
        };
        let refused = Client::connect(&child.url(), &stale).await;
        assert!(refused.is_err(), "child {n} accepted the parent's token");
    }
    assert_eq!(sh(&parent_client, "cat /tmp/state").await, "before-fork\n");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "machine ids are not all different");
    assert_ne!(
        draws[0], draws[1],
        "two children drew the same random bytes"
    );

    // A fork of a fork: the child's RAM is private, so it goes into the stream.
    let grandchildren = host
        .launcher
        .fork(fork.children[0].id(), 1, branch_spec())
        .await
        .unwrap_or_else(|e| panic!("fork of a fork failed: {}", sandbox_vmm::error_chain(&e)));
    let g = client(&grandchildren.children[0]).await;
    assert_eq!(sh(&g, "cat /tmp/state").await, "child-0\n");
    assert_clock(&g, "grandchild").await;

    // The fork's checkpoint is in use while its children run.
    let in_use = host
        .launcher
        .delete_checkpoint(&fork.checkpoint.manifest.id);
    assert!(
        matches!(in_use, Err(SnapshotError::InUse { .. })),
        "{in_use:?}"
    );

    for vm in grandchildren.children.into_iter().chain(fork.children) {
        // A child's own RAM file (one whose RAM came in the stream), if it has one.
        let ram_file = std::fs::read_link(vm.run_dir().join("ram")).ok();
        vm.shutdown(Duration::from_secs(5)).await.unwrap();
        if let Some(ram_file) = ram_file {
            assert!(!ram_file.exists(), "{} outlived its VM", ram_file.display());
        }
    }
    parent.shutdown(Duration::from_secs(5)).await.unwrap();
    for checkpoint in host.launcher.checkpoints().unwrap() {
        host.launcher
            .delete_checkpoint(&checkpoint.manifest.id)
            .unwrap();
    }
    host.assert_empty();
}

async fn a_checkpoint_is_branched_by_another_process() {
    let Some(host) = Host::new("branch") else {
        return;
    };
    let parent = host.boot(default_template()).await;
    let parent_client = client(&parent).await;
    sh(&parent_client, "echo named > /tmp/marker").await;
    let checkpoint = host
        .launcher
        .checkpoint(
            parent.id(),
            CheckpointSpec {
                name: Some("e2e-base".into()),
                ephemeral: false,
                ..CheckpointSpec::default()
            },
        )
        .await
        .unwrap();
    eprintln!(
        "checkpoint: pause {:?}, total {:?}, state {} B, RAM {} B on disk",
        checkpoint.pause,
        checkpoint.total,
        checkpoint.manifest.state_bytes,
        checkpoint.manifest.ram_bytes
    );
    // A second checkpoint may not take the name.
    let taken = host
        .launcher
        .checkpoint(
            parent.id(),
            CheckpointSpec {
                name: Some("e2e-base".into()),
                ephemeral: false,
                ..CheckpointSpec::default()
            },
        )
        .await;
    assert!(
        matches!(taken, Err(SnapshotError::NameTaken(_))),
        "{taken:?}"
    );
    parent.shutdown(Duration::from_secs(5)).await.unwrap();

    // Another process branches it by name, detached.
    let config = host.launcher.config();
    let output = std::process::Command::new(&binaries().sandboxctl)
        .args(["vm", "branch", "e2e-base", "-n", "1"])
        .env("SANDBOX_RUN_DIR", &config.run_root)
        .env("SANDBOX_CHECKPOINT_DIR", &config.checkpoint_root)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "vm branch failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let child_id: VmId = stdout.split('\t').next().unwrap().parse().unwrap();
    let cat = std::process::Command::new(&binaries().sandboxctl)
        .args(["--vm", child_id.as_str(), "cat", "/tmp/marker"])
        .env("SANDBOX_RUN_DIR", &config.run_root)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "named\n");

    // In use by the child: refused, with who uses it.
    match host.launcher.delete_checkpoint("e2e-base") {
        Err(SnapshotError::InUse { users, .. }) => assert!(users.contains(child_id.as_str())),
        other => panic!("deleting a checkpoint in use: {other:?}"),
    }
    host.launcher
        .stop(&child_id, Duration::from_secs(5))
        .await
        .unwrap();
    host.launcher.delete_checkpoint("e2e-base").unwrap();
    host.assert_empty();
}

async fn bad_states() {
    let Some(host) = Host::new("bad") else {
        return;
    };
    let missing: VmId = "000000000000".parse().unwrap();
    let error = host
        .launcher
        .checkpoint(&missing, CheckpointSpec::default())
        .await
        .unwrap_err();
    assert!(matches!(error, SnapshotError::NoVm { .. }), "{error:?}");
    let error = host
        .launcher
        .branch("no-such-checkpoint", 1, branch_spec())
        .await
        .unwrap_err();
    assert!(matches!(error, SnapshotError::NoCheckpoint(_)), "{error:?}");
    let error = host
        .launcher
        .branch("x", 0, branch_spec())
        .await
        .unwrap_err();
    assert!(matches!(error, SnapshotError::Count(0)), "{error:?}");

    // A vsock VM cannot be checkpointed.
    let mut spec = BootSpec::new(default_template());
    spec.transport = Some(sandbox_vmm::launcher::AgentTransport::Vsock);
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    let vsock = host.launcher.boot(spec).await.unwrap();
    let error = host
        .launcher
        .checkpoint(vsock.id(), CheckpointSpec::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error, SnapshotError::NotCapable { .. }),
        "{error:?}"
    );
    eprintln!("vsock VM: {}", sandbox_vmm::error_chain(&error));
    vsock.shutdown(Duration::from_secs(5)).await.unwrap();

    let vm = host.boot(default_template()).await;
    let bad_name = CheckpointSpec {
        name: Some("../escape".into()),
        ephemeral: false,
        ..CheckpointSpec::default()
    };
    let error = host
        .launcher
        .checkpoint(vm.id(), bad_name)
        .await
        .unwrap_err();
    assert!(matches!(error, SnapshotError::BadName(_)), "{error:?}");

    // A full disk: the checkpoint fails, nothing half-written stays, the VM goes on.
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test mounts a small tmpfs to fill: run it as root (the CI does)"
    );
    let small = TempDir::new("snap-full");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(small.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs");
    let mut config = host.launcher.config().clone();
    config.checkpoint_root = small.path().join("checkpoints");
    let cramped = Launcher::new(config);
    let error = cramped
        .checkpoint(vm.id(), CheckpointSpec::default())
        .await
        .unwrap_err();
    eprintln!("full disk: {}", sandbox_vmm::error_chain(&error));
    assert!(matches!(error, SnapshotError::Write { .. }), "{error:?}");
    let left: Vec<_> = std::fs::read_dir(small.path().join("checkpoints"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let _ = std::process::Command::new("umount")
        .arg(small.path())
        .status();
    assert!(left.is_empty(), "a failed checkpoint left {left:?}");
    let c = client(&vm).await;
    assert_eq!(sh(&c, "echo alive").await, "alive\n");

    // A checkpoint whose files are missing, or made by another QEMU.
    let good = host
        .launcher
        .checkpoint(vm.id(), CheckpointSpec::default())
        .await
        .unwrap();
    let manifest_path = good.path.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    let other_qemu = text.replace(&good.manifest.qemu_version, "1.2.3");
    std::fs::write(&manifest_path, other_qemu).unwrap();
    let error = host
        .launcher
        .branch(&good.manifest.id, 1, branch_spec())
        .await
        .unwrap_err();
    eprintln!("other QEMU: {}", sandbox_vmm::error_chain(&error));
    assert!(matches!(error, SnapshotError::Damaged { .. }), "{error:?}");
    std::fs::write(&manifest_path, text).unwrap();
    std::fs::remove_file(good.path.join("state")).unwrap();
    let error = host
        .launcher
        .branch(&good.manifest.id, 1, branch_spec())
        .await
        .unwrap_err();
    assert!(matches!(error, SnapshotError::Damaged { .. }), "{error:?}");
    host.launcher.delete_checkpoint(&good.manifest.id).unwrap();
    vm.shutdown(Duration::from_secs(5)).await.unwrap();
    host.assert_empty();
}

async fn a_failed_fork_leaves_nothing() {
    let Some(host) = Host::new("failed") else {
        return;
    };
    let parent = host.boot(default_template()).await;
    // No child can attach within a millisecond: every child fails.
    let spec = BranchSpec {
        detached: false,
        ready_timeout: Duration::from_millis(1),
    };
    let error = host.launcher.fork(parent.id(), 2, spec).await.unwrap_err();
    eprintln!(
        "the fork failed as it should: {}",
        sandbox_vmm::error_chain(&error)
    );
    assert!(matches!(error, SnapshotError::Child { .. }), "{error:?}");
    // Only the parent is left: no child's folder, QEMU or relay, no checkpoint.
    let left = host.launcher.list().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    let strays = std::process::Command::new("pgrep")
        .args(["-f", &host.launcher.config().run_root.to_string_lossy()])
        .output()
        .unwrap();
    let pids = String::from_utf8_lossy(&strays.stdout).lines().count();
    // The parent's QEMU and relay.
    assert_eq!(
        pids,
        2,
        "processes left: {}",
        String::from_utf8_lossy(&strays.stdout)
    );
    parent.shutdown(Duration::from_secs(5)).await.unwrap();
    host.assert_empty();
}

async fn hibernate_and_wake() {
    let Some(host) = Host::new("hibernate") else {
        return;
    };
    let mut spec = BootSpec::new(default_template());
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    spec.detached = true;
    let vm = host.launcher.boot(spec).await.unwrap();
    let c = client(&vm).await;
    sh(&c, "echo kept > /tmp/kept").await;
    let ticker = c.spawn(ticker()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(c);
    let ram_file = std::fs::read_link(vm.run_dir().join("ram")).unwrap();
    assert!(ram_file.is_file(), "a booted VM's RAM is not a shared file");
    let record = vm.detach().unwrap();
    let id = record.id.clone();

    let hibernated = host.launcher.hibernate(&id).await.unwrap();
    eprintln!(
        "hibernate: {:?}, {} MiB on disk",
        hibernated.took,
        hibernated.bytes_on_disk >> 20
    );
    let entry = host
        .launcher
        .list()
        .unwrap()
        .into_iter()
        .find(|e| e.name == id.as_str())
        .unwrap();
    assert_eq!(entry.status, sandbox_vmm::launcher::VmStatus::Hibernated);
    assert!(!ram_file.exists(), "the RAM file outlived the hibernation");
    let qemu_gone = std::process::Command::new("pgrep")
        .args(["-f", &format!("sandbox-{id}")])
        .output()
        .unwrap();
    assert!(qemu_gone.stdout.is_empty(), "QEMU still runs");
    // Hibernated VMs survive a sweep.
    host.launcher.sweep().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let woken = host.launcher.wake(&id).await.unwrap();
    eprintln!("wake: {:?}", woken.took);
    let token = std::fs::read_to_string(
        host.launcher
            .config()
            .run_root
            .join(id.as_str())
            .join("token"),
    )
    .unwrap();
    let url = woken.record.agent_url.parse().unwrap();
    let options = ConnectOptions {
        token: Some(token.trim().to_owned()),
        ..ConnectOptions::default()
    };
    let c = Client::connect(&url, &options).await.unwrap();
    assert_clock(&c, "woken VM").await;
    assert_eq!(sh(&c, "cat /tmp/kept").await, "kept\n");
    let logs = c.logs(ticker, Some(0)).await.unwrap();
    let text: Vec<u8> = logs
        .batch
        .chunks
        .iter()
        .flat_map(|c| c.data.clone())
        .collect();
    assert!(
        String::from_utf8_lossy(&text).contains("tick 1\n"),
        "the log was lost"
    );
    let before: u64 = sh(&c, "tail -n1 /tmp/ticks").await.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after: u64 = sh(&c, "tail -n1 /tmp/ticks").await.trim().parse().unwrap();
    assert!(after > before, "the ticker did not go on after the wake");
    // It checkpoints again after waking (its RAM is a shared file again).
    let again = host
        .launcher
        .checkpoint(&id, CheckpointSpec::default())
        .await
        .unwrap();
    assert_eq!(
        again.manifest.ram,
        sandbox_vmm::launcher::snapshot::RamImage::File
    );
    host.launcher.delete_checkpoint(&again.manifest.id).unwrap();
    host.launcher
        .stop(&id, Duration::from_secs(5))
        .await
        .unwrap();
    host.assert_empty();
}

/// Regression (issue 22, item 2): three wakes of one hibernated VM at once. Each
/// loser's wake failed ("another process holds this VM") and its clean-up deleted the
/// RAM file the winner was restoring into, so in most rounds every wake failed. Now
/// one restores and the others wait for it and return the VM it woke.
async fn concurrent_wakes_share_one_restore() {
    let Some(host) = Host::new("wakes") else {
        return;
    };
    let mut spec = BootSpec::new(default_template());
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    spec.detached = true;
    let vm = host.launcher.boot(spec).await.unwrap();
    sh(&client(&vm).await, "echo kept > /tmp/kept").await;
    let id = vm.detach().unwrap().id;
    let run = host.launcher.config().run_root.join(id.as_str());
    for round in 1..=2 {
        host.launcher.hibernate(&id).await.unwrap();
        let (a, b, c) = tokio::join!(
            host.launcher.wake(&id),
            host.launcher.wake(&id),
            host.launcher.wake(&id)
        );
        let urls: Vec<String> = [a, b, c]
            .into_iter()
            .map(|woken| match woken {
                Ok(woken) => woken.record.agent_url,
                Err(e) => panic!("round {round}: {}", sandbox_vmm::error_chain(&e)),
            })
            .collect();
        assert!(urls.iter().all(|url| *url == urls[0]), "{urls:?}");
        let ram = std::fs::read_link(run.join("ram")).unwrap();
        assert!(
            ram.is_file(),
            "round {round}: the woken VM's RAM file is gone"
        );
        let qemus = std::process::Command::new("pgrep")
            .args(["-f", "--", &format!("-name sandbox-{id}")])
            .output()
            .unwrap();
        let qemus = String::from_utf8_lossy(&qemus.stdout).lines().count();
        assert_eq!(qemus, 1, "round {round}: QEMUs running this VM");
        let token = std::fs::read_to_string(run.join("token")).unwrap();
        let options = ConnectOptions {
            token: Some(token.trim().to_owned()),
            ..ConnectOptions::default()
        };
        let c = Client::connect(&urls[0].parse().unwrap(), &options)
            .await
            .unwrap();
        assert_eq!(sh(&c, "cat /tmp/kept").await, "kept\n", "round {round}");
        // Regression (issue 22, item 11): each cycle left a `hibernation-*` folder.
        let images: Vec<_> = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("hibernation-"))
            .collect();
        assert!(images.is_empty(), "round {round}: images left: {images:?}");
    }
    host.launcher
        .stop(&id, Duration::from_secs(5))
        .await
        .unwrap();
    host.assert_empty();
}

async fn ready_snapshots_and_promote() {
    let Some(host) = Host::new("ready") else {
        return;
    };
    // A template of this test's own, so its first boot is cold here.
    let scratch = TempDir::new("snap-ready-tpl");
    let name = format!("e2e-ready-{}", std::process::id());
    let built =
        sandbox_tests::vm::build_template(&name, "busybox", &scratch.path().join("template"));
    let template = TemplateRef::Path(built.dir.clone());
    let started = Instant::now();
    let first = host.boot(template.clone()).await;
    let cold = started.elapsed();
    assert_eq!(
        first.record().restored_from,
        None,
        "the first boot restored something"
    );
    let started = Instant::now();
    let second = host.boot(template.clone()).await;
    let warm = started.elapsed();
    eprintln!("cold boot {cold:?}, start from the ready snapshot {warm:?}");
    let restored_from = second.record().restored_from.clone();
    assert!(
        restored_from.is_some(),
        "the second boot did not restore the ready snapshot"
    );
    let (a, b) = (client(&first).await, client(&second).await);
    assert_ne!(sh(&a, "hostname").await, sh(&b, "hostname").await);
    assert_clock(&b, "VM started from the ready snapshot").await;
    // A cold boot on request.
    let mut spec = BootSpec::new(template.clone());
    spec.cold = true;
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    let cold_vm = host.launcher.boot(spec).await.unwrap();
    assert_eq!(cold_vm.record().restored_from, None);
    cold_vm.shutdown(Duration::from_secs(5)).await.unwrap();

    // Promote: the second VM's state becomes a template; its VMs restore it.
    sh(&b, "echo promoted-1 > /etc/promoted").await;
    let tpl_name = format!("e2e-promoted-{}", std::process::id());
    let promoted = host.launcher.promote(second.id(), &tpl_name).await.unwrap();
    assert!(!promoted.replaced);
    let from_template = host.boot(TemplateRef::Name(tpl_name.clone())).await;
    let c = client(&from_template).await;
    assert_eq!(sh(&c, "cat /etc/promoted").await, "promoted-1\n");
    // Re-promoting replaces it; the VM from the old one keeps running.
    sh(&b, "echo promoted-2 > /etc/promoted").await;
    let again = host.launcher.promote(second.id(), &tpl_name).await.unwrap();
    assert!(again.replaced);
    let newer = host.boot(TemplateRef::Name(tpl_name.clone())).await;
    assert_eq!(
        sh(&client(&newer).await, "cat /etc/promoted").await,
        "promoted-2\n"
    );
    assert_eq!(sh(&c, "cat /etc/promoted").await, "promoted-1\n");

    for vm in [first, second, from_template, newer] {
        vm.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    std::fs::remove_dir_all(&promoted.dir).unwrap();
    host.assert_empty();
}

/// A live capture copies RAM while the guest runs: a guest that writes all along
/// (4 MiB of random bytes, then their checksum, round after round) must come back in
/// a child exactly as it was at one instant: every checksum the child finds matches
/// its data, and the writer goes on in both.
async fn a_live_checkpoint_of_a_busy_guest_is_consistent() {
    let Some(host) = Host::new("live") else {
        return;
    };
    let vm = host.boot(default_template()).await;
    let c = client(&vm).await;
    let writer = ProcessSpec::new(Command::Shell(
        "mkdir -p /tmp/w; i=0; while true; do i=$((i+1)); \
         head -c 4194304 /dev/urandom > /tmp/w/$i; \
         sha256sum /tmp/w/$i | cut -d' ' -f1 > /tmp/w/$i.sum; \
         rm -f /tmp/w/$((i-16)) /tmp/w/$((i-16)).sum; done"
            .into(),
    ));
    let writer = c.spawn(writer).await.unwrap();
    // Some rounds done before the capture.
    let deadline = Instant::now() + Duration::from_secs(120);
    while sh(&c, "ls /tmp/w | grep -c sum || true")
        .await
        .trim()
        .parse::<u32>()
        .unwrap_or(0)
        < 4
    {
        assert!(Instant::now() < deadline, "the writer made no progress");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let spec = CheckpointSpec {
        method: CaptureMethod::Live,
        ..CheckpointSpec::default()
    };
    let checkpoint = host
        .launcher
        .checkpoint(vm.id(), spec)
        .await
        .unwrap_or_else(|e| panic!("live checkpoint failed: {}", sandbox_vmm::error_chain(&e)));
    eprintln!(
        "live checkpoint of a writing guest: pause {:?}, total {:?}, RAM {} B on disk",
        checkpoint.pause, checkpoint.total, checkpoint.manifest.ram_bytes
    );
    assert_eq!(checkpoint.manifest.ram, RamImage::File);
    // No file of the capture QEMU is left in the run folder.
    let scratch: Vec<_> = std::fs::read_dir(vm.run_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("live-"))
        .collect();
    assert!(scratch.is_empty(), "capture files left: {scratch:?}");
    let check = "n=0; for s in /tmp/w/*.sum; do d=${s%.sum}; [ -f \"$d\" ] || continue; \
                 [ \"$(sha256sum $d | cut -d' ' -f1)\" = \"$(cat $s)\" ] || { echo BAD $d; exit 1; }; \
                 n=$((n+1)); done; echo $n";
    let children = host
        .launcher
        .branch(&checkpoint.manifest.id, 1, branch_spec())
        .await
        .unwrap_or_else(|e| panic!("branch failed: {}", sandbox_vmm::error_chain(&e)));
    let child = client(&children[0]).await;
    let verified: u32 = sh(&child, check).await.trim().parse().unwrap();
    assert!(
        verified >= 3,
        "only {verified} rounds to check in the child"
    );
    for (what, client) in [("source", &c), ("child", &child)] {
        let ps = client.ps().await.unwrap();
        let state = ps.iter().find(|p| p.pid == writer).map(|p| p.state);
        assert_eq!(
            state,
            Some(ProcessState::Running),
            "{what}: the writer is not running: {ps:?}"
        );
    }
    // A paused capture works after a live one (capabilities were reset); one asked
    // for while it runs is refused, not let to cancel its migration.
    let paused = CheckpointSpec {
        method: CaptureMethod::Paused,
        ..CheckpointSpec::default()
    };
    let (again, during) = tokio::join!(
        host.launcher.checkpoint(vm.id(), paused.clone()),
        host.launcher.checkpoint(vm.id(), paused)
    );
    assert!(
        matches!(during, Err(SnapshotError::Busy { .. })),
        "a second capture at once: {during:?}"
    );
    let again = again.unwrap_or_else(|e| {
        panic!(
            "paused checkpoint after a live one failed: {}",
            sandbox_vmm::error_chain(&e)
        )
    });
    drop(child);
    for vm in children {
        vm.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    vm.shutdown(Duration::from_secs(5)).await.unwrap();
    for id in [&again.manifest.id, &checkpoint.manifest.id] {
        host.launcher.delete_checkpoint(id).unwrap();
    }
    host.assert_empty();
}

/// A second and third checkpoint of one VM (paused, then live) keep only the pages
/// that changed since the one before; deleting a base leaves its diffs whole; a
/// branch of the newest flattens it once and its child has every file whole.
async fn an_incremental_checkpoint_keeps_what_changed() {
    let Some(host) = Host::new("incremental") else {
        return;
    };
    let vm = host.boot(default_template()).await;
    let c = client(&vm).await;
    let write = |name: &str, mib: u32| {
        format!(
            "head -c {} /dev/urandom > /tmp/{name} && sha256sum /tmp/{name} > /tmp/{name}.sum",
            mib << 20
        )
    };
    let take = |method: CaptureMethod| {
        let spec = CheckpointSpec {
            method,
            incremental: true,
            ..CheckpointSpec::default()
        };
        let launcher = &host.launcher;
        let id = vm.id().clone();
        async move {
            launcher.checkpoint(&id, spec).await.unwrap_or_else(|e| {
                panic!(
                    "{method:?} checkpoint failed: {}",
                    sandbox_vmm::error_chain(&e)
                )
            })
        }
    };
    sh(&c, &write("a", 48)).await;
    let first = take(CaptureMethod::Paused).await;
    assert_eq!(
        first.manifest.ram,
        RamImage::File,
        "no base yet: a full image"
    );
    sh(&c, &write("b", 16)).await;
    let second = take(CaptureMethod::Paused).await;
    sh(&c, &write("c", 8)).await;
    let third = take(CaptureMethod::Live).await;
    for (what, checkpoint, base, written) in [
        ("second", &second, &first, 16u64),
        ("third", &third, &second, 8),
    ] {
        let m = &checkpoint.manifest;
        eprintln!(
            "{what} checkpoint: RAM {} KiB on disk (its base {} KiB), pause {:?}, call {:?}",
            m.ram_bytes >> 10,
            base.manifest.ram_bytes >> 10,
            checkpoint.pause,
            checkpoint.total
        );
        assert_eq!(m.ram, RamImage::Diff, "{what}");
        assert_eq!(m.ram_base.as_deref(), Some(base.manifest.id.as_str()));
        // What was written, and the kernel's own churn: far from a whole image.
        assert!(m.ram_bytes >= written << 20, "{what}: {} B", m.ram_bytes);
        assert!(
            m.ram_bytes < (written + 24) << 20 && m.ram_bytes < first.manifest.ram_bytes / 2,
            "{what}: {} B for {written} MiB written (the full image: {} B)",
            m.ram_bytes,
            first.manifest.ram_bytes
        );
    }
    // Deleting a base keeps what depends on it whole: the second goes, and the
    // third takes in its pages.
    host.launcher
        .delete_checkpoint(&second.manifest.id)
        .unwrap_or_else(|e| panic!("delete failed: {}", sandbox_vmm::error_chain(&e)));
    let third_now = host
        .launcher
        .checkpoint_store()
        .find(&third.manifest.id)
        .unwrap();
    assert_eq!(
        third_now.manifest.ram_base.as_deref(),
        Some(first.manifest.id.as_str())
    );
    sh(&c, "rm /tmp/a /tmp/b /tmp/c").await;
    let children = host
        .launcher
        .branch(&third.manifest.id, 1, branch_spec())
        .await
        .unwrap_or_else(|e| panic!("branch failed: {}", sandbox_vmm::error_chain(&e)));
    let child = client(&children[0]).await;
    let checked = sh(&child, "cd /tmp && sha256sum -c a.sum b.sum c.sum").await;
    assert_eq!(checked.matches(": OK").count(), 3, "{checked}");
    let flat = host.launcher.checkpoints().unwrap();
    let flat = flat
        .iter()
        .find(|c| c.manifest.id == third.manifest.id)
        .unwrap();
    assert_eq!(flat.manifest.ram, RamImage::File, "the branch flattened it");
    drop(child);
    for child in children {
        child.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    // The source goes on, and its next checkpoint is a diff of the flattened one.
    sh(&c, &write("d", 4)).await;
    let fourth = take(CaptureMethod::Paused).await;
    assert_eq!(
        fourth.manifest.ram_base.as_deref(),
        Some(third.manifest.id.as_str())
    );
    drop(c);
    vm.shutdown(Duration::from_secs(5)).await.unwrap();
    // The fourth is based on the third: deleting the third first leaves it whole.
    for checkpoint in [&third, &first, &fourth] {
        host.launcher
            .delete_checkpoint(&checkpoint.manifest.id)
            .unwrap_or_else(|e| panic!("delete failed: {}", sandbox_vmm::error_chain(&e)));
    }
    host.assert_empty();
}

async fn a_disk_vm_checkpoints_and_branches() {
    let Some(host) = Host::new("disk") else {
        return;
    };
    let scratch = TempDir::new("snap-disk-tpl");
    let name = format!("e2e-snap-disk-{}", std::process::id());
    let built = build_template_with(
        &name,
        "busybox",
        &scratch.path().join("template"),
        &["--layout", "disk", "--disk-free-mib", "64"],
    );
    let parent = host.boot(TemplateRef::Path(built.dir.clone())).await;
    let parent_client = client(&parent).await;
    let mounts = sh(&parent_client, "cat /proc/mounts").await;
    assert!(
        mounts.contains("/dev/vda / ext4"),
        "not on the ext4 disk:\n{mounts}"
    );
    sh(&parent_client, "echo on-disk > /root-marker && sync").await;
    let checkpoint = host
        .launcher
        .checkpoint(parent.id(), CheckpointSpec::default())
        .await
        .unwrap_or_else(|e| panic!("checkpoint failed: {}", sandbox_vmm::error_chain(&e)));
    // The source writes to its new overlay; the checkpoint's disk is frozen.
    sh(&parent_client, "echo after > /root-marker && sync").await;
    let children = host
        .launcher
        .branch(&checkpoint.manifest.id, 1, branch_spec())
        .await
        .unwrap_or_else(|e| panic!("branch failed: {}", sandbox_vmm::error_chain(&e)));
    let c = client(&children[0]).await;
    assert_eq!(sh(&c, "cat /root-marker").await, "on-disk\n");
    sh(&c, "echo child > /root-marker && sync").await;
    assert_eq!(sh(&parent_client, "cat /root-marker").await, "after\n");
    // A second checkpoint of the source chains onto the first one's disk; taken
    // live, its disk switches in the stop before the background snapshot.
    let second = host
        .launcher
        .checkpoint(
            parent.id(),
            CheckpointSpec {
                method: CaptureMethod::Live,
                ..CheckpointSpec::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("live checkpoint failed: {}", sandbox_vmm::error_chain(&e)));
    sh(&parent_client, "echo after-second > /root-marker && sync").await;
    let of_second = host
        .launcher
        .branch(&second.manifest.id, 1, branch_spec())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "branch of the live checkpoint failed: {}",
                sandbox_vmm::error_chain(&e)
            )
        });
    assert_eq!(
        sh(&client(&of_second[0]).await, "cat /root-marker").await,
        "after\n"
    );
    for vm in of_second {
        vm.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    let in_use = host.launcher.delete_checkpoint(&checkpoint.manifest.id);
    assert!(
        matches!(in_use, Err(SnapshotError::InUse { .. })),
        "{in_use:?}"
    );
    // Hibernate/wake cycles keep the disk (its chain now runs through the run
    // folder) and leave no image folder behind (issue 22, item 11).
    drop(parent_client);
    let mut parent = parent;
    for cycle in 1..=2 {
        let id = parent.id().clone();
        if let Err(e) = host.launcher.hibernate_owned(parent).await {
            panic!("hibernate failed: {}", sandbox_vmm::error_chain(&e.error));
        }
        parent = host
            .launcher
            .wake_owned(&id)
            .await
            .unwrap_or_else(|e| panic!("wake failed: {}", sandbox_vmm::error_chain(&e)));
        let c = client(&parent).await;
        let expected = if cycle == 1 {
            "after-second\n".to_owned()
        } else {
            format!("cycle{}\n", cycle - 1)
        };
        assert_eq!(sh(&c, "cat /root-marker").await, expected);
        sh(&c, &format!("echo cycle{cycle} > /root-marker && sync")).await;
        let images: Vec<_> = std::fs::read_dir(parent.run_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("hibernation-"))
            .collect();
        assert!(images.is_empty(), "cycle {cycle}: images left: {images:?}");
    }
    for vm in children {
        vm.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    parent.shutdown(Duration::from_secs(5)).await.unwrap();
    host.launcher
        .delete_checkpoint(&second.manifest.id)
        .unwrap();
    host.launcher
        .delete_checkpoint(&checkpoint.manifest.id)
        .unwrap();
    host.assert_empty();
}
