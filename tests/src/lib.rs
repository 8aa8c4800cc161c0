//! End-to-end test harness: the real `sandbox-agent` on a throwaway Unix socket or as
//! PID 1 of a real microVM, driven through the `sandbox-vmm` client, raw frames and
//! the `sandboxctl` binary.
//!
//! # Layout
//! - [`bins`]: builds `sandbox-agent` and `sandboxctl` (and `sandbox-rootfs`) once per
//!   test process with the same cargo, profile and target directory as the tests.
//! - [`transport`]: the seam between scenarios and where the agent runs; a
//!   [`transport::Target`] gives a connected client, more clients, raw connections
//!   and facts such as "the agent is PID 1".
//! - [`scenarios`]: every transport-independent scenario, written once, in one list;
//!   [`suite`] runs the list over every transport as `libtest-mimic` trials
//!   (`tests/suite.rs`).
//! - [`vm`]: real microVMs and the one prerequisite gate of the microVM tests.
//! - [`node`]: [`node::NodeDaemon`], a real `sandboxd` attached to one agent, for
//!   the suite's `upgrade` transport.
//! - [`raw`]: the one raw-frame connection (malformed input, cleanup from `Drop`).
//! - [`TestAgent`]: starts the agent in a fresh temporary directory, waits until its
//!   socket accepts, and on drop kills whatever it still runs, then the agent itself
//!   (printing the agent's log when the test failed).
//! - [`TestCommand`]: runs `sandboxctl --agent unix://…` with a deadline.
//! - helpers shared by the tests in `tests/`: request builders, [`sh`],
//!   [`follow_to_end`] (which checks that a follow stream has no gaps or duplicates),
//!   [`wait_until_gone`], [`eventually`] and [`within`].
//!
//! Nothing here skips silently: a binary that does not build or an agent that does
//! not come up fails the test with the build output or the agent's log; only the
//! explicit `SANDBOX_SKIP_VM_TESTS=1` skips the microVM tests, and says so.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sandbox_protocol::{
    Command as Cmd, ExecRequest, ExitStatus, KillRequest, LogsReply, Pid, ProcessSpec,
    ProcessState, Reply, Request,
};
use sandbox_vmm::client::{Client, ConnectOptions, LogsEvent};

use crate::raw::{on_own_thread, RawConnection};

pub mod bins;
pub mod node;
pub mod raw;
pub mod scenarios;
pub mod screen;
pub mod suite;
pub mod transport;
pub mod vm;

pub use bins::{binaries, Binaries};

/// How long the agent gets to start listening.
const AGENT_START_SECS: u64 = 20;

/// Default deadline for one `sandboxctl` run.
const COMMAND_DEADLINE_SECS: u64 = 60;

/// A variable set in the agent's own environment; children must not inherit it.
pub const CANARY_ENV: &str = "SANDBOX_TEST_CANARY";

