//! The MCP server: one method per tool, each checking its parameters and handing
//! the work to the module that does it ([`crate::exec`], [`crate::files`],
//! [`crate::processes`], the node), then turning the answer into a
//! [`crate::render`] result. `call_tool` wraps every call in the per-call cap, the
//! client's cancellation and progress reporting ([`crate::progress`]).
//!
//! Tools, as the README's table lists them: `create_sandbox`, `exec`, `eval_code`,
//! `spawn`, `ps`, `logs`, `kill`, `wait_for_text`, `write_file`, `read_file`, `list_dir`,
//! `release`, `node_info`; the snapshot tools are a second router, in
//! [`crate::snapshot::tools`], the fleet tools a third, in [`crate::fleet::tools`], and
//! the host file tools a fourth, in [`crate::host::tools`], offered only with
//! `--host-dir`.
//! Under `--profile sandstorm` the server offers only [`crate::sandstorm`]'s router.
//! Every tool's schemas are made standard JSON Schema ([`crate::schema`]) once the
//! routers are combined.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::common::Extension;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{schema_for_output, ToolCallContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
// rmcp deprecates logging (SEP-2577); this protocol version's clients use it.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{tool, tool_router, ErrorData, RoleServer, ServerHandler};
use sandbox_protocol::limits::{EXEC_DEADLINE_GRACE_SECS, EXEC_DEADLINE_SECS};
use sandbox_protocol::wait::{WAIT_DEFAULT_TIMEOUT_MS, WAIT_MAX_TIMEOUT_MS};
use sandbox_protocol::{Command, ExecRequest, FileKind, ProcessSpec, WaitTarget};
use tokio::time::Instant;

use crate::backend::Backend;
use crate::config::Profile;
use crate::error::{Op, ToolError};
use crate::exec::{self, End, Shape, EXEC_DEFAULT_MAX_BYTES, EXEC_MAX_BYTES, EXEC_STDIN_MAX_BYTES};
use crate::host::HostDirs;
use crate::logging::ClientLog;
use crate::output::{size, stream_name};
use crate::params::{
    command_of, max_bytes, timeout_secs, CreateSandboxParams, EvalCodeParams, ExecParams,
    KillParams, LogsParams, PathParams, PsParams, ReadFileParams, SandboxParams, SpawnParams,
    WaitForTextParams, WriteFileParams,
};
use crate::progress::Progress;
use crate::render::{
    failure_with, success, CreateSandboxResult, DirEntryRow, EvalCodeResult, ExecResult,
    KillResult, ListDirResult, LogsResult, NodeInfoResult, PsResult, ReadFileResult, ReleaseResult,
    SpawnResult, WaitForTextResult, WriteFileResult,
};
use crate::upload::Uploads;
use crate::{eval, files, processes, schema};
use sandbox_engine::util::millis;

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
code. Call create_sandbox (create_sandboxes for several), pass its sandbox_id to exec (a shell \
command, or an argv list), eval_code (Python or \
sh in a session whose state persists between calls, like a notebook), spawn/logs/kill \
(background processes), wait_for_text (until a server's output or a file shows a line), \
write_file/read_file/list_dir (files, any size, text or base64), and release it when done. \
Results are cut to a model's size (max_bytes raises it); exec keeps the end of a failed \
command's output, where the error is. \
Each sandbox is destroyed at its deadline (default one hour, never renewed) and when this \
session ends; sandboxes have no network access unless created with net \"egress\" \
(then only to the server's allowlist, through an HTTP proxy; egress_log lists attempts). fork clones a sandbox into children; \
checkpoint saves its state for branch_checkpoint (checkpoints outlive the session); \
hibernate frees an idle sandbox's memory (the next call wakes it); promote makes a \
template of it. list_sandboxes, get_sandbox, ping_sandbox and list_templates describe what \
there is.";

/// The MCP server.
#[derive(Debug, Clone)]
pub struct SandboxServer {
    pub(crate) backend: Backend,
    tool_router: ToolRouter<Self>,
    instructions: &'static str,
    uploads: Arc<Uploads>,
    pub(crate) host: Arc<HostDirs>,
    log: ClientLog,
}

