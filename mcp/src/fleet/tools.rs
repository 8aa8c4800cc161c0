//! The fleet tools of the default profile: a third tool router on
//! [`SandboxServer`], combined with the others in [`SandboxServer::new`]. Each tool
//! checks and forwards its arguments; the work is in [`super::ops`].

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use sandbox_vmm::launcher::Size;

use super::params::{CreateSandboxesParams, EgressLogParams};
use super::render::{
    CreateSandboxesResult, EgressLogResult, EgressRow, ListSandboxesResult, ListTemplatesResult,
    PingResult, SandboxRow,
};
use crate::error::ToolError;
use crate::params::SandboxParams;
use crate::render::success;
use crate::tools::SandboxServer;
use sandbox_engine::node::claim_ttl_secs;

/// Tools of this router that need a server that launches microVMs.
pub(crate) const LAUNCH_ONLY: [&str; 3] = ["create_sandboxes", "egress_log", "list_templates"];

#[tool_router(router = fleet_router, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        title = "Create several sandboxes",
        description = "Claim count fresh sandboxes of one template in one call and return \
        each one's sandbox_id and deadline, as create_sandbox does for one. All or \
        nothing: room for all of them is checked first (nothing is evicted or kept when \
        they do not fit), warm VMs are used first and the rest start side by side, and \
        when one fails to start none is kept. Optional: template (list_templates), size, \
        net, ttl_seconds, applied to each. Each sandbox is independent (its own files and \
        processes) and destroyed at its deadline or with the session; release each when \
        done. To copy one running sandbox's state into several, use fork.",
        output_schema = schema_for_output::<CreateSandboxesResult>(),
        annotations(
            title = "Create several sandboxes",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandboxes(
        &self,
        Parameters(params): Parameters<CreateSandboxesParams>,
    ) -> Result<CallToolResult, ToolError> {
        if params.net == crate::params::Net::Egress {
            return Err(ToolError::new(
                "create_sandboxes gives no egress: call create_sandbox with net \"egress\" \
                 for each sandbox that needs it (or fork one that has it).",
            ));
        }
        let ttl_secs = claim_ttl_secs(params.ttl_seconds)?;
        let size = match params.size {
            Some(name) => Some(Size::preset(name.as_str()).ok_or_else(|| {
                ToolError::new(format!(
                    "Size {} is not one the launcher knows; use small, medium, large, \
                     xlarge or 2xlarge.",
                    name.as_str()
                ))
            })?),
            None => None,
        };
        Ok(success(
            &self.backend.create_many(&params, size, ttl_secs).await?,
        ))
    }

    #[tool(
        title = "Read a sandbox's egress log",
        description = "List the outbound connections a sandbox created with net \"egress\" \
        tried, oldest first: time, verdict (allowed; denied by the allowlist, with the \
        reason; failed to resolve or connect; refused as not an HTTP proxy request), \
        destination host:port, the address dialled, bytes each way and duration. An \
        allowed connection is recorded when it closes. Empty for a sandbox without egress.",
        output_schema = schema_for_output::<EgressLogResult>(),
        annotations(
            title = "Read a sandbox's egress log",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn egress_log(
        &self,
        Parameters(params): Parameters<EgressLogParams>,
    ) -> Result<CallToolResult, ToolError> {
        let tail = usize::try_from(params.tail.unwrap_or(100).min(1000)).unwrap_or(1000);
        if let Some(session) = self.backend.node_session() {
            let reply = session.egress_log(&params.sandbox_id, tail).await?;
            return Ok(success(&EgressLogResult {
                sandbox_id: reply.id,
                server_allowlist: reply.allowlist,
                records: reply.records.iter().map(EgressRow::new).collect(),
            }));
        }
        let node = self.backend.engine("egress_log")?;
        let sandbox =
            crate::backend::embedded::sandbox(node, self.backend.ended(), &params.sandbox_id)?;
        let records = match node.egress_log(&sandbox, tail) {
            None => {
                return Err(ToolError::new(
                    "An attached agent has no egress log: this server launches no VMs.",
                ))
            }
            Some(Err(error)) => {
                return Err(ToolError::new(format!(
                    "Cannot read the egress log of {}: {}",
                    sandbox.id,
                    sandbox_vmm::error_chain(&error)
                )))
            }
            Some(Ok(records)) => records,
        };
        Ok(success(&EgressLogResult {
            sandbox_id: sandbox.id.to_string(),
            server_allowlist: node.egress_allow(),
            records: records.iter().map(EgressRow::new).collect(),
        }))
    }

    #[tool(
        title = "List sandboxes",
        description = "List this session's sandboxes by sandbox_id: state (running, \
        hibernated, busy), template, where each came from (a fork's parent, a \
        checkpoint), size, claim time, deadline and seconds left; and how many more can \
        be claimed. Asks no guest anything, so hibernated sandboxes stay asleep.",
        output_schema = schema_for_output::<ListSandboxesResult>(),
        annotations(
            title = "List sandboxes",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sandboxes(&self) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.list_sandboxes().await?))
    }

    #[tool(
        title = "Describe a sandbox",
        description = "Describe one sandbox of this session: state (running, hibernated, \
        busy), template, where it came from (a fork's parent, a checkpoint), size, claim \
        time, deadline and seconds left. Asks the guest nothing (ping_sandbox does); an \
        unknown or released sandbox_id is an error that lists the live ones.",
        output_schema = schema_for_output::<SandboxRow>(),
        annotations(
            title = "Describe a sandbox",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_sandbox(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(
            &self.backend.get_sandbox(&params.sandbox_id).await?,
        ))
    }

    #[tool(
        title = "Ping a sandbox",
        description = "Check that a sandbox's agent answers, and how the guest is: round \
        trip in milliseconds, agent version, uptime, load, free memory and running \
        processes. A hibernated sandbox is reported as hibernated without waking it. An \
        agent that does not answer is an error result saying what to do.",
        output_schema = schema_for_output::<PingResult>(),
        annotations(
            title = "Ping a sandbox",
            read_only_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn ping_sandbox(
        &self,
        Parameters(params): Parameters<SandboxParams>,
    ) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.ping(&params.sandbox_id).await?))
    }

    #[tool(
        title = "List templates",
        description = "List the templates this host holds, which create_sandbox and \
        create_sandboxes accept: name, whether it is the server's default (kept warm, so \
        claims take milliseconds), default size, whether promote made it, the interpreter \
        sessions its sandboxes start with (eval_code in those starts instantly), and why \
        one is unusable if it is. Checkpoints are listed by list_checkpoints.",
        output_schema = schema_for_output::<ListTemplatesResult>(),
        annotations(
            title = "List templates",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_templates(&self) -> Result<CallToolResult, ToolError> {
        Ok(success(&self.backend.list_templates().await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fleet_tool_has_a_title_annotations_a_schema_and_a_usable_description() {
        let tools = SandboxServer::fleet_router().list_all();
        for name in LAUNCH_ONLY {
            assert!(tools.iter().any(|tool| tool.name == name), "{name}");
        }
        crate::tools::assert_tools_described(
            tools,
            &[
                "create_sandboxes",
                "egress_log",
                "get_sandbox",
                "list_sandboxes",
                "list_templates",
                "ping_sandbox",
            ],
            150,
        );
    }
}
