//! The MCP server: one method per tool, each turning its parameters into client
//! calls and the answers into [`crate::render`] results. `call_tool` wraps every call
//! in the per-call cap and the client's cancellation.
//!
//! Tools, as the README's table lists them: `create_sandbox`, `exec`, `eval_code`,
//! `spawn`, `ps`, `logs`, `kill`, `wait_for_text`, `write_file`, `read_file`, `list_dir`,
//! `release`, `node_info`; the snapshot tools are a second router, in
//! [`crate::snapshot::tools`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{schema_for_output, ToolCallContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer, ServerHandler};
use sandbox_protocol::limits::{EXEC_DEADLINE_GRACE_SECS, EXEC_DEADLINE_SECS};
use sandbox_protocol::wait::{WAIT_DEFAULT_TIMEOUT_MS, WAIT_MAX_TIMEOUT_MS};
use sandbox_protocol::{
    Command, EvalReply, EvalRequest, ExecRequest, FileKind, Language, Pid, ProcessKind,
    ProcessSpec, ProcessState, Stream, WaitTarget,
};
use tokio::time::Instant;

use crate::error::{Op, ToolError};
use crate::exec::{self, End};
use crate::node::Node;
use crate::params::{
    parse_mode, CreateSandboxParams, EvalCodeParams, ExecParams, KillParams, LogsParams,
    PathParams, SandboxParams, SpawnParams, WaitForTextParams, WriteFileParams,
};
use crate::render::{
    failure_with, rfc3339_ms, success, CreateSandboxResult, DirEntryRow, EvalCodeResult,
    ExceptionInfo, ExecResult, KillResult, ListDirResult, LogsResult, NodeInfoResult, ProcessRow,
    PsResult, ReadFileResult, ReleaseResult, SpawnResult, WaitForTextResult, WriteFileResult,
};
use crate::sandbox::Sandbox;
use crate::util::millis;

/// The cap on one tool call: five minutes, plus the grace an exec that hits it gets
/// to return what it collected.
pub const TOOL_CALL_CAP_SECS: u64 = EXEC_DEADLINE_SECS + EXEC_DEADLINE_GRACE_SECS + 2;

/// SIGTERM, the default signal of `kill`.
const DEFAULT_SIGNAL: i32 = 15;

/// Highest signal number Linux has.
const MAX_SIGNAL: i32 = sandbox_protocol::MAX_SIGNAL;

/// What this tool's `signal: 0` stands for.
const SIGKILL: i32 = 9;

/// What the server tells the model at initialization.
const INSTRUCTIONS: &str = "Sandboxes are disposable Linux microVMs for running untrusted \
code. Call create_sandbox, pass its sandbox_id to exec (shell commands), eval_code (Python or \
sh in a session whose state persists between calls, like a notebook), spawn/logs/kill \
(background processes), wait_for_text (until a server's output or a file shows a line), \
write_file/read_file/list_dir (files), and release it when done. \
Each sandbox is destroyed at its deadline (default one hour, never renewed) and when this \
session ends; sandboxes have no network access. fork clones a sandbox into children; \
checkpoint saves its state for branch_checkpoint (checkpoints outlive the session); \
hibernate frees an idle sandbox's memory (the next call wakes it); promote makes a \
template of it.";