#[tool_router]
impl SandboxServer {
    /// A server over `backend` offering `profile`'s tools.
    pub fn new(backend: Backend, profile: Profile, host: Arc<HostDirs>) -> Self {
        let (tool_router, instructions) = Self::router(profile, backend.snapshots(), &host);
        Self {
            backend,
            tool_router,
            instructions,
            uploads: Arc::new(Uploads::default()),
            host,
            log: ClientLog::default(),
        }
    }

    /// The server, with its log events going to the client through `log` (see
    /// [`crate::logging`]).
    pub fn with_client_log(mut self, log: ClientLog) -> Self {
        self.log = log;
        self
    }

    /// Every tool `profile` offers, with standard schemas, and what the server tells
    /// the model at initialization. In the default profile the snapshot tools, and
    /// the fleet tools that claim or list templates, come only with `snapshots` (a
    /// server that launches microVMs): an attached agent cannot be snapshotted and is
    /// the only sandbox. The host file tools come only with allowed `host`
    /// directories, which their descriptions then name. The sandstorm profile offers
    /// only its own tools.
    fn router(
        profile: Profile,
        snapshots: bool,
        host: &HostDirs,
    ) -> (ToolRouter<Self>, &'static str) {
        let (mut router, instructions) = match profile {
            Profile::Default => {
                let mut router = Self::tool_router() + Self::fleet_router() + Self::ports_router();
                if snapshots {
                    router += Self::snapshot_router();
                } else {
                    for name in crate::fleet::tools::LAUNCH_ONLY {
                        router.remove_route(name);
                    }
                }
                if !host.is_empty() {
                    router += Self::host_router();
                    let allowed =
                        format!(" Allowed host directories: {}.", host.allowed().join(", "));
                    for name in crate::host::tools::HOST_TOOLS {
                        if let Some(route) = router.map.get_mut(name) {
                            let description = route.attr.description.take().unwrap_or_default();
                            route.attr.description = Some(format!("{description}{allowed}").into());
                        }
                    }
                }
                (router, INSTRUCTIONS)
            }
            Profile::Sandstorm => (Self::sandstorm_router(), crate::sandstorm::INSTRUCTIONS),
        };
        for route in router.map.values_mut() {
            schema::standardize_tool(&mut route.attr);
        }
        (router, instructions)
    }

    #[tool(
        title = "Create a sandbox",
        description = "Claim a fresh Linux microVM sandbox and return its sandbox_id and \
        deadline. Optional: template (default: the server's; see node_info), size (small \
        default, medium, large, xlarge, 2xlarge), net (\"none\" default: no route out; \
        \"egress\": HTTP/HTTPS through the server's allowlist, via the proxy the \
        sandbox's http_proxy variables name; allow narrows that list; egress_log shows \
        each attempt), ttl_seconds (0 or omitted = one hour, max 86400). Default template \
        and size come from a warm pool in milliseconds (warm: true); others boot in \
        seconds, with progress notifications when the client asks for them. Nothing \
        renews the deadline: at it the VM and its files are destroyed. Release it when done.",
        output_schema = schema_for_output::<CreateSandboxResult>(),
        annotations(
            title = "Create a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandbox(
        &self,
        Parameters(params): Parameters<CreateSandboxParams>,
        Extension(progress): Extension<Progress>,
    ) -> Result<CallToolResult, ToolError> {
        progress.set_status("create_sandbox: waiting for a VM (a warm one, or a boot)");
        Ok(success(&self.backend.create(params, &progress).await?))
    }

