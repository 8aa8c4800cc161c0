//! The one prerequisite gate for every microVM test of the workspace: QEMU,
//! `vhost-device-vsock`, `qemu-img` when the template has a disk, and a template to
//! boot. What is missing fails the tests loudly, saying how to get it; only the
//! explicit `SANDBOX_SKIP_VM_TESTS=1` skips them.
//!
//! It needs nothing but `sandbox_vmm`, `std`, `tokio` and `libtest-mimic`, so that
//! `sandbox-vmm`'s own tests (which `sandbox-tests` depends on, so they cannot depend
//! on it) include this file by path and share the same gate and harness
//! ([`vm_main`]).

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::accel::find_program;
use sandbox_vmm::launcher::{Launcher, LauncherConfig, TemplateRef};

/// Set to `1` to skip every microVM test explicitly.
pub const SKIP_ENV: &str = "SANDBOX_SKIP_VM_TESTS";

/// A template folder to boot instead of the `default` template.
pub const TEMPLATE_ENV: &str = "SANDBOX_TEST_TEMPLATE";

/// Whether microVM tests may run in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Everything they need is there.
    Open,
    /// `SANDBOX_SKIP_VM_TESTS=1`: they must show as skipped, never as passed.
    Skipped,
    /// Something is missing; the message says what and how to get it. They must fail
    /// with it.
    Missing(String),
}

/// The gate, checked once per process.
pub fn gate() -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(check)
}

/// For targets on libtest's own harness, which cannot mark a test ignored at run
/// time: true when `test` should run; when skipped, prints a loud `SKIPPED` line
/// (the only sign, as libtest then counts the test as passed) and returns false;
/// panics with what is missing otherwise.
pub fn require(test: &str) -> bool {
    match gate() {
        Gate::Open => true,
        Gate::Skipped => {
            // Written to the stream itself: libtest captures `eprintln!` of a passing
            // test, and this line must show.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: {SKIP_ENV}=1, no microVM was booted (counted as passed)"
            );
            false
        }
        Gate::Missing(what) => panic!("{what}"),
    }
}

/// The template the tests boot: `SANDBOX_TEST_TEMPLATE`, else `default`.
pub fn default_template() -> TemplateRef {
    match std::env::var_os(TEMPLATE_ENV) {
        Some(dir) => TemplateRef::Path(PathBuf::from(dir)),
        None => TemplateRef::default(),
    }
}

fn check() -> Gate {
    if std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1") {
        return Gate::Skipped;
    }
    match missing() {
        None => Gate::Open,
        Some(what) => Gate::Missing(what),
    }
}

/// What the microVM tests need and this machine lacks, with how to get it; `None`
/// when nothing is missing. Ignores `SANDBOX_SKIP_VM_TESTS` (for benchmarks, which
/// cannot be skipped).
pub fn missing() -> Option<String> {
    let config = match LauncherConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            return Some(format!(
                "the microVM tests cannot configure the launcher: {}",
                error_chain(&error)
            ))
        }
    };
    let need = |program: &PathBuf, package: &str| {
        find_program(program)
            .is_none()
            .then(|| format!("{} (install {package})", program.display()))
    };
    let mut missing: Vec<String> = [
        need(&config.qemu_path, "qemu-system-x86"),
        need(
            &config.vhost_path,
            "vhost-device-vsock: cargo install vhost-device-vsock",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let template = default_template();
    match Launcher::new(config.clone()).template(&template) {
        Ok(loaded) if loaded.disk.is_some() => {
            missing.extend(need(&config.qemu_img_path, "qemu-utils"));
        }
        Ok(_) => {}
        Err(error) => missing.push(format!(
            "the template {template} ({}): build it with `cargo build -p sandbox-rootfs && \
             target/debug/sandbox-rootfs build`, or point {TEMPLATE_ENV} at a template folder",
            error_chain(&error)
        )),
    }
    (!missing.is_empty()).then(|| {
        format!(
            "the microVM tests need: {}. scripts/setup.sh installs the programs; set \
             {SKIP_ENV}=1 to skip these tests explicitly",
            missing.join("; ")
        )
    })
}

/// What an ignored trial says.
pub const SKIP_NOTE: &str = "SANDBOX_SKIP_VM_TESTS=1";

/// A test of a target on this harness whose every test boots microVMs.
#[derive(Debug, Clone, Copy)]
pub struct VmTest {
    /// The trial's name.
    pub name: &'static str,
    /// Runs it; a panic is a failure.
    pub run: fn(),
}

/// The `main` of a target of [`VmTest`]s: each is a trial, *ignored* (and shown so)
/// when `SANDBOX_SKIP_VM_TESTS=1`, failing with what is missing when the gate says
/// so. Unlike libtest's own harness, nothing counts as passed without running.
pub fn vm_main(tests: &[VmTest]) -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trials = tests
        .iter()
        .map(|test| {
            let run = test.run;
            Trial::ignorable_test(test.name, move || match gate() {
                Gate::Open => {
                    run();
                    Ok(Completion::Completed)
                }
                Gate::Skipped => Ok(Completion::ignored_with(SKIP_NOTE)),
                Gate::Missing(what) => Err(Failed::from(what)),
            })
            .with_ignored_flag(*gate() == Gate::Skipped)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Runs `test` on a fresh two-worker runtime (what a microVM test with a background
/// power-off and a foreground client needs).
pub fn block_on<F: std::future::Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot build a runtime")
        .block_on(test);
}
