//! The snapshot tools: a second tool router on [`SandboxServer`], combined with the
//! first in [`SandboxServer::new`] when the server launches microVMs (attach mode
//! does not offer them). Each tool only checks and forwards its arguments; the work
//! is the engine's (`sandbox_engine::snapshot::ops`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};

use super::params::{CheckpointIdParams, CheckpointParams, ForkParams, PromoteParams};
use super::render::{
    BranchResult, CheckpointResult, DeleteCheckpointResult, ForkResult, HibernateResult,
    ListCheckpointsResult, PromoteResult,
};
use crate::error::ToolError;
use crate::params::SandboxParams;
use crate::render::success;
use crate::tools::SandboxServer;

#[tool_router(router = snapshot_router, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        title = "Fork a sandbox",
        description = "Clone a running sandbox into count children (1 by default, at most \
        the server's max_fork_count, 16 unless configured), each starting from the parent's \
        exact memory, processes and files at this moment and diverging afterwards. All or \
        nothing: either every child is made or none is. The parent keeps running (paused \
        for a moment). Each child is a new sandbox of this session with its own sandbox_id, \
        token and hostname, lives one hour (not renewable), and is destroyed with the \
        session; each needs room within the server's sandbox limit (node_info shows \
        capacity). A hibernated parent is woken first.",
        output_schema = schema_for_output::<ForkResult>(),
        annotations(
            title = "Fork a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork(
        &self,
        Parameters(params): Parameters<ForkParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(
            &self.backend.fork(&params.sandbox_id, params.count).await?,
        ))
    }

    #[tool(
        title = "Checkpoint a sandbox",
        description = "Capture a sandbox's full state (memory, processes, files) without \
        stopping it (it pauses for a moment) and return a checkpoint_id. \
        branch_checkpoint starts any number of new sandboxes from it, in this session or a \
        later one: checkpoints are kept on the host after the session and the server end, \
        until delete_checkpoint. Optional name: a unique name usable in place of the id. \
        A hibernated sandbox is woken first.",
        output_schema = schema_for_output::<CheckpointResult>(),
        annotations(
            title = "Checkpoint a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn checkpoint(
        &self,
        Parameters(params): Parameters<CheckpointParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(
            &self
                .backend
                .checkpoint(&params.sandbox_id, params.name)
                .await?,
        ))
    }

    #[tool(
        title = "Start a sandbox from a checkpoint",
        description = "Claim a fresh sandbox that starts at a checkpoint's captured moment: \
        its memory, processes and files as they were, with its own sandbox_id, token and \
        hostname. Takes any checkpoint_id (or name) this host holds, including one made in \
        an earlier session; no need to list first. The new sandbox lives one hour (not \
        renewable) and is destroyed with the session; the checkpoint stays, and is in use \
        (not deletable) while the sandbox lives.",
        output_schema = schema_for_output::<BranchResult>(),
        annotations(
            title = "Start a sandbox from a checkpoint",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn branch_checkpoint(
        &self,
        Parameters(params): Parameters<CheckpointIdParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.branch(&params.checkpoint_id).await?))
    }

    #[tool(
        title = "List checkpoints",
        description = "List the checkpoints this host holds, oldest first: checkpoint_id, \
        name, the sandbox it was taken from, template, creation time, size on disk, and \
        what uses it (sandboxes started from it; a checkpoint in use cannot be deleted). \
        Checkpoints of earlier sessions are listed too; a fork's own, removed \
        automatically, are not.",
        output_schema = schema_for_output::<ListCheckpointsResult>(),
        annotations(
            title = "List checkpoints",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_checkpoints(&self) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.list_checkpoints().await?))
    }

    #[tool(
        title = "Delete a checkpoint",
        description = "Delete a checkpoint from the host for good, freeing its disk space; \
        its checkpoint_id becomes unknown. Refused while a sandbox started from it lives \
        (release those first); list_checkpoints shows what uses each checkpoint.",
        output_schema = schema_for_output::<DeleteCheckpointResult>(),
        annotations(
            title = "Delete a checkpoint",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn delete_checkpoint(
        &self,
        Parameters(params): Parameters<CheckpointIdParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(
            &self
                .backend
                .delete_checkpoint(&params.checkpoint_id)
                .await?,
        ))
    }

    #[tool(
        title = "Hibernate a sandbox",
        description = "Put a sandbox to sleep: its state goes to the host's disk and its VM \
        stops, freeing its memory and its room within the server's sandbox limit, while its \
        sandbox_id, files and processes (with their pids) are kept. The next call that \
        reaches it (exec, read_file, spawn, logs, ...) wakes it transparently, in well \
        under a second; calls in flight on it when it hibernates are cut off. Its deadline \
        still applies. Hibernating a hibernated sandbox does nothing.",
        output_schema = schema_for_output::<HibernateResult>(),
        annotations(
            title = "Hibernate a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn hibernate(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.hibernate(&params.sandbox_id).await?))
    }

    #[tool(
        title = "Promote a sandbox to a template",
        description = "Publish a sandbox's current state (memory, processes, files) as a \
        named template on this host: create_sandbox with that template then starts \
        sandboxes from this state, each with its own identity. Promoting again under the \
        same name replaces the template (sandboxes already made from it keep running); \
        built templates and the server's default cannot be replaced. The sandbox keeps \
        running (paused for a moment). Templates outlive the session.",
        output_schema = schema_for_output::<PromoteResult>(),
        annotations(
            title = "Promote a sandbox to a template",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn promote(
        &self,
        Parameters(params): Parameters<PromoteParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(
            &self
                .backend
                .promote(&params.sandbox_id, &params.template)
                .await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use clap::Parser;
    use sandbox_engine::Node;

    use super::*;
    use crate::config::{Args, Config};

    /// A node attached to an agent that is not there (nothing is called on it).
    async fn attached_node() -> Arc<Node> {
        let args =
            Args::try_parse_from(["sandbox-mcp", "--agent", "unix:///nonexistent/a.sock"]).unwrap();
        let config = Config::from_args(args, |_| None).unwrap();
        Node::start(config.mode().unwrap().clone()).await
    }

    #[tokio::test]
    async fn in_attach_mode_the_snapshot_tools_are_not_offered_and_say_what_they_need() {
        use rmcp::ServerHandler;
        let node = attached_node().await;
        let server = SandboxServer::new(
            crate::backend::Backend::embedded(node.clone(), Default::default()),
            crate::config::Profile::Default,
            Default::default(),
        );
        assert!(server.get_tool("exec").is_some());
        assert!(server.get_tool("fork").is_none());
        assert!(server.get_tool("hibernate").is_none());
        // The fleet tools that describe work on the attached agent; those that claim
        // or list templates are not offered.
        assert!(server.get_tool("list_sandboxes").is_some());
        assert!(server.get_tool("ping_sandbox").is_some());
        assert!(server.get_tool("create_sandboxes").is_none());
        assert!(server.get_tool("list_templates").is_none());
        let fork = ToolError::fork("attached", &node.fork("attached", 1).await.unwrap_err());
        assert!(fork
            .message
            .starts_with("fork needs a server that launches microVMs"));
        let list = ToolError::list_checkpoints(&node.list_checkpoints().unwrap_err());
        assert!(
            list.message.contains("exec and the file tools"),
            "{}",
            list.message
        );
        let branch =
            ToolError::branch("branch_checkpoint", &node.branch("c", 1).await.unwrap_err());
        assert!(branch.message.starts_with("branch_checkpoint needs"));
        let hibernate =
            ToolError::hibernate("attached", &node.hibernate("attached").await.unwrap_err());
        assert!(
            hibernate.message.contains("attached agent"),
            "{}",
            hibernate.message
        );
        let unknown =
            ToolError::hibernate("sbx-nope", &node.hibernate("sbx-nope").await.unwrap_err());
        assert!(unknown.message.starts_with("Unknown sandbox_id"));
        node.shutdown().await;
    }

    #[test]
    fn every_snapshot_tool_has_a_title_annotations_a_schema_and_a_usable_description() {
        crate::tools::assert_tools_described(
            SandboxServer::snapshot_router().list_all(),
            &[
                "branch_checkpoint",
                "checkpoint",
                "delete_checkpoint",
                "fork",
                "hibernate",
                "list_checkpoints",
                "promote",
            ],
            150,
        );
    }
}
