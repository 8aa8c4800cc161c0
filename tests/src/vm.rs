//! Real microVMs for the end-to-end tests: boot a template with the launcher, talk to
//! its agent over hybrid vsock, power it off, leave nothing behind.
//!
//! # Use
//! ```no_run
//! # async fn example() {
//! use sandbox_tests::vm::VmHost;
//! let Some(host) = VmHost::get("my_test") else { return }; // SANDBOX_SKIP_VM_TESTS=1
//! let vm = host.boot_default().await;
//! let info = vm.client().info().await.unwrap();
//! vm.shutdown().await; // a `shutdown` request; QEMU must exit by itself
//! # let _ = info;
//! # }
//! ```
//!
//! - [`gate`] (in `gate.rs`) is the one prerequisite check of every microVM test: it
//!   fails loudly, saying what to install, unless `SANDBOX_SKIP_VM_TESTS=1`. The
//!   `suite` target turns a skip into ignored trials; [`VmHost::get`] (for targets on
//!   libtest's harness) prints a loud `SKIPPED` line and returns `None`.
//! - [`VmHost::boot`] boots a template (the default: `SANDBOX_TEST_TEMPLATE`, else the
//!   `default` template under `SANDBOX_HOME`) and connects a client with retry. A
//!   missing template fails with the command that builds it.
//! - [`TestVm`] holds the VM and its client. [`TestVm::power_off`] waits for QEMU to
//!   exit by itself after a trigger and checks the console; dropping a `TestVm` asks
//!   the agent to power off (blocking, so it works from `Drop`), then reaps QEMU and
//!   its daemon and removes the run folder. A failing test also gets the console's
//!   tail printed.
//! - [`Sections`] runs the parts of a test that share one VM, each as its own task,
//!   so one failing part does not hide the others.
//! - [`build_template`] runs `sandbox-rootfs build` into a folder of the test's own.
//! - [`PYTHON_TEMPLATE`], the template `scripts/test.sh` builds for Python work:
//!   [`python_gate`] is [`gate`] plus that template, failing with the command that
//!   builds it ([`PYTHON_TEMPLATE_BUILD`]).
//! - [`VmHost::for_bench`] is the host for benchmarks, which are never skipped.
//! - [`TestVm::raw`] opens a [`RawConnection`] through the VM's hybrid vsock socket.
//!
//! Every VM of a test process runs under one private run root in the temp dir (not
//! the user's), removed when the last VM is gone, so
//! [`VmHost::assert_no_run_folders`] can check that nothing was left behind. Its
//! checkpoints (a fork's) go to a private folder too, removed with the run root: a
//! fork's checkpoint holds the disk its parent goes on writing over, so it can only
//! go once the parent has.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use sandbox_vmm::error_chain;
use sandbox_vmm::launcher::{BootSpec, Launcher, LauncherConfig, TemplateRef, Vm};

use crate::bins::rootfs_binary;
use crate::raw::{on_own_thread, RawConnection};
use crate::suite::panic_text;

mod gate;

pub use gate::{
    block_on, default_template, gate, missing, require, vm_main, Gate, VmTest, SKIP_ENV, SKIP_NOTE,
    TEMPLATE_ENV,
};

/// How long a boot may take to `Ready`. Generous: a TCG boot takes about 2.3 s on an
/// idle machine and many times that on a loaded one.
pub const READY_TIMEOUT_SECS: u64 = 120;

/// How long connecting the first client may take after `Ready`.
pub const CONNECT_SECS: u64 = 60;

/// How long QEMU gets to exit by itself once the guest was told to power off. The
/// agent gives processes 3 s between `SIGTERM` and `SIGKILL`.
pub const POWER_OFF_SECS: u64 = 30;

/// How long one of [`Sections`] may take before it fails as hung.
pub const SECTION_SECS: u64 = 180;

/// How much of the console a failing test prints.
const CONSOLE_TAIL_BYTES: usize = 8 * 1024;

/// What the guest kernel prints when it powers off.
pub const POWER_DOWN_LINE: &str = "reboot: Power down";

/// Proof that microVM tests run in this process: the shared launcher, its
/// prerequisites checked.
#[derive(Debug, Clone, Copy)]
pub struct VmHost {
    launcher: &'static Launcher,
}

