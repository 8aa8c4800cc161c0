//! A node daemon's refusals in this server's words. The daemon answers every
//! failure as `{"error": MESSAGE, "code": CODE}` with a status; the code picks the
//! same hint the embedded engine's typed error gets in [`crate::error`], so a model
//! reads the same next step whichever backend it runs on.

use std::time::Duration;

use sandbox_vmm::error_chain;
use sandbox_vmm::node_api::NodeApiError;

use crate::error::ToolError;

/// What the session asked the node for, for the hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<'a> {
    /// A claim from template `.0` (`None`: the node's default).
    Claim(Option<&'a str>),
    /// A verb on sandbox `.1` (`.0` names the tool).
    Sandbox(&'a str, &'a str),
    /// A claim from checkpoint `.0`.
    Branch(&'a str),
    /// Deleting checkpoint `.0`.
    DeleteCheckpoint(&'a str),
    /// A node-wide read (info, listings), `.0` names the tool.
    Node(&'a str),
}

impl Call<'_> {
    fn tool(&self) -> &str {
        match self {
            Self::Claim(_) => "create_sandbox",
            Self::Sandbox(tool, _) | Self::Node(tool) => tool,
            Self::Branch(_) => "branch_checkpoint",
            Self::DeleteCheckpoint(_) => "delete_checkpoint",
        }
    }
}

/// `error`, from the node at `base`, for `call`; `templates` are the node's (for
/// a refused template), when known.
pub fn node_error(
    base: &str,
    call: Call<'_>,
    error: &NodeApiError,
    templates: &[String],
) -> ToolError {
    match error {
        NodeApiError::Refused {
            status,
            code,
            message,
        } => refused(base, call, *status, code, message, templates),
        NodeApiError::Timeout { after, .. } => timed_out(base, call, *after),
        NodeApiError::Address(_)
        | NodeApiError::Connect { .. }
        | NodeApiError::Transport { .. } => ToolError::new(format!(
            "Cannot reach the node daemon at {base}: {}. Check that sandboxd runs there and \
             listens on that address (sandboxd --listen HOST:PORT); the user sets the \
             address with sandbox-mcp --addr (or SANDBOXD_ADDR / SANDSTORM_URL).",
            error_chain(error)
        )),
        NodeApiError::Downgrade { .. } => ToolError::new(format!(
            "{}. The operator should advertise every node of the fleet over HTTPS \
             (sandboxd --advertise https://HOST:PORT).",
            error_chain(error)
        )),
        NodeApiError::RedirectedAgain { .. } => ToolError::new(format!(
            "The fleet behind {base} sent {} on in a loop: {}. Its nodes disagree on \
             placement; the operator should check that every node runs the same sandboxd.",
            call.tool(),
            error_chain(error)
        )),
        NodeApiError::Decode { .. } => ToolError::new(format!(
            "The node at {base} answered {} with something that is not sandboxd's API: {}. \
             Check that --addr names a sandboxd, not another service.",
            call.tool(),
            error_chain(error)
        )),
    }
}

/// The node did not answer within the request timeout.
fn timed_out(base: &str, call: Call<'_>, timeout: Duration) -> ToolError {
    ToolError::new(format!(
        "The node at {base} did not answer {} within {} s. It may still be working on it \
         (list_sandboxes shows what this session holds); the user can raise the limit \
         with sandbox-mcp --http-timeout SECS (SANDSTORM_HTTP_TIMEOUT for sandstorm).",
        call.tool(),
        timeout.as_secs()
    ))
}

fn refused(
    base: &str,
    call: Call<'_>,
    status: u16,
    code: &str,
    message: &str,
    templates: &[String],
) -> ToolError {
    let message = message.trim_end_matches('.');
    let text = match (code, call) {
        // Every call here carries this server's --token, the operator's; the daemon
        // takes any other bearer for a sandbox's token, so a wrong one is a 403 on
        // operator endpoints and a 401 elsewhere.
        ("unauthorized" | "forbidden", _) => format!(
            "The node at {base} refused this server's token for {} ({message}): it is not \
             the node's operator token. The user must start sandbox-mcp with it: --token \
             TOKEN (or SANDBOXD_TOKEN, SANDSTORM_TOKEN for sandstorm), the contents of \
             sandboxd's --token-file.",
            call.tool()
        ),
        ("draining", _) => "The node is draining: it takes no new claims. Use the sandboxes \
             you hold, or ask its operator to end the drain (sandboxctl node uncordon)."
            .to_owned(),
        ("shutting_down", _) => {
            format!("The node at {base} is shutting down; no sandbox is available.")
        }
        ("at_capacity", _) => format!(
            "{message}. Release a sandbox you no longer need (release tool) and try again; \
             node_info shows the node's capacity. The limit is the node's (sandboxd \
             --max-sandboxes), which its operator can raise."
        ),
        ("bad_request", Call::Claim(Some(template))) if message.contains("emplate") => {
            let held = if templates.is_empty() {
                "node_info lists the ones it holds".to_owned()
            } else {
                format!("it holds: {}", templates.join(", "))
            };
            format!(
                "The node at {base} does not hold template {template:?} ({message}); {held}. \
                 Pass one of those, or leave template out for the node's default. To add it, \
                 build it on the node (sandbox-rootfs build --name {template}, with the \
                 node's SANDBOX_HOME) or promote a sandbox to it (promote tool)."
            )
        }
        ("boot_failed", Call::Claim(template)) => format!(
            "Could not start a sandbox from template {:?}: {message}. Check the template name \
             against node_info's templates; if this persists, the node cannot boot VMs right \
             now.",
            template.unwrap_or("(the node's default)")
        ),
        ("not_found", Call::Branch(key)) => format!(
            "Unknown checkpoint {key:?} on the node at {base}. list_checkpoints shows the \
             checkpoints it holds; checkpoint makes one from a running sandbox."
        ),
        ("not_found", Call::DeleteCheckpoint(key)) => format!(
            "Unknown checkpoint {key:?}: it may be deleted already. list_checkpoints shows \
             the checkpoints the node holds."
        ),
        ("in_use", _) => format!(
            "{message}. Release those sandboxes first; list_checkpoints shows what uses each \
             checkpoint."
        ),
        ("not_found" | "gone", Call::Sandbox(tool, id)) => format!(
            "{tool} failed: the node no longer holds sandbox {id:?} ({message}); it reached \
             its deadline or was destroyed. Call create_sandbox for a new one."
        ),
        ("bad_request" | "conflict", _) => format!("{} refused: {message}.", call.tool()),
        _ => format!(
            "{} failed on the node at {base} (HTTP {status}, {code}): {message}.",
            call.tool()
        ),
    };
    ToolError::new(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(status: u16, code: &str, message: &str) -> NodeApiError {
        NodeApiError::Refused {
            status,
            code: code.to_owned(),
            message: message.to_owned(),
        }
    }

    #[test]
    fn codes_get_the_embedded_paths_hints() {
        let base = "http://127.0.0.1:7777";
        let token = node_error(
            base,
            Call::Node("node_info"),
            &refusal(401, "unauthorized", "A valid token is required"),
            &[],
        );
        assert!(token.message.contains("--token"), "{}", token.message);
        let full = node_error(
            base,
            Call::Claim(None),
            &refusal(429, "at_capacity", "All 2 sandboxes are in use"),
            &[],
        );
        assert!(
            full.message.contains("Release a sandbox"),
            "{}",
            full.message
        );
        assert!(full.message.contains("--max-sandboxes"), "{}", full.message);
        let template = node_error(
            base,
            Call::Claim(Some("rt:24.04")),
            &refusal(
                400,
                "bad_request",
                "Template rt:24.04 cannot be used: no such template",
            ),
            &["default".into(), "python".into()],
        );
        assert!(
            template.message.contains("it holds: default, python"),
            "{}",
            template.message
        );
        assert!(
            template
                .message
                .contains("sandbox-rootfs build --name rt:24.04"),
            "{}",
            template.message
        );
        let drain = node_error(
            base,
            Call::Claim(None),
            &refusal(503, "draining", "The node is draining"),
            &[],
        );
        assert!(
            drain.message.starts_with("The node is draining"),
            "{}",
            drain.message
        );
        let in_use = node_error(
            base,
            Call::DeleteCheckpoint("c"),
            &refusal(409, "in_use", "Checkpoint c is in use by sbx-1"),
            &[],
        );
        assert!(
            in_use.message.contains("Release those sandboxes first"),
            "{}",
            in_use.message
        );
    }
}
