//! Test harness: the real `sandbox-mcp` binary as a child process, driven by rmcp's
//! own MCP client over its stdin and stdout; the client records the progress
//! notifications it gets ([`Recorder`]). The server's stderr goes to a log file that
//! is printed when a test fails. [`RawServer`] drives it with JSON lines written by
//! hand instead. Also the microVM prerequisites, checked with what to install or
//! build. Shared by `tests/` and `benches/`.
//!
//! `SANDBOX_MCP_BIN` runs the suites against another build of the server (an
//! installed one, or an older one to compare results with) instead of this crate's.

// Each test crate uses a different part of this harness.
#![allow(dead_code)]
// rmcp deprecates the logging types (SEP-2577); clients of this protocol version
// still receive log messages, and the tests check them.
#![allow(deprecated)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, LoggingMessageNotificationParam,
    ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use sandbox_vmm::launcher::LauncherConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Variables the server reads that must not leak in from the developer's shell.
pub const SERVER_ENV: &[&str] = &[
    "SANDBOX_TEMPLATE",
    "SANDBOX_POOL",
    "SANDBOX_MAX",
    "SANDBOX_AGENT",
    "SANDBOX_TOKEN",
    "SANDBOX_BOOT_TIMEOUT",
    "SANDBOX_MAX_FORK_COUNT",
    "SANDBOX_MCP_PROFILE",
];

/// The test client's handler: records the progress notifications and the log
/// messages (`notifications/message`) it receives.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    messages: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.messages.lock().unwrap().push(params);
    }
}

/// A running `sandbox-mcp` and an initialized MCP client session with it.
pub struct McpServer {
    client: Option<RunningService<RoleClient, Recorder>>,
    recorder: Recorder,
    child: Child,
    log: PathBuf,
}

impl McpServer {
    /// Starts `sandbox-mcp ARGS` with `envs` added and initializes a session.
    pub async fn start(args: &[&str], envs: &[(&str, &str)], log: &Path) -> Self {
        let child = server_command(args, envs, log, Stdio::piped())
            .spawn()
            .expect("cannot start sandbox-mcp");
        Self::connect(child, log).await
    }