/// The MCP server.
#[derive(Debug, Clone)]
pub struct SandboxServer {
    pub(crate) node: Arc<Node>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl SandboxServer {
    /// A server over `node`. The snapshot tools are offered only when it launches
    /// microVMs: an attached agent cannot be snapshotted.
    pub fn new(node: Arc<Node>) -> Self {
        let tool_router = match node.snapshots() {
            Some(_) => Self::tool_router() + Self::snapshot_router(),
            None => Self::tool_router(),
        };
        Self { node, tool_router }
    }

    #[tool(
        description = "Claim a fresh Linux microVM sandbox and return its sandbox_id and \
        deadline. Optional: template (default: the server's; see node_info), size (small \
        default, medium, large, xlarge, 2xlarge), net (\"none\" default; \"egress\" is not \
        available yet), ttl_seconds (0 or omitted = one hour, max 86400). Default template \
        and size come from a warm pool in milliseconds; others boot in seconds. Nothing \
        renews the deadline: at it the VM and its files are destroyed. Release it when done.",
        output_schema = schema_for_output::<CreateSandboxResult>()
    )]
    async fn create_sandbox(
        &self,
        Parameters(params): Parameters<CreateSandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.node.create(params).await?))
    }

    #[tool(
        description = "Run a shell command (/bin/sh -c) in a sandbox to completion and return \
        stdout, stderr, exit_code and truncated. Optional: cwd, env, stdin, timeout_seconds \
        (default and max 300). Each stream keeps its first 1 MiB (truncated is set past \
        that). A non-zero exit_code is a normal result. A run cut off by its timeout or a \
        lost connection is an error result that still carries the output collected so far. \
        Background children (cmd &) are killed at the timeout too; a command the OOM killer \
        ended has oom_killed set. For servers or jobs longer than 5 minutes use spawn.",
        output_schema = schema_for_output::<ExecResult>()
    )]
    async fn exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let timeout_secs = timeout_secs(params.timeout_seconds)?;
        let client = client(&sandbox, Op::Command).await?;
        let request = ExecRequest {
            spec: process_spec(params.command, params.cwd, params.env),
            stdin: params.stdin.unwrap_or_default().into_bytes(),
            timeout_ms: None,
            stream: true,
        };
        let timeout = Duration::from_secs(timeout_secs);
        let collected = exec::run(&client, request, timeout).await;
        if let End::Failed(error) = &collected.end {
            if !collected.started {
                return Err(ToolError::agent(Op::Command, sandbox.id.as_str(), error));
            }
        }
        let result = collected.to_result(timeout);
        Ok(match &result.error {
            Some(message) => failure_with(&result, message),
            None => success(&result),
        })
    }

    #[tool(
        description = "Evaluate code in a named interpreter session of a sandbox, like a \
        notebook cell: variables, imports, functions and the working directory persist from \
        one call to the next. language: \"python\" (default; the sandbox needs python3) or \
        \"sh\"; session: its name (default \"default\"). Returns stdout and stderr \
        (subprocesses included, first 1 MiB each), value (the repr of a last Python \
        expression), status ($? for sh) and the session's pid. Optional timeout_seconds \
        (default and max 300) interrupts the code: Python raises KeyboardInterrupt and the \
        session keeps its state. An exception, a timeout or a session that died (exit(), a \
        crash, a kill) is an error result that still carries the output; a dead session \
        answers not found until you pass restart: true. Code reading stdin gets end of file.",
        output_schema = schema_for_output::<EvalCodeResult>()
    )]
    async fn eval_code(
        &self,
        Parameters(params): Parameters<EvalCodeParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let Some(language) = Language::parse(&params.language) else {
            return Err(ToolError::new(format!(
                "language {:?} is not one eval_code runs: use \"python\" or \"sh\".",
                params.language
            )));
        };
        if !sandbox_protocol::is_valid_session_name(&params.session) {
            return Err(ToolError::new(format!(
                "session {:?} is not a session name: use 1 to {} letters, digits, '-', '_' or \
                 '.', or omit it for \"default\".",
                params.session,
                sandbox_protocol::eval::MAX_SESSION_NAME_BYTES
            )));
        }
        let timeout_secs = timeout_secs(params.timeout_seconds)?;
        let client = client(&sandbox, Op::Session).await?;
        let request = EvalRequest {
            session: params.session,
            language,
            code: params.code,
            timeout_ms: Some(timeout_secs * 1000),
            restart: params.restart,
        };
        let reply = client
            .eval(request)
            .await
            .map_err(|error| ToolError::agent(Op::Session, sandbox.id.as_str(), &error))?;
        let result = eval_result(reply, timeout_secs);
        Ok(match &result.error {
            Some(message) => failure_with(&result, message),
            None => success(&result),
        })
    }

    #[tool(
        description = "Start a shell command (/bin/sh -c) detached in a sandbox and return its \
        pid at once. Its stdout and stderr go to a 256 KiB ring that logs replays; use it for \
        servers and long jobs. Optional: cwd, env. The process runs until it exits, is \
        killed, or the sandbox is destroyed.",
        output_schema = schema_for_output::<SpawnResult>()
    )]
    async fn spawn(
        &self,
        Parameters(params): Parameters<SpawnParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let client = client(&sandbox, Op::Command).await?;
        let spec = process_spec(params.command, params.cwd, params.env);
        let pid = client
            .spawn(spec)
            .await
            .map_err(|error| ToolError::agent(Op::Command, sandbox.id.as_str(), &error))?;
        Ok(success(&SpawnResult { pid: pid.0 }))
    }

    #[tool(
        description = "List the processes a sandbox tracks (from exec, spawn and terminals) \
        with pid, state (running or exited), exit code and start time. Exited processes are \
        forgotten 5 minutes after they exit.",
        output_schema = schema_for_output::<PsResult>(),
        annotations(read_only_hint = true)
    )]
    async fn ps(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let client = client(&sandbox, Op::Other).await?;
        let list = client
            .ps()
            .await
            .map_err(|error| ToolError::agent(Op::Other, sandbox.id.as_str(), &error))?;
        let processes = list
            .into_iter()
            .map(|info| {
                let (state, exit) = match info.state {
                    ProcessState::Running => ("running", None),
                    ProcessState::Exited(status) => ("exited", Some(status)),
                };
                ProcessRow {
                    pid: info.pid.0,
                    kind: info.kind.as_str().to_owned(),
                    command: match info.kind {
                        ProcessKind::Session => session_line(&info.argv),
                        _ => command_line(&info.argv),
                    },
                    state: state.to_owned(),
                    exit_code: exit.map(|status| status.shell_code()),
                    signal: exit.and_then(|status| status.signal),
                    started_at: rfc3339_ms(info.started_at_ms),
                    ended_at: info.ended_at_ms.map(rfc3339_ms),
                }
            })
            .collect();
        Ok(success(&PsResult { processes }))
    }

    #[tool(
        description = "Return a tracked process's output: the newest 256 KiB of its stdout and \
        stderr, whether it still runs, and its exit code once ended. Pass the returned \
        next_cursor as cursor on the next call to get only new output (poll a spawned job).",
        output_schema = schema_for_output::<LogsResult>(),
        annotations(read_only_hint = true)
    )]
    async fn logs(
        &self,
        Parameters(params): Parameters<LogsParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let client = client(&sandbox, Op::Process).await?;
        let reply = client
            .logs(Pid(params.pid), params.cursor)
            .await
            .map_err(|error| ToolError::agent(Op::Process, sandbox.id.as_str(), &error))?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        for chunk in reply.batch.chunks {
            match chunk.stream {
                Stream::Stdout | Stream::Pty => stdout.extend_from_slice(&chunk.data),
                Stream::Stderr => stderr.extend_from_slice(&chunk.data),
            }
        }
        Ok(success(&LogsResult {
            pid: params.pid,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            running: reply.exit.is_none(),
            exit_code: reply.exit.map(|status| status.shell_code()),
            signal: reply.exit.and_then(|status| status.signal),
            dropped_bytes: reply.batch.dropped,
            next_cursor: reply.batch.end,
        }))
    }

    #[tool(
        description = "Send a signal to a tracked process and everything it started (its \
        cgroup: background and setsid'd children too, also after the process itself \
        exited). signal: 15 (SIGTERM, default), 2 (SIGINT), 9 or 0 (SIGKILL). Killing what \
        already exited is a successful no-op.",
        output_schema = schema_for_output::<KillResult>(),
        annotations(destructive_hint = true)
    )]
    async fn kill(
        &self,
        Parameters(params): Parameters<KillParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let signal = params.signal.unwrap_or(DEFAULT_SIGNAL);
        if !(0..=MAX_SIGNAL).contains(&signal) {
            return Err(ToolError::new(format!(
                "signal must be between 0 and {MAX_SIGNAL}; got {signal}. Use 15 (SIGTERM) or 0 \
                 (SIGKILL)."
            )));
        }
        // This tool promises "0 means SIGKILL"; the wire carries the explicit signal.
        let sent = if signal == 0 { SIGKILL } else { signal };
        let client = client(&sandbox, Op::Process).await?;
        client
            .kill(Pid(params.pid), sent)
            .await
            .map_err(|error| ToolError::agent(Op::Process, sandbox.id.as_str(), &error))?;
        Ok(success(&KillResult {
            pid: params.pid,
            signal: sent,
        }))
    }

    #[tool(
        description = "Wait until a file in a sandbox, or a tracked process's output, contains \
        a text, and return where: offset, stream (stdout or stderr, for a process), the line \
        holding it and waited_ms. Give exactly one of path (absolute; the file and even its \
        directory may not exist yet; appends, a rename over it and rewrites are seen) or pid \
        (from spawn: wait for \"listening on\" in a server's output instead of polling logs; \
        all output still in its 256 KiB ring counts). text is exact, not a pattern. Optional \
        timeout_seconds (default 30, max 300; 0 only looks once). An error result when the \
        time runs out or the process exits without printing the text.",
        output_schema = schema_for_output::<WaitForTextResult>(),
        annotations(read_only_hint = true)
    )]
    async fn wait_for_text(
        &self,
        Parameters(params): Parameters<WaitForTextParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        let target = match (&params.path, params.pid) {
            (Some(path), None) => {
                absolute(path)?;
                WaitTarget::File(path.clone().into_bytes())
            }
            (None, Some(pid)) => WaitTarget::Output(Pid(pid)),
            _ => {
                return Err(ToolError::new(
                    "Give exactly one of path (a file to wait on) and pid (a process whose \
                     output to wait on).",
                ))
            }
        };
        let max_secs = WAIT_MAX_TIMEOUT_MS / 1000;
        let timeout_ms = match params.timeout_seconds {
            None => WAIT_DEFAULT_TIMEOUT_MS,
            Some(secs) if secs > max_secs => {
                return Err(ToolError::new(format!(
                    "timeout_seconds may be at most {max_secs}; got {secs}. Wait again after a \
                     timeout to keep waiting."
                )))
            }
            Some(secs) => secs * 1000,
        };
        let client = client(&sandbox, Op::Wait).await?;
        let found = client
            .wait_for_text(target, params.text, Some(Duration::from_millis(timeout_ms)))
            .await
            .map_err(|error| ToolError::agent(Op::Wait, sandbox.id.as_str(), &error))?;
        Ok(success(&WaitForTextResult {
            path: params.path,
            pid: params.pid,
            offset: found.offset,
            stream: found.stream.map(|stream| stream_name(stream).to_owned()),
            line: found.line,
            waited_ms: found.waited_ms,
        }))
    }

    #[tool(
        description = "Write a whole text file in a sandbox, replacing it atomically. path \
        must be absolute and its parent directory must exist (mkdir -p with exec first). \
        Optional mode in octal, like \"755\".",
        output_schema = schema_for_output::<WriteFileResult>()
    )]
    async fn write_file(
        &self,
        Parameters(params): Parameters<WriteFileParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        absolute(&params.path)?;
        let mode = match params.mode.as_deref() {
            None => None,
            Some(text) => Some(parse_mode(text).ok_or_else(|| {
                ToolError::new(format!(
                    "mode {text:?} is not octal permission bits; pass something like \"644\" \
                     or \"755\", or omit it."
                ))
            })?),
        };
        let client = client(&sandbox, Op::File).await?;
        let bytes = params.content.len() as u64;
        client
            .write_file(&params.path, params.content.into_bytes(), mode)
            .await
            .map_err(|error| ToolError::agent(Op::File, sandbox.id.as_str(), &error))?;
        Ok(success(&WriteFileResult {
            path: params.path,
            bytes,
        }))
    }

    #[tool(
        description = "Read a whole regular file (at most 1 MiB) from a sandbox as text; \
        invalid UTF-8 is replaced with U+FFFD. A larger file, a directory, a device and a \
        missing path are errors: use exec (head, tail, grep) for parts of big files and \
        list_dir for directories.",
        output_schema = schema_for_output::<ReadFileResult>(),
        annotations(read_only_hint = true)
    )]
    async fn read_file(
        &self,
        Parameters(params): Parameters<PathParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        absolute(&params.path)?;
        let client = client(&sandbox, Op::File).await?;
        let data = client
            .read_file(&params.path)
            .await
            .map_err(|error| ToolError::agent(Op::File, sandbox.id.as_str(), &error))?;
        let content = String::from_utf8_lossy(&data);
        let lossy = matches!(content, std::borrow::Cow::Owned(_));
        Ok(success(&ReadFileResult {
            content: content.into_owned(),
            path: params.path,
            bytes: data.len() as u64,
            lossy,
        }))
    }

    #[tool(
        description = "List one level of a directory in a sandbox: name, kind (file, dir, \
        symlink, other) and size of each entry, sorted by name.",
        output_schema = schema_for_output::<ListDirResult>(),
        annotations(read_only_hint = true)
    )]
    async fn list_dir(
        &self,
        Parameters(params): Parameters<PathParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.node.sandbox(&params.sandbox_id)?;
        absolute(&params.path)?;
        let client = client(&sandbox, Op::File).await?;
        let entries = client
            .list_dir(&params.path)
            .await
            .map_err(|error| ToolError::agent(Op::File, sandbox.id.as_str(), &error))?;
        let entries = entries
            .into_iter()
            .map(|entry| DirEntryRow {
                name: String::from_utf8_lossy(&entry.name).into_owned(),
                kind: kind_name(entry.kind).to_owned(),
                size: entry.size,
            })
            .collect();
        Ok(success(&ListDirResult {
            path: params.path,
            entries,
        }))
    }

    #[tool(
        description = "Destroy a sandbox and everything in it, now. Its sandbox_id becomes \
        unknown: releasing it again is an error. (In attach mode the agent is only forgotten, \
        not stopped.)",
        output_schema = schema_for_output::<ReleaseResult>(),
        annotations(destructive_hint = true)
    )]
    async fn release(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.node.release(&params.sandbox_id).await?))
    }

    #[tool(
        description = "Describe this sandbox host: mode, the warm pool (ready and booting VMs), \
        templates that create_sandbox accepts, this session's live claims with their \
        deadlines, and capacity (how many more sandboxes can be claimed).",
        output_schema = schema_for_output::<NodeInfoResult>(),
        annotations(read_only_hint = true)
    )]
    async fn node_info(&self) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.node.info()))
    }
}

impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let cancelled = context.ct.clone();
        let started = Instant::now();
        let call = self
            .tool_router
            .call(ToolCallContext::new(self, request, context));
        let cap = Duration::from_secs(TOOL_CALL_CAP_SECS);
        let response = tokio::select! {
            response = tokio::time::timeout(cap, call) => match response {
                Ok(response) => response,
                Err(_) => Ok(ToolError::new(format!(
                    "{name} did not finish within the 5-minute cap on a tool call and was \
                     abandoned. Split the work into shorter calls, or use spawn and logs."
                ))
                .into_result()
                .into()),
            },
            () = cancelled.cancelled() => {
                tracing::info!(tool = %name, "call cancelled by the client");
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        };
        let is_error = match &response {
            Ok(CallToolResponse::Complete(result)) => result.is_error.unwrap_or(false),
            Ok(_) => false,
            Err(_) => true,
        };
        tracing::info!(tool = %name, ms = millis(started.elapsed()), is_error, "tool call");
        response
    }
}

/// A tool's `timeout_seconds`: 0 or none is the maximum, more is refused.
fn timeout_secs(asked: Option<u64>) -> Result<u64, ToolError> {
    match asked {
        None | Some(0) => Ok(EXEC_DEADLINE_SECS),
        Some(secs) if secs > EXEC_DEADLINE_SECS => Err(ToolError::new(format!(
            "timeout_seconds may be at most {EXEC_DEADLINE_SECS}; got {secs}. For longer \
             jobs, start the command with spawn and poll its output with logs."
        ))),
        Some(secs) => Ok(secs),
    }
}