impl VmHost {
    /// The host once [`gate`] is open; `None` (after a loud `SKIPPED` line naming
    /// `test`) when `SANDBOX_SKIP_VM_TESTS=1`. Panics with what to install when a
    /// prerequisite is missing.
    pub fn get(test: &str) -> Option<Self> {
        require(test).then(|| Self {
            launcher: launcher(),
        })
    }

    /// The launcher every VM of this process boots with.
    pub fn launcher(&self) -> &'static Launcher {
        self.launcher
    }

    /// The host for a benchmark, which cannot be skipped: panics with what is
    /// missing, whatever `SANDBOX_SKIP_VM_TESTS` says. Builds `sandbox-relay` in the
    /// benchmark's profile, where the launcher looks for it first.
    pub fn for_bench() -> Self {
        if let Some(what) = missing() {
            panic!("the benchmark cannot run: {what}");
        }
        crate::binaries();
        Self {
            launcher: launcher(),
        }
    }

    /// Boots the default template.
    pub async fn boot_default(&self) -> TestVm {
        self.boot(default_template()).await
    }

    /// Boots the default template's kernel, not its ready snapshot (for tests of
    /// what a boot does).
    pub async fn boot_default_cold(&self) -> TestVm {
        let mut spec = BootSpec::new(default_template());
        spec.cold = true;
        self.boot_spec(spec).await
    }

    /// Boots `template` and connects a client; panics with the console tail when the
    /// boot fails.
    pub async fn boot(&self, template: TemplateRef) -> TestVm {
        self.boot_spec(BootSpec::new(template)).await
    }

    /// Boots what `spec` says (its ready timeout raised to the tests' own) and
    /// connects a client.
    pub async fn boot_spec(&self, mut spec: BootSpec) -> TestVm {
        let template = spec.template.clone();
        let loaded = match self.launcher.template(&template) {
            Ok(loaded) => loaded,
            Err(error) => panic!(
                "no template to boot: {}\nbuild the default template with \
                 `cargo build -p sandbox-rootfs && target/debug/sandbox-rootfs build`, \
                 point {TEMPLATE_ENV} at a template folder, or set {SKIP_ENV}=1 to skip \
                 the microVM tests",
                error_chain(&error)
            ),
        };
        // The gate checked the default template; a template of the test's own may
        // need `qemu-img` where the default does not.
        assert!(
            loaded.disk.is_none()
                || sandbox_vmm::launcher::accel::find_program(
                    &self.launcher.config().qemu_img_path
                )
                .is_some(),
            "{template} has a root disk and qemu-img is missing (install qemu-utils, e.g. \
             with scripts/setup.sh)"
        );
        let lease = Lease::take(self.launcher);
        spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
        let vm = match self.launcher.boot(spec).await {
            Ok(vm) => vm,
            Err(error) => panic!("booting {template} failed: {}", error_chain(&error)),
        };
        let client = connect(&vm).await;
        TestVm {
            client: Some(client),
            vm: Some(vm),
            _lease: lease,
        }
    }

    /// Panics unless every VM of this process is gone with its run folder (call it
    /// only where no other test of the process may have a VM).
    pub fn assert_no_run_folders(&self) {
        let left = self.launcher.list().expect("cannot list the run folders");
        assert!(left.is_empty(), "run folders left behind: {left:?}");
    }
}

/// The template for Python work (Debian with CPython, pip, pytest, git, curl and the
/// CA certificates, a warm `default` session) that `scripts/test.sh` builds with
/// [`PYTHON_TEMPLATE_BUILD`].
pub const PYTHON_TEMPLATE: &str = "python";

/// The command that builds [`PYTHON_TEMPLATE`], as `scripts/test.sh` and the README
/// write it (a test checks that they do).
pub const PYTHON_TEMPLATE_BUILD: &str = "target/debug/sandbox-rootfs build --name python \
    --base debian --packages python3,python3-pip,python3-pytest,git,curl,ca-certificates \
    --warm-session 'default:python:import json, os, sys'";

/// [`PYTHON_TEMPLATE`] to boot.
pub fn python_template() -> TemplateRef {
    TemplateRef::Name(PYTHON_TEMPLATE.to_owned())
}

/// What the tests and benchmarks of [`PYTHON_TEMPLATE`] lack, with the command that
/// builds it; `None` when it is there.
pub fn python_template_missing() -> Option<String> {
    let error = launcher().template(&python_template()).err()?;
    Some(format!(
        "no {PYTHON_TEMPLATE} template ({}): build it with `cargo build --workspace --bins && \
         {PYTHON_TEMPLATE_BUILD}` (scripts/test.sh does), or set {SKIP_ENV}=1 to skip the \
         microVM tests",
        error_chain(&error)
    ))
}

