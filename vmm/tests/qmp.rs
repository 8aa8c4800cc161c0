//! End to end: the QMP client drives real QEMUs.
//!
//! No guest is booted: a `microvm` with no kernel starts fine (held in `prelaunch` by
//! `-S`, or idling in its firmware once continued), and it has everything the client
//! touches: run states, a migratable device state, a block device. Guest RAM is a file
//! on `/dev/shm` with `share=on`, as snapshots use it, so `x-ignore-shared` keeps it
//! out of the saved state.
//!
//! Runs behind the workspace's microVM gate (`tests/src/vm/gate.rs`) like
//! `launcher_boot`: `SANDBOX_SKIP_VM_TESTS=1` marks these tests ignored. Each test
//! kills its QEMUs and removes its files on every way out (guards with `Drop`).

// Off libtest's harness `#[test]` no longer exempts these functions: a failure here
// is a test failure.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sandbox_vmm::launcher::qmp::{MigrationStats, MigrationStatus, Qmp, QmpError, RunState};
use sandbox_vmm::launcher::LauncherConfig;
use serde_json::Value;

/// How long QEMU gets to create its socket and greet (about 15 ms when idle).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a migration or event may take (a state-only save takes milliseconds).
const WAIT: Duration = Duration::from_secs(30);
/// Bytes per second for saves: QEMU's 128 MiB/s default is for networks.
const SAVE_BANDWIDTH: u64 = 64 << 30;
/// The most device state a 64 MiB guest may save when its RAM stays out (~52 KB).
const STATE_MAX_BYTES: u64 = 1 << 20;

/// The workspace's one microVM prerequisite gate, included as `launcher_boot` does.
#[path = "../../tests/src/vm/gate.rs"]
#[allow(dead_code)]
mod gate;

fn main() -> std::process::ExitCode {
    gate::vm_main(&[
        gate::VmTest {
            name: "status_stop_cont_events_and_a_refused_command",
            run: || gate::block_on(status_stop_cont_events_and_a_refused_command()),
        },
        gate::VmTest {
            name: "a_stopped_save_restores_paused_and_a_running_one_running",
            run: || gate::block_on(a_stopped_save_restores_paused_and_a_running_one_running()),
        },
        gate::VmTest {
            name: "a_drive_moves_to_a_new_overlay_backed_by_the_old_image",
            run: || gate::block_on(a_drive_moves_to_a_new_overlay_backed_by_the_old_image()),
        },
        gate::VmTest {
            name: "a_hung_or_killed_qemu_is_a_clear_error_not_a_hang",
            run: || gate::block_on(a_hung_or_killed_qemu_is_a_clear_error_not_a_hang()),
        },
    ])
}

/// A test's folder and guest RAM file, removed on drop.
struct Scratch {
    dir: PathBuf,
    ram: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Self {
        let name = format!("sbx-qmp-{tag}-{}", std::process::id());
        let dir = std::env::temp_dir().join(&name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let ram = Path::new("/dev/shm").join(format!("{name}.ram"));
        Self { dir, ram }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.ram);
    }
}