    /// Starts `program ARGS` as a client registered with that command would (a bare
    /// name is looked up on the `PATH` of `envs`, else the test's), with `envs`
    /// added, and initializes a session.
    pub async fn start_program(
        program: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Self {
        let child = program_command(
            std::ffi::OsStr::new(program),
            args,
            envs,
            log,
            Stdio::piped(),
        )
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {program}: {error}"));
        Self::connect(child, log).await
    }

    async fn connect(mut child: Child, log: &Path) -> Self {
        let stdout = child.stdout.take().expect("no stdout pipe");
        let stdin = child.stdin.take().expect("no stdin pipe");
        let recorder = Recorder::default();
        let client = match recorder.clone().serve((stdout, stdin)).await {
            Ok(client) => client,
            Err(error) => panic!(
                "MCP initialization failed: {error}\nserver log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        };
        Self {
            client: Some(client),
            recorder,
            child,
            log: log.to_owned(),
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server was already reaped")
    }

    /// The MCP session.
    pub fn session(&self) -> &RunningService<RoleClient, Recorder> {
        self.client.as_ref().expect("disconnected")
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Calls a tool; a protocol error fails the test (ordinary failures must be
    /// `isError` results).
    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("arguments must be a JSON object");
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        match self.session().call_tool(params).await {
            Ok(result) => result,
            Err(error) => panic!(
                "{tool} failed at the protocol level: {error}\nserver log:\n{}",
                self.log()
            ),
        }
    }

    /// Calls a tool and returns the result and the progress notifications that
    /// arrived while it ran. (rmcp's client sends a progress token with every
    /// request, so every call may get them; the calls of a test that uses this must
    /// not overlap.)
    pub async fn call_with_progress(
        &self,
        tool: &str,
        args: Value,
    ) -> (CallToolResult, Vec<ProgressNotificationParam>) {
        let before = self.recorder.progress.lock().unwrap().len();
        let result = self.call(tool, args).await;
        let progress = self.recorder.progress.lock().unwrap()[before..].to_vec();
        (result, progress)
    }

    /// Every progress notification received so far, of all calls.
    pub fn progress_so_far(&self) -> Vec<ProgressNotificationParam> {
        self.recorder.progress.lock().unwrap().clone()
    }

    /// The log messages (`notifications/message`) received so far.
    pub fn log_messages(&self) -> Vec<LoggingMessageNotificationParam> {
        self.recorder.messages.lock().unwrap().clone()
    }

    /// Calls a tool that must succeed; returns its structured content.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        let result = self.call(tool, args.clone()).await;
        assert_ne!(
            result.is_error,
            Some(true),
            "{tool} {args} failed: {}",
            text(&result)
        );
        assert!(!text(&result).is_empty(), "{tool} has no text rendering");
        result
            .structured_content
            .unwrap_or_else(|| panic!("{tool} returned no structured content"))
    }

    /// Calls a tool that must fail as an `isError` result; returns its text.
    pub async fn err(&self, tool: &str, args: Value) -> String {
        let result = self.call(tool, args.clone()).await;
        assert_eq!(
            result.is_error,
            Some(true),
            "{tool} {args} should have failed: {}",
            text(&result)
        );
        text(&result)
    }

    /// Closes the session (stdin EOF) and waits for the server to exit on its own.
    pub async fn disconnect(mut self, within: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        if let Some(client) = self.client.take() {
            let _ = client.cancel().await;
        }
        self.wait_exit(within, started).await
    }

    /// Sends SIGTERM and waits for the server to exit on its own.
    pub async fn terminate(mut self, within: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.wait_exit(within, started).await;
        self.client.take();
        status
    }

    async fn wait_exit(&mut self, within: Duration, started: Instant) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => {
                eprintln!(
                    "server exited ({status}) {:?} after the request",
                    started.elapsed()
                );
                status
            }
            Ok(Err(error)) => panic!("cannot wait for the server: {error}"),
            Err(_) => panic!(
                "the server did not exit within {within:?}; its log:\n{}",
                self.log()
            ),
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- sandbox-mcp log ----\n{}---- end ----", self.log());
        }
        let _ = self.child.start_kill();
    }
}

/// `sandbox-mcp ARGS` with `envs` added, stdin from `stdin`, stdout piped, and its
/// log in `log`.
fn server_command(args: &[&str], envs: &[(&str, &str)], log: &Path, stdin: Stdio) -> Command {
    let binary = std::env::var_os("SANDBOX_MCP_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_sandbox-mcp").into());
    program_command(&binary, args, envs, log, stdin)
}

/// [`server_command`] for `program` (a bare name is looked up on the `PATH` in
/// `envs`, if it sets one).
fn program_command(
    program: &std::ffi::OsStr,
    args: &[&str],
    envs: &[(&str, &str)],
    log: &Path,
    stdin: Stdio,
) -> Command {
    let log_file = std::fs::File::create(log).expect("cannot create the server log");
    let mut command = Command::new(program);
    command
        .args(args)
        .env("RUST_LOG", "info,rmcp=warn")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true);
    for name in SERVER_ENV {
        command.env_remove(name);
    }
    for (name, value) in envs {
        command.env(name, value);
    }
    command
}

/// How long [`RawServer::recv`] waits for a line.
const RAW_REPLY_WITHIN: Duration = Duration::from_secs(60);

/// A running `sandbox-mcp` driven by JSON lines written by hand, for what an SDK
/// client never sends: oversize lines, invalid JSON, malformed messages. Its stdin
/// is a pipe from the test, or from a relay process standing in for a client that
/// can be SIGKILLed.
pub struct RawServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    relay: Option<Child>,
    log: PathBuf,
    /// Ids for the requests [`RawServer::wait_running`] makes.
    next_id: i64,
}

impl RawServer {
    /// Starts `sandbox-mcp ARGS` with `envs` added; nothing is sent yet.
    pub async fn start(args: &[&str], envs: &[(&str, &str)], log: &Path) -> Self {
        let mut child = server_command(args, envs, log, Stdio::piped())
            .spawn()
            .expect("cannot start sandbox-mcp");
        let stdin = child.stdin.take().expect("no stdin pipe");
        Self::new(child, stdin, None, log)
    }