/// The gate of the tests that boot [`PYTHON_TEMPLATE`]: [`gate`], then the template.
pub fn python_gate() -> Gate {
    match gate() {
        Gate::Open => python_template_missing().map_or(Gate::Open, Gate::Missing),
        closed => closed.clone(),
    }
}

/// The process-wide launcher, with a private run root under the temp dir (short, as
/// the sockets in it must fit `sun_path`) and a private checkpoint folder next to it
/// (the launcher counts a checkpoint's users under its own run root only, so another
/// process's sweep of a shared folder would remove a fork's checkpoint in use here).
fn launcher() -> &'static Launcher {
    static LAUNCHER: OnceLock<Launcher> = OnceLock::new();
    LAUNCHER.get_or_init(|| {
        let mut config = LauncherConfig::from_env()
            .unwrap_or_else(|e| panic!("launcher configuration: {}", error_chain(&e)));
        let root = std::env::temp_dir().join(format!("sbx-vm-{}", std::process::id()));
        config.checkpoint_root = root.with_extension("checkpoints");
        config.run_root = root;
        Launcher::new(config)
    })
}

/// VMs of this process that are booting or running; guarded so that the last one
/// out can remove the (then empty) run root without racing a new boot.
static LIVE_VMS: Mutex<usize> = Mutex::new(0);

/// One VM's share of the run root: the last lease dropped removes the folder, and
/// the checkpoint folder.
#[derive(Debug)]
struct Lease {
    run_root: PathBuf,
    checkpoint_root: PathBuf,
}

impl Lease {
    fn take(launcher: &Launcher) -> Self {
        *LIVE_VMS.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Self {
            run_root: launcher.config().run_root.clone(),
            checkpoint_root: launcher.config().checkpoint_root.clone(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut live = LIVE_VMS.lock().unwrap_or_else(PoisonError::into_inner);
        *live -= 1;
        if *live == 0 {
            // Only succeeds when empty: a VM left behind keeps its folder for the
            // assertions (and the launcher's sweep) to find, and the checkpoints it
            // may map.
            let _ = std::fs::remove_dir(&self.run_root);
            if !self.run_root.exists() {
                let _ = std::fs::remove_dir_all(&self.checkpoint_root);
            }
        }
    }
}

/// A client for `vm`'s agent, retried until the agent answers.
async fn connect(vm: &Vm) -> Client {
    let url: AgentUrl = vm.agent_url().parse().expect("the launcher gave a bad URL");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(CONNECT_SECS);
    let options = vm.connect_options(ConnectOptions::default().connect_timeout);
    match Client::connect_with_retry(&url, &options, deadline).await {
        Ok(client) => client,
        Err(error) => panic!(
            "cannot connect to the agent at {url}: {}\nconsole:\n{}",
            error_chain(&error),
            read_console(vm)
        ),
    }
}

fn read_console(vm: &Vm) -> String {
    std::fs::read(vm.console_log_path())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|e| format!("(no console log: {e})"))
}

/// A booted microVM and a client connected to its agent.
#[derive(Debug)]
pub struct TestVm {
    client: Option<Client>,
    vm: Option<Vm>,
    // Dropped after the VM (fields drop after `Drop::drop`).
    _lease: Lease,
}

impl TestVm {
    /// The client connected at boot.
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the VM was powered off")
    }

