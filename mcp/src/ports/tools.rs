//! The `expose_port` tool of the default profile: a fourth tool router on
//! [`SandboxServer`], combined with the others in `SandboxServer::router`.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ToolError;
use crate::render::{success, Render};
use crate::tools::SandboxServer;

/// The longest `ttl_seconds` (a claim lives at most a day anyway).
pub const MAX_EXPOSE_TTL_SECS: u64 = 86_400;

/// `expose_port`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePortParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// The TCP port a server listens on inside the sandbox (on 127.0.0.1 or 0.0.0.0).
    pub port: u16,
    /// How long the URL works, in seconds (0 or omitted: until the sandbox ends; at
    /// most 86400).
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// `expose_port`'s answer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ExposePortResult {
    /// The sandbox.
    pub sandbox_id: String,
    /// The guest port.
    pub port: u16,
    /// Where the server is reached from outside the sandbox.
    pub url: String,
    /// "preview" (a node's link, for anyone holding it) or "local" (a listener on
    /// this machine's loopback, any TCP protocol).
    pub kind: String,
    /// When the URL stops working (RFC 3339); empty when nothing bounds it but the
    /// session.
    pub expires_at: String,
}

impl Render for ExposePortResult {
    fn render(&self) -> String {
        let reach = match self.kind.as_str() {
            "local" => "from this machine only",
            _ => "by anyone holding the URL",
        };
        let until = if self.expires_at.is_empty() {
            "until the sandbox ends".to_owned()
        } else {
            format!("until {}", self.expires_at)
        };
        format!(
            "Port {} of {} is at {} ({reach}, {until}).",
            self.port, self.sandbox_id, self.url
        )
    }
}

#[tool_router(router = ports_router, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        title = "Expose a port",
        description = "Return a URL that reaches a TCP server running inside a sandbox \
        (a dev server, Jupyter, an API under test), for a browser, curl or another \
        program outside it. Start the server first (spawn), listening on 127.0.0.1 or \
        0.0.0.0. Through a node daemon the URL is the node's preview link, which proxies \
        HTTP and WebSockets for anyone holding it; with sandboxes in this process it is \
        a listener on this machine's 127.0.0.1 that carries any TCP protocol. Either \
        ends with the sandbox or after ttl_seconds. A port with nothing listening fails \
        each request, not this call.",
        output_schema = schema_for_output::<ExposePortResult>(),
        annotations(
            title = "Expose a port",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn expose_port(
        &self,
        Parameters(params): Parameters<ExposePortParams>,
    ) -> Result<CallToolResult, ToolError> {
        if params.port == 0 {
            return Err(ToolError::new("port must be 1-65535."));
        }
        if params.ttl_seconds > MAX_EXPOSE_TTL_SECS {
            return Err(ToolError::new(format!(
                "ttl_seconds must be at most {MAX_EXPOSE_TTL_SECS}; use 0 for as long as \
                 the sandbox lives."
            )));
        }
        Ok(success(
            &self
                .backend
                .expose_port(&params.sandbox_id, params.port, params.ttl_seconds)
                .await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expose_port_has_a_title_annotations_a_schema_and_a_usable_description() {
        crate::tools::assert_tools_described(
            SandboxServer::ports_router().list_all(),
            &["expose_port"],
            150,
        );
    }

    #[test]
    fn misspelt_fields_are_refused() {
        let ok: ExposePortParams =
            serde_json::from_str(r#"{"sandbox_id":"a","port":8000}"#).unwrap();
        assert_eq!((ok.port, ok.ttl_seconds), (8000, 0));
        assert!(
            serde_json::from_str::<ExposePortParams>(r#"{"sandbox_id":"a","prot":1}"#).is_err()
        );
        assert!(
            serde_json::from_str::<ExposePortParams>(r#"{"sandbox_id":"a","port":70000}"#).is_err()
        );
    }
}