/// The `eval_code` result, with `error` set when the code raised, timed out or
/// the session died.
fn eval_result(reply: EvalReply, timeout_secs: u64) -> EvalCodeResult {
    let name = reply.session.name.clone();
    let error = match (&reply.died, reply.timed_out, &reply.exception) {
        (Some(_), true, _) => Some(format!(
            "Interrupted after {timeout_secs} s and it did not come back, so session {name:?} \
             was killed: its state is gone. Call again with restart: true for a fresh session."
        )),
        (Some(status), false, _) => Some(format!(
            "Session {name:?} died during the evaluation (exit code {}): its state is gone. \
             Call again with restart: true for a fresh session.",
            status.shell_code()
        )),
        (None, true, _) => Some(format!(
            "Interrupted after {timeout_secs} s; session {name:?} keeps its state. Pass a \
             larger timeout_seconds (at most 300), or run long jobs with spawn and poll them \
             with logs."
        )),
        (None, false, Some(raised)) => Some(format!(
            "The code raised {}: {}",
            raised.type_name, raised.message
        )),
        (None, false, None) => None,
    };
    EvalCodeResult {
        session: name,
        language: reply.session.language.as_str().to_owned(),
        pid: reply.session.pid.0,
        started: reply.session.started,
        evaluations: reply.session.evaluations,
        stdout: String::from_utf8_lossy(&reply.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
        truncated: reply.stdout_truncated || reply.stderr_truncated,
        value: reply.value,
        value_truncated: reply.value_truncated,
        exception: reply.exception.map(|raised| ExceptionInfo {
            type_name: raised.type_name,
            message: raised.message,
            traceback: raised.traceback,
        }),
        status: reply.status,
        timed_out: reply.timed_out,
        died: reply.died.is_some(),
        exit_code: reply.died.map(|status| status.shell_code()),
        signal: reply.died.and_then(|status| status.signal),
        duration_ms: reply.duration_ms,
        error,
    }
}

/// The sandbox's agent connection, or an error saying how to recover.
async fn client(sandbox: &Sandbox, op: Op) -> Result<sandbox_vmm::Client, ToolError> {
    sandbox
        .client()
        .await
        .map_err(|error| ToolError::unreachable(op, sandbox.id.as_str(), &error))
}

fn process_spec(
    command: String,
    cwd: Option<String>,
    env: Option<BTreeMap<String, String>>,
) -> ProcessSpec {
    let mut spec = ProcessSpec::new(Command::Shell(command));
    spec.cwd = cwd.filter(|cwd| !cwd.is_empty());
    spec.env = env.unwrap_or_default().into_iter().collect();
    spec
}

fn absolute(path: &str) -> Result<(), ToolError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(ToolError::new(format!(
            "path {path:?} is relative; pass an absolute path such as /root/{path}"
        )))
    }
}

