//! Test harness: the real `sandbox-mcp` binary as a child process, driven by rmcp's
//! own MCP client over its stdin and stdout. The server's stderr goes to a log file
//! that is printed when a test fails. Also the microVM prerequisites, checked with
//! what to install or build. Shared by `tests/` and `benches/`.

// Each test crate uses a different part of this harness.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use sandbox_vmm::launcher::LauncherConfig;
use serde_json::Value;
use tokio::process::{Child, Command};

/// Variables the server reads that must not leak in from the developer's shell.
const SERVER_ENV: &[&str] = &[
    "SANDBOX_TEMPLATE",
    "SANDBOX_POOL",
    "SANDBOX_MAX",
    "SANDBOX_AGENT",
    "SANDBOX_TOKEN",
    "SANDBOX_BOOT_TIMEOUT",
];

/// A running `sandbox-mcp` and an initialized MCP client session with it.
pub struct McpServer {
    client: Option<RunningService<RoleClient, ()>>,
    child: Child,
    log: PathBuf,
}

impl McpServer {
    /// Starts `sandbox-mcp ARGS` with `envs` added and initializes a session.
    pub async fn start(args: &[&str], envs: &[(&str, &str)], log: &Path) -> Self {
        let log_file = std::fs::File::create(log).expect("cannot create the server log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-mcp"));
        command
            .args(args)
            .env("RUST_LOG", "info,rmcp=warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file);
        for name in SERVER_ENV {
            command.env_remove(name);
        }
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("cannot start sandbox-mcp");
        let stdout = child.stdout.take().expect("no stdout pipe");
        let stdin = child.stdin.take().expect("no stdin pipe");
        let client = match ().serve((stdout, stdin)).await {
            Ok(client) => client,
            Err(error) => panic!(
                "MCP initialization failed: {error}\nserver log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        };
        Self {
            client: Some(client),
            child,
            log: log.to_owned(),
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server was already reaped")
    }

    /// The MCP session.
    pub fn session(&self) -> &RunningService<RoleClient, ()> {
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

/// The text content of a result.
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The tests' one condition wait, shared with the end-to-end tests.
pub use sandbox_tests::eventually;

/// The launcher configuration from the environment, once the shared microVM gate
/// (`sandbox_tests::vm`) finds nothing missing; panics naming what is missing and
/// how to get it. For benchmarks, which `SANDBOX_SKIP_VM_TESTS` does not skip.
pub fn require_microvms() -> LauncherConfig {
    if let Some(what) = sandbox_tests::vm::missing() {
        panic!("{what} (benchmarks cannot be skipped)");
    }
    LauncherConfig::from_env().expect("cannot find the sandbox home")
}

/// A fresh, short private run folder for a server's VMs (their sockets must fit in
/// 108 bytes).
pub fn run_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/sbx-mcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create the run folder");
    dir
}
