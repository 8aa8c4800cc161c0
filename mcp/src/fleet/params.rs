//! Inputs of the fleet tools. Like [`crate::params`]: unknown fields are rejected,
//! and each field's doc is what a model reads before calling. `get_sandbox` and
//! `ping_sandbox` take [`crate::params::SandboxParams`].

use schemars::JsonSchema;
use serde::Deserialize;

use crate::params::{Net, SizeName};

/// `create_sandboxes`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxesParams {
    /// How many sandboxes: at least 1, at most the server's sandbox limit
    /// (list_sandboxes and node_info show how many more fit). All are made, or
    /// none.
    pub count: u64,
    /// Template for all of them (list_templates shows them). Omit for the server's
    /// default, which is kept warm.
    #[serde(default)]
    pub template: Option<String>,
    /// VM size for all of them: small, medium, large, xlarge or 2xlarge; default the
    /// template's.
    #[serde(default)]
    pub size: Option<SizeName>,
    /// Network access: "none" (default). For "egress" use create_sandbox, one at a
    /// time.
    #[serde(default)]
    pub net: Net,
    /// Lifetime of each, in seconds; 0 or omitted means one hour, at most 86400.
    /// Nothing renews it.
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// `egress_log`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressLogParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Only the last N records (default 100, at most 1000).
    #[serde(default)]
    pub tail: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_needs_a_count_and_rejects_misspelt_fields() {
        let params: CreateSandboxesParams = serde_json::from_str(r#"{"count":3}"#).unwrap();
        assert_eq!((params.count, params.ttl_seconds), (3, 0));
        assert!(params.template.is_none() && params.size.is_none());
        let missing = serde_json::from_str::<CreateSandboxesParams>("{}")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("count"), "{missing}");
        let misspelt = serde_json::from_str::<CreateSandboxesParams>(r#"{"count":2,"n":2}"#)
            .unwrap_err()
            .to_string();
        assert!(misspelt.contains('n'), "{misspelt}");
    }
}