/// A process's command as one line: the shell line for `sh -c LINE`, else the argv.
fn command_line(argv: &[String]) -> String {
    match argv {
        [sh, flag, line] if sh.ends_with("sh") && flag == "-c" => line.clone(),
        _ => argv.join(" "),
    }
}

/// A stream as the results name it.
fn stream_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
        Stream::Pty => "pty",
    }
}

/// An `eval_code` session's interpreter as `ps` shows it: its name and program, not
/// the bootstrap that loads its driver (the session's name is its last argument).
fn session_line(argv: &[String]) -> String {
    match (argv.first(), argv.last()) {
        (Some(program), Some(name)) if argv.len() > 1 => {
            format!("eval_code session {name} ({program})")
        }
        _ => command_line(argv),
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    kind.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_commands_show_their_line() {
        let argv = ["/bin/sh", "-c", "sleep 1"].map(String::from);
        assert_eq!(command_line(&argv), "sleep 1");
        let argv = ["python3", "-m", "http.server"].map(String::from);
        assert_eq!(command_line(&argv), "python3 -m http.server");
    }

    #[test]
    fn sessions_show_their_name_not_their_bootstrap() {
        let argv = ["python3", "-u", "-c", "import sys;exec(...)", "work"].map(String::from);
        assert_eq!(session_line(&argv), "eval_code session work (python3)");
    }

    #[test]
    fn the_tool_table_is_exactly_the_documented_one() {
        let names: Vec<String> = SandboxServer::tool_router()
            .list_all()
            .into_iter()
            .map(|tool| tool.name.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "create_sandbox",
                "eval_code",
                "exec",
                "kill",
                "list_dir",
                "logs",
                "node_info",
                "ps",
                "read_file",
                "release",
                "spawn",
                "wait_for_text",
                "write_file"
            ]
        );
        for tool in SandboxServer::tool_router().list_all() {
            assert!(
                tool.output_schema.is_some(),
                "{} has no output schema",
                tool.name
            );
            assert!(
                tool.description.as_ref().is_some_and(|d| d.len() > 80),
                "{} needs a description a model can act on",
                tool.name
            );
        }
    }
}
