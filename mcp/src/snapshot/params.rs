//! Inputs of the snapshot tools. Like [`crate::params`]: unknown fields are rejected,
//! and each field's doc is what a model reads before calling. `hibernate` takes
//! [`crate::params::SandboxParams`].

use schemars::JsonSchema;
use serde::Deserialize;

/// `fork`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkParams {
    /// The sandbox to fork, as returned by create_sandbox (it keeps running).
    pub sandbox_id: String,
    /// How many children: 1 (the default) up to the server's max_fork_count
    /// (default 16), and each needs room within the server's sandbox limit
    /// (node_info shows capacity). All are made, or none.
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

/// `checkpoint`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointParams {
    /// The sandbox to capture, as returned by create_sandbox (it keeps running).
    pub sandbox_id: String,
    /// A name to find the checkpoint by, besides its id: unique on this host, 1-64
    /// letters, digits, '-', '_' or '.'.
    #[serde(default)]
    pub name: Option<String>,
}

/// `branch_checkpoint` and `delete_checkpoint`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointIdParams {
    /// A checkpoint_id (or name) from checkpoint or list_checkpoints; one made in an
    /// earlier session works too.
    pub checkpoint_id: String,
}

/// `promote`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteParams {
    /// The sandbox whose current state becomes the template (it keeps running).
    pub sandbox_id: String,
    /// The template's name, for create_sandbox's template: 1-64 letters, digits,
    /// '-', '_' or '.'. A template promoted earlier under this name is replaced;
    /// built templates (and the server's default) cannot be.
    pub template: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_makes_one_child_unless_told_and_misspelt_fields_fail() {
        let params: ForkParams = serde_json::from_str(r#"{"sandbox_id":"s"}"#).unwrap();
        assert_eq!(params.count, 1);
        let err = serde_json::from_str::<ForkParams>(r#"{"sandbox_id":"s","children":2}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("children"), "{err}");
        let err = serde_json::from_str::<PromoteParams>(r#"{"sandbox_id":"s","name":"t"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("name"), "{err}");
    }
}