/// A QEMU process, killed and reaped on drop.
struct Qemu {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Qemu {
    /// Starts a kernel-less 64 MiB microvm named `tag` whose RAM is the scratch RAM
    /// file, with a QMP socket and `extra` arguments.
    fn start(scratch: &Scratch, tag: &str, extra: &[&str]) -> Self {
        let socket = scratch.path(&format!("{tag}.qmp"));
        let log = scratch.path(&format!("{tag}.log"));
        let _ = fs::remove_file(&socket);
        let qemu = LauncherConfig::from_env().unwrap().qemu_path;
        let mut command = Command::new(qemu);
        command
            .args([
                "-M",
                "microvm,memory-backend=mem",
                "-accel",
                "tcg",
                "-m",
                "64M",
            ])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=mem,size=64M,mem-path={},share=on",
                scratch.ram.display()
            ))
            .args(["-nodefaults", "-nographic", "-no-user-config"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .args(extra)
            .stdin(Stdio::null());
        let output = fs::File::create(&log).unwrap();
        command.stderr(output.try_clone().unwrap()).stdout(output);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent's.
        unsafe {
            command.pre_exec(|| {
                // Killed with this test's thread however the test binary dies.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child = command.spawn().unwrap();
        Self { child, socket, log }
    }

    async fn connect(&self) -> Qmp {
        match Qmp::connect(&self.socket, CONNECT_TIMEOUT).await {
            Ok(qmp) => qmp,
            Err(error) => panic!(
                "{}\nQEMU log:\n{}",
                sandbox_vmm::error_chain(&error),
                fs::read_to_string(&self.log).unwrap_or_default()
            ),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Waits for QEMU to exit on its own; true when it did in time.
    fn exits_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn command_error_class(error: &QmpError) -> &str {
    match error {
        QmpError::Command { class, .. } => class,
        other => panic!("not a command error: {other:?}"),
    }
}

async fn status_stop_cont_events_and_a_refused_command() {
    let scratch = Scratch::new("status");
    let mut qemu = Qemu::start(&scratch, "vm", &["-S"]);
    let started = Instant::now();
    let mut qmp = qemu.connect().await;
    eprintln!(
        "QMP up {:?} after spawn (QEMU {})",
        started.elapsed(),
        qmp.greeting().version
    );
    assert!(qmp.greeting().version.major >= 7);
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Prelaunch);

    qmp.cont().await.unwrap();
    qmp.wait_event("RESUME", WAIT).await.unwrap();
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Running);
    qmp.stop().await.unwrap();
    qmp.wait_event("STOP", WAIT).await.unwrap();
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Paused);

    let error = qmp
        .execute("no-such-command", Value::Null)
        .await
        .unwrap_err();
    assert_eq!(command_error_class(&error), "CommandNotFound");
    assert!(error.to_string().contains("no-such-command"), "{error}");
    // A refused command leaves the session usable.
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Paused);

    qmp.quit().await.unwrap();
    assert!(qemu.exits_within(WAIT), "QEMU did not exit on quit");
}

/// Saves the device state of a stopped VM to a file and loads it into a second QEMU
/// (`-incoming defer`), which comes up `paused`; that one, continued, is saved while
/// running and its successor comes up `running`.
async fn a_stopped_save_restores_paused_and_a_running_one_running() {
    let scratch = Scratch::new("migrate");
    let ignore_shared = [("x-ignore-shared", true)];
    let source = Qemu::start(&scratch, "source", &["-S"]);
    let mut qmp = source.connect().await;
    qmp.cont().await.unwrap();

    // A migration that cannot start fails with QEMU's reason.
    let nowhere = scratch.path("nobody-listens.sock");
    qmp.migrate(&format!("unix:{}", nowhere.display()))
        .await
        .unwrap();
    match qmp.wait_migration(WAIT).await {
        Err(QmpError::MigrationFailed { desc }) => {
            assert!(desc.contains("nobody-listens.sock"), "{desc}");
        }
        other => panic!("a migration to nowhere gave {other:?}"),
    }
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Running);

    let state = scratch.path("stopped.state");
    qmp.set_migration_capabilities(&ignore_shared)
        .await
        .unwrap();
    qmp.set_max_bandwidth(SAVE_BANDWIDTH).await.unwrap();
    qmp.stop().await.unwrap();
    let stats = save(&mut qmp, &state).await;
    assert_eq!(stats.status, MigrationStatus::Completed);
    assert!(stats.ram_transferred_bytes < STATE_MAX_BYTES, "{stats:?}");
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Postmigrate);
    qmp.quit().await.unwrap();
    drop(source);

    let restored = Qemu::start(&scratch, "restored", &["-incoming", "defer"]);
    let mut qmp = restored.connect().await;
    let after = restore(&mut qmp, &state).await;
    assert_eq!(after, RunState::Paused, "from a stopped source");
    qmp.cont().await.unwrap();
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Running);

    // Saved running (no stop): the next one comes up running.
    let state = scratch.path("running.state");
    qmp.set_migration_capabilities(&ignore_shared)
        .await
        .unwrap();
    qmp.set_max_bandwidth(SAVE_BANDWIDTH).await.unwrap();
    save(&mut qmp, &state).await;
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Postmigrate);
    qmp.quit().await.unwrap();
    drop(restored);

    let again = Qemu::start(&scratch, "again", &["-incoming", "defer"]);
    let mut qmp = again.connect().await;
    let after = restore(&mut qmp, &state).await;
    assert_eq!(after, RunState::Running, "from a running source");
}

