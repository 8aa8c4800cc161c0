//! End to end: the launcher boots a real template in a QEMU microVM and cleans up.
//!
//! Needs what the workspace's one microVM gate checks (`tests/src/vm/gate.rs`):
//! `qemu-system-x86_64`, `vhost-device-vsock`, `qemu-img` for a template with a disk,
//! and a template whose agent sends `Ready` (`SANDBOX_TEST_TEMPLATE`, else the
//! `default` template under `SANDBOX_HOME`). A missing prerequisite fails the test;
//! `SANDBOX_SKIP_VM_TESTS=1` marks them ignored (this target runs on `libtest-mimic`).
//!
//! Each boot costs about 1.5 CPU-seconds under TCG, so the tests share work: four
//! boots cover readiness, the agent port, shutdown, drop, two VMs at once, detach and
//! stop from another launcher, and a boot that fails.
//!
//! Boot-to-ready figures: `cargo bench -p sandbox-vmm --bench microvm`.

// Off libtest's harness `#[test]` no longer exempts these functions: a failure here
// is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use sandbox_vmm::launcher::{
    AgentTransport, BootSpec, LaunchError, Launcher, LauncherConfig, StopOutcome, TemplateRef, Vm,
    VmStatus,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const GRACE: Duration = Duration::from_secs(5);

/// The workspace's one microVM prerequisite gate. `sandbox-tests` depends on this
/// crate, so this crate's tests include the gate's file (it needs only `sandbox_vmm`,
/// `tokio` and `libtest-mimic`) instead of depending on `sandbox-tests` in a cycle.
#[path = "../../tests/src/vm/gate.rs"]
#[allow(dead_code)]
mod gate;

fn main() -> std::process::ExitCode {
    gate::vm_main(&[
        gate::VmTest {
            name: "boots_to_ready_serves_the_agent_port_and_shuts_down_clean",
            run: || gate::block_on(boots_to_ready_serves_the_agent_port_and_shuts_down_clean()),
        },
        gate::VmTest {
            name: "two_vms_at_once_then_drop_one_and_stop_the_other_from_elsewhere",
            run: || {
                gate::block_on(two_vms_at_once_then_drop_one_and_stop_the_other_from_elsewhere())
            },
        },
        gate::VmTest {
            name: "a_guest_that_dies_fails_the_boot_with_its_console",
            run: || gate::block_on(a_guest_that_dies_fails_the_boot_with_its_console()),
        },
    ])
}

/// A launcher with a run root of its own, and the template to boot, once the gate is
/// open (the harness marks every test ignored when the microVM tests are skipped).
fn setup(tag: &str) -> Option<(Launcher, TemplateRef)> {
    if !gate::require(&format!("launcher_boot::{tag}")) {
        return None;
    }
    let mut config = LauncherConfig::from_env().expect("launcher configuration");
    // Short and private, so the test can check that nothing is left behind.
    config.run_root = std::env::temp_dir().join(format!("sbx-e2e-{tag}-{}", std::process::id()));
    Some((Launcher::new(config), gate::default_template()))
}

fn spec(template: &TemplateRef) -> BootSpec {
    let mut spec = BootSpec::new(template.clone());
    spec.ready_timeout = READY_TIMEOUT;
    spec
}