    #[tool(
        title = "Run a command",
        description = "Run a command in a sandbox to completion and return stdout, stderr, \
        exit_code and truncated: command is a shell line (/bin/sh -c), or argv a program and \
        its arguments run without a shell (exactly one of the two). Optional: cwd, env, \
        stdin (at most 3 MiB), timeout_seconds (default 55, so the answer beats common 60 s \
        client deadlines; up to 300 when asked), max_bytes (of each stream returned: \
        default 16384, at most 1048576) and keep (\"auto\" default: the tail of a failed \
        command's output, where the error is, head and tail of a successful one; \"head\", \
        \"tail\", \"head_tail\"); stdout_bytes and stderr_bytes say how much there was. A \
        non-zero exit_code is a normal result. A run cut off by its timeout or a lost \
        connection is an error result that still carries the output collected so far. \
        Background children (cmd &) are killed at the timeout too; a command the OOM killer \
        ended has oom_killed set. With a progress token, the last line printed comes as \
        progress. For servers or jobs longer than 5 minutes use spawn.",
        output_schema = schema_for_output::<ExecResult>(),
        annotations(
            title = "Run a command",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
        Extension(progress): Extension<Progress>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let timeout_secs = timeout_secs(params.timeout_seconds)?;
        let command = command_of(params.command, params.argv)?;
        let max_bytes = max_bytes(params.max_bytes, EXEC_DEFAULT_MAX_BYTES, EXEC_MAX_BYTES)?;
        let stdin = params.stdin.unwrap_or_default().into_bytes();
        if stdin.len() > EXEC_STDIN_MAX_BYTES {
            return Err(ToolError::new(format!(
                "stdin is {} ({} bytes); exec takes at most {} ({EXEC_STDIN_MAX_BYTES} bytes), \
                 since it travels in one message to the sandbox. Write it to a file with \
                 write_file (in parts with offset and more: true when it is large), then run \
                 the command with < FILE.",
                size(stdin.len() as u64),
                stdin.len(),
                size(EXEC_STDIN_MAX_BYTES as u64)
            )));
        }
        let client = sandbox.client(Op::Command).await?;
        let request = ExecRequest {
            spec: process_spec(command, params.cwd, params.env),
            stdin,
            timeout_ms: None,
            stream: true,
        };
        let timeout = Duration::from_secs(timeout_secs);
        let shape = Shape {
            max_bytes,
            keep: params.keep,
        };
        let collected = exec::run(&client, request, timeout, shape, &progress).await;
        if let End::Failed(error) = &collected.end {
            if !collected.started {
                return Err(ToolError::agent(Op::Command, sandbox.id(), error));
            }
        }
        let result = collected.to_result(timeout);
        Ok(match &result.error {
            Some(message) => failure_with(&result, message),
            None => success(&result),
        })
    }