    /// Like [`RawServer::start`], with the server's stdin fed by a `cat` process
    /// (the "client") that the test writes to: killing it closes the server's stdin
    /// the way a client's death does.
    pub async fn start_relayed(args: &[&str], envs: &[(&str, &str)], log: &Path) -> Self {
        let mut relay = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("cannot start cat");
        let stdin = relay.stdin.take().expect("no stdin pipe");
        let relay_out: Stdio = relay
            .stdout
            .take()
            .expect("no stdout pipe")
            .try_into()
            .expect("cannot hand the relay's stdout over");
        // The command (and the test's copy of the pipe) is dropped at once, so the
        // relay holds the only write end of the server's stdin.
        let child = server_command(args, envs, log, relay_out)
            .spawn()
            .expect("cannot start sandbox-mcp");
        Self::new(child, stdin, Some(relay), log)
    }

    fn new(mut child: Child, stdin: ChildStdin, relay: Option<Child>, log: &Path) -> Self {
        let stdout = BufReader::new(child.stdout.take().expect("no stdout pipe"));
        Self {
            child,
            stdin: Some(stdin),
            stdout,
            relay,
            log: log.to_owned(),
            next_id: 1000,
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server was already reaped")
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Writes `line` and a newline.
    pub async fn send(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin was closed");
        stdin
            .write_all(line)
            .await
            .expect("cannot write to the server");
        stdin
            .write_all(b"\n")
            .await
            .expect("cannot write to the server");
        stdin.flush().await.expect("cannot write to the server");
    }

    /// Writes one JSON message as a line.
    pub async fn send_json(&mut self, message: &Value) {
        self.send(message.to_string().as_bytes()).await;
    }

    /// The next line the server writes, as JSON.
    pub async fn recv(&mut self) -> Value {
        let mut line = String::new();
        match tokio::time::timeout(RAW_REPLY_WITHIN, self.stdout.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => serde_json::from_str(&line)
                .unwrap_or_else(|error| panic!("the server wrote non-JSON ({error}): {line}")),
            Ok(Ok(_)) => panic!("the server closed stdout; log:\n{}", self.log()),
            Ok(Err(error)) => panic!("cannot read the server: {error}"),
            Err(_) => panic!(
                "no line from the server within {RAW_REPLY_WITHIN:?}; log:\n{}",
                self.log()
            ),
        }
    }

    /// Sends a request and returns the server's next line, which must answer it.
    pub async fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let reply = self.recv().await;
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    /// The MCP handshake: `initialize` (id 0), then `notifications/initialized`.
    pub async fn initialize(&mut self) {
        let reply = self
            .request(
                0,
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw-test", "version": "0"}}),
            )
            .await;
        assert!(reply["result"]["serverInfo"].is_object(), "{reply}");
        self.send_json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// Polls the `ps` tool until `command` runs in `sandbox_id`: an exec sent without
    /// waiting for its reply is then in flight. Nothing else may be answered meanwhile.
    pub async fn wait_running(&mut self, sandbox_id: &Value, command: &str, within: Duration) {
        let deadline = Instant::now() + within;
        let ps = json!({"name": "ps", "arguments": {"sandbox_id": sandbox_id}});
        loop {
            self.next_id += 1;
            let reply = self.request(self.next_id, "tools/call", ps.clone()).await;
            let rows = &reply["result"]["structuredContent"]["processes"];
            let running = rows.as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|row| row["command"] == command && row["state"] == "running")
            });
            if running {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{command} did not start: {reply}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Closes the server's stdin, as a client that exits does.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// SIGKILLs the relay standing in for the client (see [`RawServer::start_relayed`]).
    pub fn kill_client(&mut self) {
        let relay = self.relay.as_mut().expect("not started relayed");
        relay.start_kill().expect("cannot kill the relay");
    }

    /// Waits for the server to exit on its own within `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => panic!("cannot wait for the server: {error}"),
            Err(_) => panic!(
                "the server did not exit within {within:?}; its log:\n{}",
                self.log()
            ),
        }
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- sandbox-mcp log ----\n{}---- end ----", self.log());
        }
        let _ = self.child.start_kill();
    }
}