async fn boot(launcher: &Launcher, spec: BootSpec) -> Vm {
    match launcher.boot(spec).await {
        Ok(vm) => vm,
        Err(error) => panic!("boot failed: {}", sandbox_vmm::error_chain(&error)),
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn pids(vm: &Vm) -> Vec<u32> {
    let record = vm.record();
    let pids: Vec<u32> = [record.qemu_pid, record.daemon_pid]
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(pids.len(), 2, "record lacks pids: {record:?}");
    pids
}

/// Opens the agent's port through the hybrid vsock socket (`CONNECT`/`OK`).
async fn connect_agent(vm: &Vm) -> String {
    let mut stream = UnixStream::connect(vm.agent_socket())
        .await
        .expect("connect to the hybrid vsock socket");
    stream
        .write_all(format!("CONNECT {}\n", vm.agent_port()).as_bytes())
        .await
        .expect("send CONNECT");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(stream).read_line(&mut line),
    )
    .await
    .expect("no answer to CONNECT")
    .expect("read the CONNECT answer");
    line
}

fn assert_run_root_empty(launcher: &Launcher) {
    let left = launcher.list().expect("list run folders");
    assert!(left.is_empty(), "run folders left behind: {left:?}");
    let _ = std::fs::remove_dir(&launcher.config().run_root);
}

async fn boots_to_ready_serves_the_agent_port_and_shuts_down_clean() {
    let Some((launcher, template)) = setup("ready") else {
        return;
    };
    // The vsock transport here (the other tests boot the default, serial one).
    let mut vsock = spec(&template);
    vsock.transport = Some(AgentTransport::Vsock);
    let vm = boot(&launcher, vsock).await;
    eprintln!(
        "ready in {:?} ({}; agent {}, guest uptime {} ms)",
        vm.boot_duration(),
        vm.accel().reason,
        vm.ready().agent_version,
        vm.ready().uptime_ms
    );
    assert_eq!(vm.ready().magic, sandbox_protocol::MAGIC);
    assert_eq!(
        vm.agent_url(),
        format!("hvsock://{}:1024", vm.agent_socket().display())
    );
    let run_dir = vm.run_dir().to_owned();
    assert!(run_dir.join("vm.json").is_file());
    assert!(vm.console_log_path().is_file());
    let listed = launcher.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, VmStatus::Running);

    let answer = connect_agent(&vm).await;
    assert!(answer.starts_with("OK "), "CONNECT answered {answer:?}");

    let pids = pids(&vm);
    let outcome = vm.shutdown(GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Terminated);
    for pid in pids {
        assert!(!alive(pid), "pid {pid} survived shutdown");
    }
    assert!(!run_dir.exists(), "run folder survived shutdown");
    assert_run_root_empty(&launcher);
}

async fn two_vms_at_once_then_drop_one_and_stop_the_other_from_elsewhere() {
    let Some((launcher, template)) = setup("pair") else {
        return;
    };
    let mut detached = spec(&template);
    detached.detached = true;
    let (a, b) = tokio::join!(boot(&launcher, spec(&template)), boot(&launcher, detached));
    assert_ne!(a.id(), b.id());
    assert_ne!(a.agent_socket(), b.agent_socket());
    let (a_pids, b_pids) = (pids(&a), pids(&b));
    let a_dir = a.run_dir().to_owned();

    // Drop: synchronous SIGKILL, reap, folder removed.
    drop(a);
    for pid in a_pids {
        assert!(!alive(pid), "pid {pid} survived drop");
    }
    assert!(!a_dir.exists());

    // Detach, then stop by id through a launcher that never owned it.
    let record = b.detach().expect("booted detached");
    for &pid in &b_pids {
        assert!(alive(pid), "detached pid {pid} died");
    }
    let other = Launcher::new(launcher.config().clone());
    let listed = other.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, VmStatus::Running);
    assert!(other.sweep().unwrap().is_empty(), "sweep took a live VM");
    let outcome = other.stop(&record.id, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Terminated);
    for pid in b_pids {
        assert!(!alive(pid), "pid {pid} survived stop");
    }
    assert_run_root_empty(&launcher);
}

async fn a_guest_that_dies_fails_the_boot_with_its_console() {
    let Some((launcher, template)) = setup("fail") else {
        return;
    };
    let mut spec = spec(&template);
    // No such init: the kernel panics, panic=-1 and -no-reboot end QEMU.
    spec.extra_cmdline = "rdinit=/nonexistent-init".into();
    let error = launcher
        .boot(spec)
        .await
        .expect_err("booted without an init");
    let text = sandbox_vmm::error_chain(&error);
    assert!(
        matches!(error, LaunchError::QemuExited { .. }),
        "unexpected error: {text}"
    );
    assert!(text.contains("Kernel panic"), "no console tail in: {text}");
    assert_run_root_empty(&launcher);
}
