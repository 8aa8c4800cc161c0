//! End to end: the launcher boots a real template in a QEMU microVM and cleans up.
//!
//! Needs `qemu-system-x86_64`, `qemu-img`, `vhost-device-vsock` and a template whose
//! agent sends `Ready`: `SANDBOX_TEST_TEMPLATE` (a template folder), else the
//! `default` template under `SANDBOX_HOME`. A missing prerequisite fails the test;
//! `SANDBOX_SKIP_VM_TESTS=1` skips these tests, saying so.
//!
//! Each boot costs about 1.5 CPU-seconds under TCG, so the tests share work: four
//! boots cover readiness, the agent port, shutdown, drop, two VMs at once, detach and
//! stop from another launcher, and a boot that fails.
//!
//! Boot-to-ready figures: `cargo bench -p sandbox-vmm --bench microvm`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_vmm::launcher::{
    BootSpec, LaunchError, Launcher, LauncherConfig, StopOutcome, TemplateRef, Vm, VmStatus,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const GRACE: Duration = Duration::from_secs(5);

/// A launcher with a run root of its own, and the template to boot; `None` when the
/// tests are explicitly skipped.
fn setup(tag: &str) -> Option<(Launcher, TemplateRef)> {
    if std::env::var_os("SANDBOX_SKIP_VM_TESTS").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED {tag}: SANDBOX_SKIP_VM_TESTS=1");
        return None;
    }
    let mut config = LauncherConfig::from_env().expect("launcher configuration");
    // Short and private, so the test can check that nothing is left behind.
    config.run_root = std::env::temp_dir().join(format!("sbx-e2e-{tag}-{}", std::process::id()));
    let mut programs = vec![config.qemu_path.clone(), config.vhost_path.clone()];
    let template = match std::env::var_os("SANDBOX_TEST_TEMPLATE") {
        Some(dir) => TemplateRef::Path(PathBuf::from(dir)),
        None => TemplateRef::default(),
    };
    let launcher = Launcher::new(config);
    match launcher.template(&template) {
        Ok(t) if t.disk.is_some() => programs.push(launcher.config().qemu_img_path.clone()),
        Ok(_) => {}
        Err(error) => panic!(
            "no template to boot: {}\nbuild the default template, set SANDBOX_TEST_TEMPLATE, \
             or SANDBOX_SKIP_VM_TESTS=1 to skip VM tests",
            chain(&error)
        ),
    }
    for program in programs {
        assert!(
            on_path(&program),
            "{} not found: install it (or SANDBOX_SKIP_VM_TESTS=1 to skip VM tests)",
            program.display()
        );
    }
    Some((launcher, template))
}

fn on_path(program: &Path) -> bool {
    if program.components().count() > 1 {
        return program.is_file();
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .any(|dir| dir.join(program).is_file())
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn spec(template: &TemplateRef) -> BootSpec {
    let mut spec = BootSpec::new(template.clone());
    spec.ready_timeout = READY_TIMEOUT;
    spec
}

async fn boot(launcher: &Launcher, spec: BootSpec) -> Vm {
    match launcher.boot(spec).await {
        Ok(vm) => vm,
        Err(error) => panic!("boot failed: {}", chain(&error)),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_to_ready_serves_the_agent_port_and_shuts_down_clean() {
    let Some((launcher, template)) = setup("ready") else {
        return;
    };
    let vm = boot(&launcher, spec(&template)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let text = chain(&error);
    assert!(
        matches!(error, LaunchError::QemuExited { .. }),
        "unexpected error: {text}"
    );
    assert!(text.contains("Kernel panic"), "no console tail in: {text}");
    assert_run_root_empty(&launcher);
}