/// The text content of a result.
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `len` bytes that are the same on every run and compress badly (xorshift), for
/// transfers checked by checksum.
#[allow(dead_code)] // Each test crate uses a different part.
pub fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The bytes a result costs on the wire, and its text and structured parts.
#[allow(dead_code)] // Each test crate uses a different part.
pub fn sizes(result: &CallToolResult) -> (usize, usize, usize) {
    let wire = serde_json::to_string(result).unwrap().len();
    let text = text(result).len();
    let structured = result
        .structured_content
        .as_ref()
        .map_or(0, |json| json.to_string().len());
    (wire, text, structured)
}

/// Asserts that a long exec of `echo step N` lines reported progress as it went: at
/// least two notifications, carrying the output's last line, only ever growing.
#[allow(dead_code)] // Each test crate uses a different part.
pub fn assert_exec_progress(progress: &[rmcp::model::ProgressNotificationParam]) {
    assert!(progress.len() >= 2, "{progress:?}");
    let messages: Vec<&str> = progress
        .iter()
        .filter_map(|p| p.message.as_deref())
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("stdout: step")),
        "the progress carries the output's last line: {messages:?}"
    );
    assert!(
        progress.windows(2).all(|w| w[0].progress < w[1].progress),
        "progress only grows: {progress:?}"
    );
}

/// The tests' condition waits, shared with the end-to-end tests (each test crate
/// uses a different part).
#[allow(unused_imports)]
pub use sandbox_tests::{eventually, eventually_every};

/// The launcher configuration from the environment, once the shared microVM gate
/// (`sandbox_tests::vm`) finds nothing missing; panics naming what is missing and
/// how to get it. For benchmarks, which `SANDBOX_SKIP_VM_TESTS` does not skip.
pub fn require_microvms() -> LauncherConfig {
    if let Some(what) = sandbox_tests::vm::missing() {
        panic!("{what} (benchmarks cannot be skipped)");
    }
    LauncherConfig::from_env().expect("cannot find the sandbox home")
}

/// A test's folders: run folders and checkpoints, private to it.
pub struct Folders {
    /// `SANDBOX_RUN_DIR`: the servers' VMs' run folders.
    pub run: PathBuf,
    /// `SANDBOX_CHECKPOINT_DIR`: the checkpoints they take.
    pub checkpoints: PathBuf,
    /// The servers' log.
    pub log: PathBuf,
}

impl Folders {
    /// The folders of test `tag` of test target `suite`; `None` when the microVM
    /// tests are skipped.
    pub fn new(suite: &str, tag: &str) -> Option<Self> {
        if !sandbox_tests::vm::require(&format!("mcp::{suite}::{tag}")) {
            return None;
        }
        let run = run_dir(tag);
        let checkpoints = run_dir(&format!("{tag}-ckpt"));
        let log = PathBuf::from(format!("{}.log", run.display()));
        Some(Self {
            run,
            checkpoints,
            log,
        })
    }

    /// Starts `sandbox-mcp ARGS` on these folders.
    pub async fn server(&self, args: &[&str]) -> McpServer {
        let run = self.run.display().to_string();
        let checkpoints = self.checkpoints.display().to_string();
        McpServer::start(
            args,
            &[
                ("SANDBOX_RUN_DIR", &run),
                ("SANDBOX_CHECKPOINT_DIR", &checkpoints),
            ],
            &self.log,
        )
        .await
    }

    /// The checkpoints left in the test's folder.
    pub fn checkpoints_left(&self) -> Vec<String> {
        std::fs::read_dir(&self.checkpoints)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Folders {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.run);
            let _ = std::fs::remove_dir_all(&self.checkpoints);
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// A fresh, short private run folder for a server's VMs (their sockets must fit in
/// 108 bytes).
pub fn run_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/sbx-mcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create the run folder");
    dir
}

pub use sandbox_tests::processes_mentioning;

/// After a server exited: no process mentions `run` (its VMs' QEMUs and relays), and
/// the folder holds no run folder.
pub fn assert_nothing_left(run: &Path) {
    let left = processes_mentioning(&run.display().to_string());
    assert!(left.is_empty(), "processes outlived the server: {left:?}");
    let folders: Vec<_> = std::fs::read_dir(run)
        .expect("cannot list the run folder")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        folders.is_empty(),
        "run folders outlived the server: {folders:?}"
    );
}