    #[tool(
        title = "Evaluate code in a session",
        description = "Evaluate code in a named interpreter session of a sandbox, like a \
        notebook cell: variables, imports, functions and the working directory persist from \
        one call to the next. language: \"python\" (default; the sandbox needs python3) or \
        \"sh\"; session: its name (default \"default\"). Returns stdout and stderr \
        (subprocesses included, first 1 MiB each), value (the repr of a last Python \
        expression), status ($? for sh) and the session's pid. Optional timeout_seconds \
        (default 55, at most 300) interrupts the code: Python raises KeyboardInterrupt and \
        the session keeps its state. An exception, a timeout or a session that died \
        (exit(), a crash, a kill) is an error result that still carries the output; a dead \
        session answers not found until you pass restart: true. Code reading stdin gets \
        end of file.",
        output_schema = schema_for_output::<EvalCodeResult>(),
        annotations(
            title = "Evaluate code in a session",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn eval_code(
        &self,
        Parameters(params): Parameters<EvalCodeParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let (request, timeout_secs) = eval::request(params)?;
        let client = sandbox.client(Op::Session).await?;
        let reply = client.eval(request).await;
        let with_python = match &reply {
            Err(error) if eval::is_missing_python(error) => self.backend.python_templates().await,
            _ => Vec::new(),
        };
        let reply = reply.map_err(|error| {
            if eval::is_missing_python(&error) {
                return eval::no_python(
                    sandbox.id(),
                    sandbox.template(),
                    &with_python,
                    |name| {
                        format!(
                            "release this sandbox and call create_sandbox with template: {name:?}"
                        )
                    },
                    "use language: \"sh\" here",
                );
            }
            ToolError::agent(Op::Session, sandbox.id(), &error)
        })?;
        let result = eval::result(reply, timeout_secs);
        Ok(match &result.error {
            Some(message) => failure_with(&result, message),
            None => success(&result),
        })
    }

    #[tool(
        title = "Start a background process",
        description = "Start a shell command (/bin/sh -c) detached in a sandbox and return its \
        pid at once. Its stdout and stderr go to a 256 KiB ring that logs replays; use it for \
        servers and long jobs (wait_for_text waits for a line it prints). Optional: cwd, \
        env. The process runs until it exits, is killed, or the sandbox is destroyed.",
        output_schema = schema_for_output::<SpawnResult>(),
        annotations(
            title = "Start a background process",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn spawn(
        &self,
        Parameters(params): Parameters<SpawnParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let client = sandbox.client(Op::Command).await?;
        let spec = process_spec(Command::Shell(params.command), params.cwd, params.env);
        let pid = client
            .spawn(spec)
            .await
            .map_err(|error| ToolError::agent(Op::Command, sandbox.id(), &error))?;
        Ok(success(&SpawnResult { pid: pid.0 }))
    }

    #[tool(
        title = "List processes",
        description = "List the processes a sandbox tracks (from exec, spawn, terminals and \
        eval_code sessions) with pid, kind, state (running or exited), exit code and start \
        time. By default only running ones; running_only: false lists exited ones too (kept \
        5 minutes after they exit). Optional kind: \"exec\", \"spawn\", \"pty\" or \
        \"session\". hidden counts what the filters left out.",
        output_schema = schema_for_output::<PsResult>(),
        annotations(
            title = "List processes",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn ps(
        &self,
        Parameters(params): Parameters<PsParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let client = sandbox.client(Op::Kill).await?;
        Ok(success(
            &processes::ps(&client, sandbox.id(), &params).await?,
        ))
    }

    #[tool(
        title = "Read a process's output",
        description = "Return a tracked process's output, stdout and stderr in the order it \
        was written (one run per stream switch), whether it still runs, and its exit code \
        once ended. Without a cursor: the newest max_bytes (default 16384, at most 262144). \
        Pass the returned next_cursor as cursor to get only newer output (poll a spawned \
        job), or to page on through older output from a cursor (from/end/omitted_bytes say \
        where you are; the ring keeps the newest 256 KiB). keep: \"auto\" (default), \
        \"head\" or \"tail\".",
        output_schema = schema_for_output::<LogsResult>(),
        annotations(
            title = "Read a process's output",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn logs(
        &self,
        Parameters(params): Parameters<LogsParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let client = sandbox.client(Op::Logs).await?;
        Ok(success(
            &processes::logs(&client, sandbox.id(), &params).await?,
        ))
    }

    #[tool(
        title = "Signal a process",
        description = "Send a signal to a tracked process and everything it started (its \
        cgroup: background and setsid'd children too, also after the process itself \
        exited). signal: 15 (SIGTERM, default), 2 (SIGINT), 9 or 0 (SIGKILL). A process \
        that had already exited is reported as such (already_exited, exit_code); the \
        signal then goes only to what it left running, if anything (sent says whether).",
        output_schema = schema_for_output::<KillResult>(),
        annotations(
            title = "Signal a process",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn kill(
        &self,
        Parameters(params): Parameters<KillParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let signal = params.signal.unwrap_or(DEFAULT_SIGNAL);
        if !(0..=MAX_SIGNAL).contains(&signal) {
            return Err(ToolError::new(format!(
                "signal must be between 0 and {MAX_SIGNAL}; got {signal}. Use 15 (SIGTERM) or 0 \
                 (SIGKILL)."
            )));
        }
        // This tool promises "0 means SIGKILL"; the wire carries the explicit signal.
        let sent = if signal == 0 { SIGKILL } else { signal };
        let client = sandbox.client(Op::Kill).await?;
        Ok(success(
            &processes::kill(&client, sandbox.id(), params.pid, sent).await?,
        ))
    }

    #[tool(
        title = "Wait for text",
        description = "Wait until a file in a sandbox, or a tracked process's output, contains \
        a text, and return where: offset, stream (stdout or stderr, for a process), the line \
        holding it and waited_ms. Give exactly one of path (absolute; the file and even its \
        directory may not exist yet; appends, a rename over it and rewrites are seen) or pid \
        (from spawn: wait for \"listening on\" in a server's output instead of polling logs; \
        all output still in its 256 KiB ring counts). text is exact, not a pattern. Optional \
        timeout_seconds (default 30, max 300; 0 only looks once). An error result when the \
        time runs out or the process exits without printing the text.",
        output_schema = schema_for_output::<WaitForTextResult>(),
        annotations(
            title = "Wait for text",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn wait_for_text(
        &self,
        Parameters(params): Parameters<WaitForTextParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        let target = match (&params.path, params.pid) {
            (Some(path), None) => {
                absolute(path)?;
                WaitTarget::File(path.clone().into_bytes())
            }
            (None, Some(pid)) => WaitTarget::Output(sandbox_protocol::Pid(pid)),
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
        let client = sandbox.client(Op::Wait).await?;
        let found = client
            .wait_for_text(target, params.text, Some(Duration::from_millis(timeout_ms)))
            .await
            .map_err(|error| ToolError::agent(Op::Wait, sandbox.id(), &error))?;
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
        title = "Write a file",
        description = "Write a file in a sandbox, replacing it atomically. path must be \
        absolute and its parent directory must exist (mkdir -p with exec first). content is \
        text, or any bytes with encoding \"base64\". Optional mode in octal, like \"755\". \
        One call carries at most one 16 MiB message: send a larger file in parts, each with \
        its offset (0 first, then the next_offset returned) and more: true, and the last \
        part with more omitted; the file appears when the last part arrives. Parts of 4 MiB \
        are a good size.",
        output_schema = schema_for_output::<WriteFileResult>(),
        annotations(
            title = "Write a file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(params): Parameters<WriteFileParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        absolute(&params.path)?;
        let client = sandbox.client(Op::Write).await?;
        let result = files::write(&self.uploads, &client, sandbox.id(), params).await?;
        Ok(success(&result))
    }

    #[tool(
        title = "Read a file",
        description = "Read a regular file from a sandbox: as text (invalid UTF-8 replaced, \
        lossy set), as base64 of its exact bytes (encoding \"base64\"), or as an image the \
        model can see (PNG, JPEG, GIF, WebP up to 3 MiB: by default for a file that starts \
        like one, unless offset, max_bytes or encoding is given; as_image: false reads its \
        bytes). Returns at most max_bytes (default 65536, at most 4194304) from offset \
        (default 0; negative counts from the end, -4096 is the last 4 KiB); size is the \
        file's, and next_offset is set when the file goes on: pass it as offset to read \
        the next part. Files of any size can be read this way.",
        output_schema = schema_for_output::<ReadFileResult>(),
        annotations(
            title = "Read a file",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_file(
        &self,
        Parameters(params): Parameters<ReadFileParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        absolute(&params.path)?;
        let client = sandbox.client(Op::Read).await?;
        files::read(&client, sandbox.id(), params).await
    }

    #[tool(
        title = "List a directory",
        description = "List one level of a directory in a sandbox: name, kind (file, dir, \
        symlink, other) and size of each entry, sorted by name. Read a file with read_file.",
        output_schema = schema_for_output::<ListDirResult>(),
        annotations(
            title = "List a directory",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_dir(
        &self,
        Parameters(params): Parameters<PathParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        absolute(&params.path)?;
        let client = sandbox.client(Op::List).await?;
        let entries = client
            .list_dir(&params.path)
            .await
            .map_err(|error| ToolError::agent(Op::List, sandbox.id(), &error))?;
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
        title = "Release a sandbox",
        description = "Destroy a sandbox and everything in it, now. Its sandbox_id becomes \
        unknown: releasing it again is an error. (In attach mode the agent is only forgotten, \
        not stopped.)",
        output_schema = schema_for_output::<ReleaseResult>(),
        annotations(
            title = "Release a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn release(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.release(&params.sandbox_id).await?))
    }

    #[tool(
        title = "Describe the sandbox host",
        description = "Describe this sandbox host: mode, the warm pool (ready and booting VMs), \
        templates that create_sandbox accepts, this session's live claims with their \
        deadlines, and capacity (how many more sandboxes can be claimed).",
        output_schema = schema_for_output::<NodeInfoResult>(),
        annotations(
            title = "Describe the sandbox host",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn node_info(&self) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.node_info().await?))
    }
}

impl ServerHandler for SandboxServer {
    // The logging capability: see `set_level`.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(self.instructions)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        tracing::info!("client initialized");
        self.log.connect(context.peer);
    }

    // The logging types are deprecated in rmcp (SEP-2577), not in this protocol
    // version's clients.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        tracing::debug!(level = ?request.level, "client set the log level");
        self.log.set_level(request.level);
        Ok(())
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
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let cancelled = context.ct.clone();
        let started = Instant::now();
        // Every call reports progress when asked; tools that know more (exec, a
        // claim) say it through the status.
        let progress = Progress::for_call(&context, format!("{name}: running"));
        context.extensions.insert(progress.clone());
        let call = self
            .tool_router
            .call(ToolCallContext::new(self, request, context));
        let cap = Duration::from_secs(TOOL_CALL_CAP_SECS);
        let response = tokio::select! {
            () = progress.run() => unreachable!("the progress ticker never ends"),
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

fn process_spec(
    command: Command,
    cwd: Option<String>,
    env: Option<BTreeMap<String, String>>,
) -> ProcessSpec {
    let mut spec = ProcessSpec::new(command);
    spec.cwd = cwd.filter(|cwd| !cwd.is_empty());
    spec.env = env.unwrap_or_default().into_iter().collect();
    spec
}

pub(crate) fn absolute(path: &str) -> Result<(), ToolError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(ToolError::new(format!(
            "path {path:?} is relative; pass an absolute path such as /root/{path}"
        )))
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    kind.as_str()
}

/// What every router's tools must have, for the routers' unit tests.
#[cfg(test)]
pub(crate) fn assert_tools_described(tools: Vec<Tool>, names: &[&str], min_description: usize) {
    let listed: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    assert_eq!(listed, names);
    for tool in tools {
        assert!(tool.title.is_some(), "{} has no title", tool.name);
        assert!(tool.output_schema.is_some(), "{} has no schema", tool.name);
        let annotations = tool.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.open_world_hint, Some(false), "{}", tool.name);
        assert!(annotations.read_only_hint.is_some(), "{}", tool.name);
        assert!(
            tool.description
                .as_ref()
                .is_some_and(|d| d.len() > min_description),
            "{} needs a description that states its limits",
            tool.name
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Allowed host directories, so that the host file tools are offered too.
    fn some_host_dir() -> HostDirs {
        HostDirs::open(&[std::env::temp_dir()], 1).unwrap()
    }

    #[test]
    fn the_host_tools_come_only_with_a_host_dir_and_name_it() {
        let without = SandboxServer::router(Profile::Default, true, &HostDirs::default()).0;
        assert!(without.get("copy_to_host").is_none());
        let with = SandboxServer::router(Profile::Default, true, &some_host_dir()).0;
        let allowed = std::env::temp_dir().display().to_string();
        for name in crate::host::tools::HOST_TOOLS {
            let tool = with
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not offered"));
            let description = tool.description.as_deref().unwrap_or("");
            assert!(description.contains(&allowed), "{name}: {description}");
        }
        let sandstorm = SandboxServer::router(Profile::Sandstorm, true, &some_host_dir()).0;
        assert!(sandstorm.get("copy_to_host").is_none());
    }

    #[test]
    fn every_tool_has_a_title_and_all_four_hints() {
        let tools = [Profile::Default, Profile::Sandstorm]
            .into_iter()
            .flat_map(|profile| {
                SandboxServer::router(profile, true, &some_host_dir())
                    .0
                    .list_all()
            });
        for tool in tools {
            assert!(tool.title.is_some(), "{} has no title", tool.name);
            let hints = tool
                .annotations
                .as_ref()
                .unwrap_or_else(|| panic!("{}", tool.name));
            assert!(hints.title.is_some(), "{}", tool.name);
            assert!(hints.read_only_hint.is_some(), "{}", tool.name);
            assert!(hints.open_world_hint.is_some(), "{}", tool.name);
            if hints.read_only_hint == Some(false) {
                assert!(hints.destructive_hint.is_some(), "{}", tool.name);
                assert!(hints.idempotent_hint.is_some(), "{}", tool.name);
            }
        }
    }

    #[test]
    fn schemas_use_only_standard_formats() {
        // What schemars writes has them (uint64, int32...): the transform is needed.
        let raw: Vec<String> = (SandboxServer::tool_router() + SandboxServer::snapshot_router())
            .list_all()
            .into_iter()
            .flat_map(|tool| {
                schema::formats(&serde_json::Value::Object((*tool.input_schema).clone()))
            })
            .filter(|format| !schema::is_standard(format))
            .collect();
        assert!(!raw.is_empty());
        let tools = [Profile::Default, Profile::Sandstorm]
            .into_iter()
            .flat_map(|profile| {
                SandboxServer::router(profile, true, &some_host_dir())
                    .0
                    .list_all()
            });
        for tool in tools {
            let input = serde_json::Value::Object((*tool.input_schema).clone());
            let output = tool
                .output_schema
                .map(|schema| serde_json::Value::Object((*schema).clone()));
            for schema in std::iter::once(input).chain(output) {
                let odd: Vec<String> = schema::formats(&schema)
                    .into_iter()
                    .filter(|format| !schema::is_standard(format))
                    .collect();
                assert!(odd.is_empty(), "{}: {odd:?} in {schema}", tool.name);
            }
        }
    }
}