    /// The launcher that booted it (the process's one): to fork it, say.
    pub fn launcher(&self) -> &'static Launcher {
        launcher()
    }

    /// The launcher's handle.
    pub fn vm(&self) -> &Vm {
        self.vm.as_ref().expect("the VM was powered off")
    }

    /// A new, separate connection to the agent.
    pub async fn connect(&self) -> Client {
        connect(self.vm()).await
    }

    /// A raw connection to the agent through the VM's socket (its relay's, or its
    /// hybrid vsock socket), no hello sent.
    pub async fn raw(&self) -> RawConnection {
        RawConnection::to(&self.vm().url()).await
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        read_console(self.vm())
    }

    /// Runs `trigger` (which should make the guest power off), then waits up to
    /// [`POWER_OFF_SECS`] for QEMU to exit by itself and checks that the console says
    /// the guest powered down. Cleans up and returns the console and how long QEMU
    /// took to exit after the trigger returned.
    pub async fn power_off<F: Future<Output = ()>>(mut self, trigger: F) -> (String, Duration) {
        trigger.await;
        let started = Instant::now();
        let mut vm = self.vm.take().expect("the VM was powered off");
        let run_dir = vm.run_dir().to_owned();
        let waited =
            tokio::time::timeout(Duration::from_secs(POWER_OFF_SECS), vm.wait_exit()).await;
        let took = started.elapsed();
        let console = read_console(&vm);
        match waited {
            Ok(Ok(status)) => assert!(status.success(), "QEMU exited with {status}"),
            Ok(Err(error)) => panic!("cannot wait for QEMU: {}", error_chain(&error)),
            Err(_) => panic!(
                "QEMU still runs {POWER_OFF_SECS}s after the guest was told to power off; \
                 console:\n{console}"
            ),
        }
        assert!(
            console.contains(POWER_DOWN_LINE),
            "QEMU exited but the console lacks {POWER_DOWN_LINE:?}:\n{console}"
        );
        drop(self.client.take());
        drop(vm);
        assert!(!run_dir.exists(), "run folder {run_dir:?} left behind");
        (console, took)
    }

    /// Powers the guest off with a `shutdown` request and checks it went down.
    pub async fn shutdown(self) -> Duration {
        let client = self.client().clone();
        let (_, took) = self
            .power_off(async move {
                // The reply may be lost to the power-off itself; QEMU exiting is the test.
                let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown(false)).await;
            })
            .await;
        took
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        drop(self.client.take());
        let Some(vm) = self.vm.take() else {
            return;
        };
        if std::thread::panicking() {
            let console = std::fs::read(vm.console_log_path()).unwrap_or_default();
            let tail = &console[console.len().saturating_sub(CONSOLE_TAIL_BYTES)..];
            eprintln!(
                "---- console of VM {} (end) ----\n{}\n---- end ----",
                vm.id(),
                String::from_utf8_lossy(tail)
            );
        }
        // Ask the guest to power off; then dropping the handle reaps QEMU (killing it
        // if it still runs), stops the daemon and removes the run folder.
        if let Err(error) = request_power_off(vm.url(), vm.token().to_owned()) {
            eprintln!(
                "VM {}: shutdown request failed ({error}); killing it",
                vm.id()
            );
        } else if let Some(pid) = vm.qemu_pid() {
            wait_exited(pid, Duration::from_secs(10));
        }
        drop(vm);
    }
}

/// Sends `shutdown` through a raw connection on a thread of its own, so it works in
/// `Drop` whatever the state of the test's runtime; an error if it did not go through.
fn request_power_off(url: AgentUrl, token: String) -> Result<(), String> {
    // A guest that is gone already has no socket (its relay removed it on the way out).
    if let AgentUrl::Unix(path) | AgentUrl::Hvsock { path, .. } = &url {
        if !path.exists() {
            return Err(format!("{} is gone", path.display()));
        }
    }
    // Through the client, whose errors are values: a guest dying under a test (the
    // kill tests do it on purpose) is an error message here, not a panic.
    let (sender, outcome) = std::sync::mpsc::channel();
    let finished = on_own_thread(Duration::from_secs(10), async move {
        let options = ConnectOptions {
            token: Some(token),
            ..Default::default()
        };
        let result = match Client::connect(&url, &options).await {
            Ok(client) => client
                .shutdown(false)
                .await
                .map_err(|error| error_chain(&error)),
            Err(error) => Err(format!("cannot connect: {}", error_chain(&error))),
        };
        let _ = sender.send(result);
    });
    match outcome.try_recv() {
        Ok(result) => result,
        Err(_) if finished => Err("the request's thread ended without an answer".to_owned()),
        Err(_) => Err("no reply to the shutdown request within 10 s".to_owned()),
    }
}

/// Waits until `pid` (an unreaped child) has exited: it is a zombie or gone.
fn wait_exited(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the parenthesized command name.
            Ok(stat)
                if stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z')) =>
            {
                return
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => return,
        }
    }
}

