//! The sandstorm profile's router: seed 001's ten tools under their own names, on
//! [`SandboxServer`] (the methods are prefixed, the tools are not: `eval_code` and
//! `wait_for_text` exist in the default profile with other arguments). Each tool
//! that reads or ends a sandbox checks its token (where sandstorm requires one, and
//! on `branch_sandbox` and `kill_sandbox`) and forwards to [`super::ops`] or
//! [`super::guest`].

use rmcp::handler::server::common::Extension;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};

use super::params::{
    BranchSandboxParams, EvalCodeParams, ExecCommandParams, Guarded, KillSandboxParams,
    PingSandboxParams, SandboxIdParams, SpawnSandboxesParams, WaitForTextParams,
};
use super::render::{
    list, object, BranchInfo, EvalCodeResult, ExecCommandResult, KillInfo, Listing, PingInfo,
    SandboxInfo, SnapshotInfo, SpawnedSandbox, WaitForTextResult,
};
use super::{guest, node, ops};
use crate::backend::Handle;
use crate::error::ToolError;
use crate::progress::Progress;
use crate::tools::SandboxServer;

#[tool_router(router = sandstorm_router, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "list_snapshots",
        title = "List templates and snapshots",
        description = "List what sandboxes can be spawned from: templates (built or promoted \
        on this host; default marks the one kept warm, and warm how many of it spawn in \
        milliseconds now) and snapshots (running sandboxes captured by branch_sandbox, kept after the \
        session), each with its tag for spawn_sandboxes, kind, creation time, template, \
        vCPUs and memory.",
        output_schema = schema_for_output::<Listing<SnapshotInfo>>(),
        annotations(
            title = "List templates and snapshots",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandstorm_list_snapshots(&self) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(list(node::snapshots(session).await?));
        }
        Ok(list(ops::snapshots(
            self.backend.engine("list_snapshots")?,
        )?))
    }

    #[tool(
        name = "spawn_sandboxes",
        title = "Spawn sandboxes",
        description = "Start n sandboxes (default 1) from snapshot_tag: a template, or a \
        snapshot from branch_sandbox, whose sandboxes each start from the captured state and \
        diverge. All or nothing. Returns each sandbox's id and token: keep the token, \
        exec_command, eval_code, wait_for_text and ping_sandbox require it as sandbox_token \
        and no other tool shows it. Each sandbox is its own microVM with no network, lives \
        one hour at most, and is destroyed when this session ends; kill_sandbox ends one \
        sooner. n is bounded by the server's sandbox limit (kill sandboxes to make room).",
        output_schema = schema_for_output::<Listing<SpawnedSandbox>>(),
        annotations(
            title = "Spawn sandboxes",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandstorm_spawn_sandboxes(
        &self,
        Parameters(params): Parameters<SpawnSandboxesParams>,
    ) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(list(node::spawn(session, &params).await?));
        }
        let sandboxes = ops::spawn(self.backend.engine("spawn_sandboxes")?, &params).await?;
        Ok(list(
            sandboxes.iter().map(|s| SpawnedSandbox::new(s)).collect(),
        ))
    }

    #[tool(
        name = "branch_sandbox",
        title = "Branch a sandbox into a snapshot",
        description = "Capture a running sandbox's exact state (memory, processes, files) as \
        a new snapshot tag, pausing it only for a moment; it keeps running. \
        spawn_sandboxes with that tag then starts any number of sandboxes from this \
        moment, each diverging on its own. tag defaults to branch-<sandbox_id>-<unix ms>. \
        mode full writes the whole memory; diff (the default) and live only what changed \
        since the sandbox's last snapshot; measure_diff and wait are accepted, and the \
        snapshot is ready when the call returns. Snapshots stay \
        on the host after the session. Requires the sandbox's sandbox_token.",
        output_schema = schema_for_output::<BranchInfo>(),
        annotations(
            title = "Branch a sandbox into a snapshot",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandstorm_branch_sandbox(
        &self,
        Parameters(params): Parameters<BranchSandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(object(&node::branch(session, &params).await?));
        }
        Ok(object(
            &ops::branch(self.backend.engine("branch_sandbox")?, &params).await?,
        ))
    }

    #[tool(
        name = "list_sandboxes",
        title = "List sandboxes",
        description = "List this session's live sandboxes: id, the snapshot_tag it was \
        spawned from, state, creation and expiry times (Unix seconds), vCPUs and memory. \
        Tokens are not shown: spawn_sandboxes returned them.",
        output_schema = schema_for_output::<Listing<SandboxInfo>>(),
        annotations(
            title = "List sandboxes",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandstorm_list_sandboxes(&self) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(list(node::list(session).await?));
        }
        let sandboxes = self.backend.engine("list_sandboxes")?.registry().list();
        Ok(list(
            sandboxes.iter().map(|s| SandboxInfo::new(s)).collect(),
        ))
    }

    #[tool(
        name = "get_sandbox",
        title = "Describe a sandbox",
        description = "Describe one sandbox by id: the snapshot_tag it was spawned from, \
        state, creation and expiry times (Unix seconds), vCPUs and memory. Its token is not \
        shown. An unknown or killed id is an error that lists the live ones.",
        output_schema = schema_for_output::<SandboxInfo>(),
        annotations(
            title = "Describe a sandbox",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandstorm_get_sandbox(
        &self,
        Parameters(params): Parameters<SandboxIdParams>,
    ) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(object(&node::get(session, &params.sandbox_id).await?));
        }
        let sandbox = ops::sandbox(self.backend.engine("get_sandbox")?, &params.sandbox_id)?;
        Ok(object(&SandboxInfo::new(&sandbox)))
    }

    #[tool(
        name = "exec_command",
        title = "Run a program",
        description = "Run a program in a sandbox and return stdout, stderr and exit_code. \
        args is the program and its arguments, run without a shell, or one shell command \
        line as a string (\"ls -l | wc -l\"), run with /bin/sh -c. Requires sandbox_token. timeout_secs \
        (default 30, at most 300) kills the command and all it started; a run cut off so is \
        an error result that still carries its output. Each stream keeps 16 KiB: the tail \
        of a failed command (where the error is), head and tail of a successful one, with \
        a [... N omitted ...] line at the cut and truncated set; for more, redirect the \
        output to a file and read parts of it (head, tail, grep). A non-zero exit_code is \
        a normal result.",
        output_schema = schema_for_output::<ExecCommandResult>(),
        annotations(
            title = "Run a program",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandstorm_exec_command(
        &self,
        Parameters(params): Parameters<ExecCommandParams>,
        Extension(progress): Extension<Progress>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.authorized(&params)?;
        guest::exec_command(&sandbox, params.args, params.timeout_secs, &progress).await
    }

    #[tool(
        name = "eval_code",
        title = "Evaluate Python",
        description = "Evaluate Python in the sandbox's resident interpreter, like a notebook \
        cell: variables and imports persist between calls, and a template that starts the \
        interpreter at boot (list_snapshots) answers in milliseconds. Returns result (the \
        repr of a last expression), error (a traceback; exit_code 1) and what the code \
        printed. Requires sandbox_token. Code running past 60 s is interrupted; an \
        interpreter that died is started afresh by the next call.",
        output_schema = schema_for_output::<EvalCodeResult>(),
        annotations(
            title = "Evaluate Python",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandstorm_eval_code(
        &self,
        Parameters(params): Parameters<EvalCodeParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.authorized(&params)?;
        guest::eval_code(&self.backend, &sandbox, params.code).await
    }

    #[tool(
        name = "wait_for_text",
        title = "Wait for text in a file",
        description = "Wait until a file in a sandbox contains marker (exact text), for \
        example a READY line an agent writes to its log. The file may not exist yet; it is \
        watched, so the marker is seen as soon as it is written. Returns found, elapsed_ms \
        and last_excerpt (the line with the marker, or the file's last 256 bytes when it \
        did not appear within timeout_secs: default 60, at most 300). Requires \
        sandbox_token.",
        output_schema = schema_for_output::<WaitForTextResult>(),
        annotations(
            title = "Wait for text in a file",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandstorm_wait_for_text(
        &self,
        Parameters(params): Parameters<WaitForTextParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.authorized(&params)?;
        guest::wait_for_text(&sandbox, &params.path, params.marker, params.timeout_secs).await
    }

    #[tool(
        name = "ping_sandbox",
        title = "Ping a sandbox",
        description = "Health-check a sandbox: a round trip to its in-guest agent, with the \
        agent's version, uptime, load, free memory and running processes. Requires \
        sandbox_token. An agent that does not answer is an error result.",
        output_schema = schema_for_output::<PingInfo>(),
        annotations(
            title = "Ping a sandbox",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandstorm_ping_sandbox(
        &self,
        Parameters(params): Parameters<PingSandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        let sandbox = self.authorized(&params)?;
        guest::ping_sandbox(&self.backend, &sandbox).await
    }

    #[tool(
        name = "kill_sandbox",
        title = "Kill a sandbox",
        description = "Destroy one sandbox now: its VM stops, and its files and processes \
        are gone; its id becomes unknown and its token useless. Snapshots branched from it \
        are kept. Requires the sandbox's sandbox_token.",
        output_schema = schema_for_output::<KillInfo>(),
        annotations(
            title = "Kill a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandstorm_kill_sandbox(
        &self,
        Parameters(params): Parameters<KillSandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        if let Some(session) = self.backend.node_session() {
            return Ok(object(&node::kill(session, &params).await?));
        }
        Ok(object(
            &ops::kill(self.backend.engine("kill_sandbox")?, &params).await?,
        ))
    }
}

impl SandboxServer {
    /// The sandbox a call that reads or ends it names, once its token checks out,
    /// on either backend.
    fn authorized(&self, params: &impl Guarded) -> Result<Handle, ToolError> {
        let (id, token) = (params.sandbox_id(), params.sandbox_token());
        if let Some(session) = self.backend.node_session() {
            return node::authorized(session, id, token).map(Handle::Node);
        }
        ops::authorized(self.backend.engine("this tool")?, id, token).map(Handle::Embedded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 001's tools, as sandstorm-mcp names them.
    const SANDSTORM_TOOLS: [&str; 10] = [
        "branch_sandbox",
        "eval_code",
        "exec_command",
        "get_sandbox",
        "kill_sandbox",
        "list_sandboxes",
        "list_snapshots",
        "ping_sandbox",
        "spawn_sandboxes",
        "wait_for_text",
    ];

    /// The tools that read or end a sandbox, and so require `sandbox_token`: those
    /// that reach the guest, as in sandstorm, and (stricter) branch and kill.
    const TOKEN_TOOLS: [&str; 6] = [
        "branch_sandbox",
        "eval_code",
        "exec_command",
        "kill_sandbox",
        "ping_sandbox",
        "wait_for_text",
    ];

    #[test]
    fn the_router_is_exactly_seed_001s_tools_with_tokens_on_all_that_read_or_end_one() {
        let tools = SandboxServer::sandstorm_router().list_all();
        let mut names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
        names.sort();
        assert_eq!(names, SANDSTORM_TOOLS);
        for tool in &tools {
            let properties = tool.input_schema.get("properties");
            let has_token = properties
                .and_then(|p| p.as_object())
                .is_some_and(|p| p.contains_key("sandbox_token"));
            assert_eq!(
                has_token,
                TOKEN_TOOLS.contains(&tool.name.as_ref()),
                "{}",
                tool.name
            );
            assert!(tool.output_schema.is_some(), "{} has no schema", tool.name);
            assert!(
                tool.description.as_ref().is_some_and(|d| d.len() > 120),
                "{} needs a description that states its limits",
                tool.name
            );
        }
    }

    #[test]
    fn arguments_are_sandstorms() {
        let tools = SandboxServer::sandstorm_router();
        let args = |name: &str| -> Vec<String> {
            let tool = tools.get(name).expect(name);
            let mut keys: Vec<String> = tool
                .input_schema
                .get("properties")
                .and_then(|p| p.as_object())
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            keys.sort();
            keys
        };
        assert_eq!(
            args("spawn_sandboxes"),
            [
                "live_fork",
                "memory_limit_mib",
                "n",
                "per_child_netns",
                "prewarm",
                "snapshot_tag"
            ]
        );
        assert_eq!(
            args("exec_command"),
            ["args", "sandbox_id", "sandbox_token", "timeout_secs"]
        );
        assert_eq!(
            args("wait_for_text"),
            [
                "marker",
                "path",
                "poll_interval_ms",
                "sandbox_id",
                "sandbox_token",
                "timeout_secs"
            ]
        );
        assert_eq!(
            args("branch_sandbox"),
            [
                "diff",
                "measure_diff",
                "mode",
                "sandbox_id",
                "sandbox_token",
                "tag",
                "wait"
            ]
        );
        assert_eq!(args("eval_code"), ["code", "sandbox_id", "sandbox_token"]);
        assert_eq!(args("ping_sandbox"), ["sandbox_id", "sandbox_token"]);
        assert_eq!(args("kill_sandbox"), ["sandbox_id", "sandbox_token"]);
        assert_eq!(args("get_sandbox"), ["sandbox_id"]);
        assert!(args("list_snapshots").is_empty());
    }
}