/// `migrate exec:cat > FILE` and waits; checks the file is state only.
async fn save(qmp: &mut Qmp, file: &Path) -> MigrationStats {
    let started = Instant::now();
    qmp.migrate(&format!("exec:cat > {}", file.display()))
        .await
        .unwrap();
    let stats = qmp.wait_migration(WAIT).await.unwrap();
    let bytes = fs::metadata(file).unwrap().len();
    eprintln!(
        "saved {bytes} bytes in {:?} (QEMU: total {:?}, RAM {} of {} bytes)",
        started.elapsed(),
        stats.total_time,
        stats.ram_transferred_bytes,
        stats.ram_total_bytes
    );
    assert!(
        bytes > 0 && bytes < STATE_MAX_BYTES,
        "state file of {bytes} bytes"
    );
    stats
}

/// Loads FILE into a `-incoming defer` QEMU; returns the run state it ends in.
async fn restore(qmp: &mut Qmp, file: &Path) -> RunState {
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Inmigrate);
    qmp.set_migration_capabilities(&[("x-ignore-shared", true)])
        .await
        .unwrap();
    let started = Instant::now();
    qmp.migrate_incoming(&format!("exec:cat {}", file.display()))
        .await
        .unwrap();
    let state = qmp.wait_incoming(WAIT).await.unwrap();
    eprintln!("restored in {:?}: {state}", started.elapsed());
    state
}

async fn a_drive_moves_to_a_new_overlay_backed_by_the_old_image() {
    let scratch = Scratch::new("block");
    let base = scratch.path("base.qcow2");
    let overlay = scratch.path("overlay.qcow2");
    let qemu_img = LauncherConfig::from_env().unwrap().qemu_img_path;
    let created = Command::new(qemu_img)
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("16M")
        .status()
        .unwrap();
    assert!(created.success(), "qemu-img create: {created}");
    let drive = format!("file={},if=none,id=disk0,format=qcow2", base.display());
    let qemu = Qemu::start(
        &scratch,
        "vm",
        &[
            "-S",
            "-drive",
            &drive,
            "-device",
            "virtio-blk-device,drive=disk0",
        ],
    );
    let mut qmp = qemu.connect().await;
    let base_name = base.to_str().unwrap();

    let before = qmp.query_block().await.unwrap();
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].device, "disk0");
    assert_eq!(before[0].file.as_deref(), Some(base_name));
    assert_eq!(before[0].backing_file, None);

    qmp.blockdev_snapshot_sync("disk0", &overlay, "qcow2")
        .await
        .unwrap();
    assert!(overlay.is_file(), "QEMU did not create the overlay");
    let after = qmp.query_block().await.unwrap();
    assert_eq!(after[0].device, "disk0");
    assert_eq!(after[0].file.as_deref(), overlay.to_str());
    assert_eq!(after[0].backing_file.as_deref(), Some(base_name));

    let error = qmp
        .blockdev_snapshot_sync("disk9", &scratch.path("x.qcow2"), "qcow2")
        .await
        .unwrap_err();
    assert_eq!(command_error_class(&error), "GenericError");
    assert!(error.to_string().contains("disk9"), "{error}");
    let not_utf8 = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"\xff.qcow2");
    let error = qmp
        .blockdev_snapshot_sync("disk0", Path::new(not_utf8), "qcow2")
        .await
        .unwrap_err();
    assert!(matches!(error, QmpError::NonUtf8Path { .. }), "{error:?}");
}

async fn a_hung_or_killed_qemu_is_a_clear_error_not_a_hang() {
    let scratch = Scratch::new("dead");
    let mut qemu = Qemu::start(&scratch, "vm", &["-S"]);
    let mut qmp = qemu.connect().await;

    // Hung: stopped by SIGSTOP, it answers nothing.
    qmp.set_command_timeout(Duration::from_millis(200));
    kill(qemu.pid(), Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    let error = qmp.query_status().await.unwrap_err();
    assert!(matches!(error, QmpError::Timeout { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    eprintln!("hung: {error}");
    kill(qemu.pid(), Signal::SIGCONT).unwrap();
    // The late answer to the timed-out command is dropped, not taken for this one's.
    qmp.set_command_timeout(Duration::from_secs(10));
    assert_eq!(qmp.query_status().await.unwrap(), RunState::Prelaunch);

    // Killed mid-session.
    qemu.child.kill().unwrap();
    qemu.child.wait().unwrap();
    let started = Instant::now();
    let error = qmp.query_status().await.unwrap_err();
    assert!(matches!(error, QmpError::Closed { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    eprintln!("killed: {error}");

    // Its socket file is left behind, refusing connections: connect gives up in time.
    let started = Instant::now();
    let error = Qmp::connect(&qemu.socket, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(error, QmpError::Connect { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