/// Set this to a `tracing` filter (e.g. `debug`) to make the test agents log more;
/// a failing test prints its agent's log.
pub const LOG_FILTER_ENV: &str = "SANDBOX_TEST_AGENT_LOG";

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh, private directory under the system temp dir.
    pub fn new(tag: &str) -> Self {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// A fresh, private directory under `parent`.
    pub fn new_in(parent: &Path, tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!("sbx-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("cannot create a temp dir");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
            .expect("cannot chmod the temp dir");
        Self { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// How to start a [`TestAgent`].
#[derive(Debug, Default, Clone)]
pub struct AgentOptions {
    /// `--token`
    pub token: Option<String>,
    /// `--forget-after-secs`
    pub forget_after_secs: Option<u64>,
    /// `--image-config`: the template's defaults and boot sessions, as the builder
    /// writes them into an image (`/etc/sandbox/image.json`).
    pub image_config: Option<PathBuf>,
    /// Serve the link (`link+unix://`) behind a `sandbox-relay`, the transport of
    /// snapshot-capable VMs, instead of a plain Unix socket: clients reach the agent
    /// through the relay exactly as they reach a VM's.
    pub link: bool,
}

/// A running `sandbox-agent` listening on a throwaway Unix socket.
#[derive(Debug)]
pub struct TestAgent {
    child: Child,
    /// The relay in front of the agent ([`AgentOptions::link`]).
    relay: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    token: Option<String>,
    // Last, so the directory outlives the cleanup in `drop`.
    dir: TempDir,
}

impl TestAgent {
    /// An agent with default options.
    pub fn start() -> Self {
        Self::start_with(AgentOptions::default())
    }

    /// An agent with `options`; waits until its socket accepts connections.
    pub fn start_with(options: AgentOptions) -> Self {
        let binaries = binaries();
        let dir = TempDir::new("agent");
        let socket = dir.path().join("agent.sock");
        let log = dir.path().join("agent.log");
        let log_file = std::fs::File::create(&log).expect("cannot create the agent log");
        let link_socket = dir.path().join("link.sock");
        let listen = match options.link {
            true => format!("link+unix://{}", link_socket.display()),
            false => format!("unix://{}", socket.display()),
        };
        let mut command = Command::new(&binaries.agent);
        command
            .arg("--listen")
            .arg(listen)
            .env(CANARY_ENV, "leaked")
            .env_remove("SANDBOX_AGENT_TOKEN")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("cannot dup the log"))
            .stderr(log_file);
        if let Ok(filter) = std::env::var(LOG_FILTER_ENV) {
            command.arg("--log").arg(filter);
        }
        if let Some(token) = &options.token {
            command.arg("--token").arg(token);
        }
        if let Some(secs) = options.forget_after_secs {
            command.arg("--forget-after-secs").arg(secs.to_string());
        }
        if let Some(path) = &options.image_config {
            command.arg("--image-config").arg(path);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binaries.agent.display()));
        let relay = options.link.then(|| {
            let relay_log = std::fs::File::create(dir.path().join("relay.log"))
                .expect("cannot create the relay log");
            Command::new(&binaries.relay)
                .arg("--agent")
                .arg(&link_socket)
                .arg("--listen")
                .arg(&socket)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(relay_log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binaries.relay.display()))
        });
        let mut agent = Self {
            child,
            relay,
            socket,
            log,
            token: options.token,
            dir,
        };
        agent.wait_listening();
        agent
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(AGENT_START_SECS);
        loop {
            if let Some(status) = self.child.try_wait().expect("cannot poll the agent") {
                panic!(
                    "the agent exited with {status} before listening; its log:\n{}",
                    self.log()
                );
            }
            if StdUnixStream::connect(&self.socket).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not listen on {} within {AGENT_START_SECS}s; its log:\n{}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `unix://…` for this agent.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The agent's process id, for reading its memory and descriptors in /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A scratch directory that lives as long as the agent.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the agent (and its relay, if any) has logged so far.
    pub fn log(&self) -> String {
        let mut log =
            std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(no log: {e})"));
        if self.relay.is_some() {
            let relay = std::fs::read_to_string(self.dir.path().join("relay.log"))
                .unwrap_or_else(|e| format!("(no log: {e})"));
            log.push_str("---- relay log ----\n");
            log.push_str(&relay);
        }
        log
    }

    /// True while the agent process runs.
    pub fn is_alive(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("cannot poll the agent")
            .is_none()
    }

    /// Panics (with the agent's log) unless the agent still runs.
    pub fn assert_alive(&mut self) {
        let log = self.log();
        assert!(self.is_alive(), "the agent died; its log:\n{log}");
    }

    /// Kills the agent process right away (SIGKILL), to test connection loss.
    pub fn kill_agent(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Connection options carrying this agent's token.
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            token: self.token.clone(),
            ..ConnectOptions::default()
        }
    }

    /// Records that the agent now requires `token` (it was sent a `reidentify`), so
    /// later clients, `sandboxctl` and the cleanup on drop present it.
    pub fn token_replaced(&mut self, token: &str) {
        self.token = Some(token.to_owned());
    }

    /// A new client connection.
    pub async fn client(&self) -> Client {
        let url = self.url().parse().expect("bad test URL");
        match Client::connect(&url, &self.options()).await {
            Ok(client) => client,
            Err(error) => panic!(
                "cannot connect to the test agent: {}\nagent log:\n{}",
                sandbox_vmm::error_chain(&error),
                self.log()
            ),
        }
    }

    /// `sandboxctl --agent unix://…` (and `--token` when the agent has one).
    pub fn sandboxctl(&self) -> TestCommand {
        let mut command = Command::new(&binaries().sandboxctl);
        command
            .arg("--agent")
            .arg(self.url())
            .env_remove("SANDBOX_AGENT")
            .env_remove("SANDBOX_TOKEN");
        if let Some(token) = &self.token {
            command.arg("--token").arg(token);
        }
        TestCommand::new(command)
    }

    /// Kills every process the agent still runs (best effort, blocking: for `Drop`).
    fn kill_leftovers(&self) {
        let (socket, token) = (self.socket.clone(), self.token.clone());
        on_own_thread(Duration::from_secs(5), async move {
            let mut raw = RawConnection::unix(&socket).await.hello(token).await;
            let Reply::Ps(list) = raw.call(1, Request::Ps).await else {
                return;
            };
            for (id, info) in (2..).zip(list) {
                if info.state == ProcessState::Running {
                    let kill = KillRequest {
                        pid: info.pid,
                        signal: libc::SIGKILL,
                    };
                    raw.call(id, Request::Kill(kill)).await;
                }
            }
        });
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if self.is_alive() {
            self.kill_leftovers();
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = wait_child(&mut self.child, Duration::from_secs(2));
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(relay) = &mut self.relay {
            // It exits when the agent's end closes; make sure.
            let _ = wait_child(relay, Duration::from_secs(2));
            let _ = relay.kill();
            let _ = relay.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- agent log ----\n{}---- end ----", self.log());
        }
    }
}

/// `sandboxctl` with arguments, stdin and a deadline.
#[derive(Debug)]
pub struct TestCommand {
    command: Command,
    stdin: Vec<u8>,
    deadline: Duration,
}

impl TestCommand {
    fn new(command: Command) -> Self {
        Self {
            command,
            stdin: Vec::new(),
            deadline: Duration::from_secs(COMMAND_DEADLINE_SECS),
        }
    }

    /// `sandboxctl` with no agent configured (neither flag nor environment).
    pub fn new_sandboxctl() -> Self {
        let mut command = Command::new(&binaries().sandboxctl);
        command
            .env_remove("SANDBOX_AGENT")
            .env_remove("SANDBOX_TOKEN");
        Self::new(command)
    }

    /// Adds a flag followed by a path.
    pub fn arg_path(&mut self, flag: &str, path: &Path) -> &mut Self {
        self.command.arg(flag).arg(path);
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Sets an environment variable for sandboxctl.
    pub fn env(&mut self, key: &str, value: &str) -> &mut Self {
        self.command.env(key, value);
        self
    }

    /// Bytes to write to sandboxctl's stdin (a pipe, closed afterwards).
    pub fn stdin(&mut self, data: impl Into<Vec<u8>>) -> &mut Self {
        self.stdin = data.into();
        self
    }

    /// How long it may run before the test fails.
    pub fn deadline(&mut self, deadline: Duration) -> &mut Self {
        self.deadline = deadline;
        self
    }

    /// Runs it to completion (or fails the test at the deadline).
    pub fn output(&mut self) -> Output {
        self.command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.command.spawn().expect("cannot start sandboxctl");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let data = std::mem::take(&mut self.stdin);
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let out_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        let Some(status) = wait_child(&mut child, self.deadline) else {
            let _ = child.kill();
            let _ = child.wait();
            let stdout = out_reader.join().unwrap_or_default();
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "{:?} ran past {:?}\nstdout: {}\nstderr: {}",
                self.command,
                self.deadline,
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            );
        };
        let _ = writer.join();
        Output {
            status,
            stdout: out_reader.join().expect("stdout reader panicked"),
            stderr: err_reader.join().expect("stderr reader panicked"),
        }
    }

    /// Runs it and asserts it exited with `code`; returns the output.
    pub fn assert_code(&mut self, code: i32) -> Output {
        let output = self.output();
        assert_eq!(
            output.status.code(),
            Some(code),
            "{:?}\nstdout: {}\nstderr: {}",
            self.command,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Runs it, asserts success, and returns stdout as text.
    pub fn stdout_ok(&mut self) -> String {
        let output = self.assert_code(0);
        String::from_utf8(output.stdout).expect("stdout is not UTF-8")
    }
}

/// A spec running `script` with `/bin/sh -c`.
pub fn shell(script: &str) -> ProcessSpec {
    ProcessSpec::new(Cmd::Shell(script.to_owned()))
}

/// A spec running an argument vector.
pub fn argv(args: &[&str]) -> ProcessSpec {
    ProcessSpec::new(Cmd::Argv(args.iter().map(|&a| a.to_owned()).collect()))
}

/// A collected (non-streaming) exec of `script` with no stdin and the default deadline.
pub fn exec_sh(script: &str) -> ExecRequest {
    ExecRequest {
        spec: shell(script),
        stdin: Vec::new(),
        timeout_ms: None,
        stream: false,
    }
}

/// Everything a follow stream delivered.
#[derive(Debug)]
pub struct Followed {
    /// All chunk bytes in order.
    pub data: Vec<u8>,
    /// Total bytes reported dropped.
    pub dropped: u64,
    /// The cursor after the last batch.
    pub end: u64,
    /// How many events (batches) came before the final reply.
    pub events: usize,
    /// The final reply's exit status.
    pub exit: Option<ExitStatus>,
}

/// Follows `pid` from `cursor` to the end, asserting the stream's accounting: each
/// chunk starts where the previous one (plus reported drops) ended, and every batch's
/// `end` equals the running cursor. So nothing is duplicated and nothing is skipped
/// without being counted.
pub async fn follow_to_end(client: &Client, pid: Pid, cursor: u64) -> Followed {
    let mut stream = client
        .logs_follow(pid, Some(cursor))
        .expect("cannot start follow");
    let mut followed = Followed {
        data: Vec::new(),
        dropped: 0,
        end: cursor,
        events: 0,
        exit: None,
    };
    loop {
        let event = stream.next().await.expect("follow failed");
        let (batch, reply): (_, Option<LogsReply>) = match event {
            LogsEvent::Batch(batch) => {
                followed.events += 1;
                (batch, None)
            }
            LogsEvent::Finished(reply) => (reply.batch.clone(), Some(reply)),
        };
        let mut next = followed.end + batch.dropped;
        followed.dropped += batch.dropped;
        for chunk in &batch.chunks {
            assert_eq!(
                chunk.offset, next,
                "chunk at offset {} but the stream was at {next} (gap or duplicate)",
                chunk.offset
            );
            next += chunk.data.len() as u64;
            followed.data.extend_from_slice(&chunk.data);
        }
        assert_eq!(batch.end, next, "batch end disagrees with its chunks");
        followed.end = next;
        if let Some(reply) = reply {
            followed.exit = reply.exit;
            return followed;
        }
    }
}

/// Waits for `pid` to end by following its output; returns how it ended.
pub async fn wait_exit(client: &Client, pid: Pid) -> ExitStatus {
    let followed = within(30, follow_to_end(client, pid, 0)).await;
    followed
        .exit
        .unwrap_or_else(|| panic!("follow of {pid} ended without an exit status"))
}

/// Awaits `future`, failing the test if it takes longer than `secs`.
pub async fn within<F: std::future::Future>(secs: u64, future: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(secs), future).await {
        Ok(output) => output,
        Err(_) => panic!("did not finish within {secs}s"),
    }
}

/// `ProcessInfo` of `pid` from `ps`, if listed.
pub async fn ps_entry(client: &Client, pid: Pid) -> Option<sandbox_protocol::ProcessInfo> {
    client
        .ps()
        .await
        .expect("ps failed")
        .into_iter()
        .find(|info| info.pid == pid)
}

/// Runs `script` with `/bin/sh -c` and returns its stdout as text, asserting it
/// exited 0 (the failure shows its stderr).
pub async fn sh(client: &Client, script: &str) -> String {
    let reply = within(60, client.exec(exec_sh(script)))
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert_eq!(
        reply.exit.and_then(|status| status.code),
        Some(0),
        "{script}: {}{}",
        String::from_utf8_lossy(&reply.stdout),
        String::from_utf8_lossy(&reply.stderr)
    );
    String::from_utf8(reply.stdout).unwrap_or_else(|e| panic!("{script}: {e}"))
}

/// How long [`wait_until_gone`] waits. Generous: a guest under TCG on a loaded host
/// takes a while to deliver a signal and reap.
const GONE_SECS: u64 = 15;

/// Waits until no process `pid` exists in the agent's machine: `kill -0` fails, so it
/// has exited *and* been reaped (a zombie still counts as there). Panics after
/// [`GONE_SECS`] saying `what` should have ended it.
pub async fn wait_until_gone(client: &Client, pid: i32, what: &str) {
    let script = format!("kill -0 {pid} 2>/dev/null; echo $?");
    let what = format!("process {pid} to go ({what})");
    eventually(Duration::from_secs(GONE_SECS), &what, || async {
        (sh(client, &script).await.trim() != "0").then_some(())
    })
    .await;
}

/// Polls `check` every 50 ms until it returns `Some`, and returns that; panics after
/// `limit` naming `what` it waited for. The one way the tests wait for a condition
/// instead of sleeping (`cond.then_some(())` for a plain condition).
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_every(Duration::from_millis(50), limit, what, check).await
}

/// [`eventually`] polling every `step`: a short step where the wait itself is what
/// a test measures.
pub async fn eventually_every<T, F, Fut>(
    step: Duration,
    limit: Duration,
    what: &str,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        tokio::time::sleep(step).await;
    }
}

/// Waits up to `limit` for `child`, a host process the test started, to exit; its
/// status, or `None` while it still runs. The blocking counterpart of [`eventually`],
/// for `Drop` and synchronous tests.
pub fn wait_child(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("cannot poll a child process") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Pids and command lines of live processes whose arguments mention `needle` (a run
/// folder, say: what a test's VMs' QEMUs and relays name), cargo's own excepted.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        panic!("cannot list /proc");
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) && !text.contains("cargo") {
            found.push((pid, text));
        }
    }
    found
}