/// The parts of a test that share one VM: each runs as its own task, so a failing
/// part is reported without hiding the others; [`Sections::finish`] fails the test
/// if any part did. [`Sections::run`] runs one part to its end; [`Sections::start`]
/// runs one in the background (for parts that mostly wait, like a power-off).
#[derive(Debug, Default)]
pub struct Sections {
    failed: Vec<String>,
    background: Vec<(String, Instant, tokio::task::JoinHandle<Duration>)>,
}

impl Sections {
    /// No sections run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one section to completion (or failure), printing its wall time.
    pub async fn run<F>(&mut self, name: &str, section: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let started = Instant::now();
        let outcome = tokio::spawn(bounded(section, started)).await;
        self.record(name, started, outcome);
    }

    /// Starts one section in the background; [`Self::finish`] waits for it.
    pub fn start<F>(&mut self, name: &str, section: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let started = Instant::now();
        let task = tokio::spawn(bounded(section, started));
        self.background.push((name.to_owned(), started, task));
    }

    fn record(
        &mut self,
        name: &str,
        started: Instant,
        outcome: Result<Duration, tokio::task::JoinError>,
    ) {
        let took = started.elapsed();
        match outcome {
            Ok(took) => eprintln!("section {name}: ok in {took:.2?}"),
            Err(error) => {
                let why = match error.try_into_panic() {
                    Ok(panic) => panic_text(panic.as_ref()),
                    Err(error) => error.to_string(),
                };
                eprintln!("section {name}: FAILED after {took:.2?}: {why}");
                self.failed.push(format!("{name}: {why}"));
            }
        }
    }

    /// Waits for the background sections, then panics listing every section that
    /// failed.
    pub async fn finish(mut self) {
        for (name, started, task) in std::mem::take(&mut self.background) {
            let outcome = task.await;
            self.record(&name, started, outcome);
        }
        assert!(
            self.failed.is_empty(),
            "{} section(s) failed:\n{}",
            self.failed.len(),
            self.failed.join("\n")
        );
    }
}

/// Runs `section`, failing it after [`SECTION_SECS`]; returns its wall time.
async fn bounded<F: Future<Output = ()>>(section: F, started: Instant) -> Duration {
    let limit = Duration::from_secs(SECTION_SECS);
    if tokio::time::timeout(limit, section).await.is_err() {
        panic!("did not finish within {SECTION_SECS}s");
    }
    started.elapsed()
}

/// A template `sandbox-rootfs` built.
#[derive(Debug)]
pub struct BuiltTemplate {
    /// The template folder.
    pub dir: PathBuf,
    /// What the builder printed (stdout, then stderr).
    pub log: String,
}

/// Runs `sandbox-rootfs build --name NAME --base BASE --output OUTPUT`; panics with
/// the builder's output when it fails.
pub fn build_template(name: &str, base: &str, output: &Path) -> BuiltTemplate {
    build_template_with(name, base, output, &[])
}

/// [`build_template`] with extra `sandbox-rootfs build` arguments (e.g. a layout).
pub fn build_template_with(name: &str, base: &str, output: &Path, extra: &[&str]) -> BuiltTemplate {
    let started = Instant::now();
    let result = Command::new(rootfs_binary())
        .args(["build", "--name", name, "--base", base, "--output"])
        .arg(output)
        .args(extra)
        .env("NO_COLOR", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cannot run sandbox-rootfs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(
        result.status.success(),
        "sandbox-rootfs build --base {base} failed ({}):\n{log}",
        result.status
    );
    assert!(
        output.join("template.json").is_file(),
        "no template.json in {}:\n{log}",
        output.display()
    );
    eprintln!(
        "built template {name} from {base} in {:.2?}",
        started.elapsed()
    );
    BuiltTemplate {
        dir: output.to_owned(),
        log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command as a shell reads it: continuation lines joined, spaces collapsed,
    /// and the binary by its name.
    fn normalized(text: &str) -> String {
        text.replace("\\\n", " ")
            .replace("target/debug/", "")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Regression guard: the python template's packages are written in three places
    /// (`scripts/test.sh` builds it, the README documents it, the tests name it when
    /// it is missing); a change to one must reach the others.
    #[test]
    fn the_python_template_is_built_as_the_readme_and_test_script_say() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root");
        let command = normalized(PYTHON_TEMPLATE_BUILD);
        for file in ["scripts/test.sh", "README.md"] {
            let text = std::fs::read_to_string(root.join(file)).expect(file);
            assert!(
                normalized(&text).contains(&command),
                "{file} does not build the python template as `{command}`"
            );
        }
    }
}
