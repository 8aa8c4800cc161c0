//! Inputs of the sandstorm tools: sandstorm-mcp's argument names, types and
//! defaults, so a client's calls work unchanged. Arguments that select how
//! sandstorm's controller works (network namespaces, memfd RAM, diff snapshots) are
//! accepted and documented with what they do here. Unknown fields are rejected like
//! everywhere in this server.

use schemars::JsonSchema;
use serde::Deserialize;

/// `spawn_sandboxes`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnSandboxesParams {
    /// A template name or a snapshot tag made by branch_sandbox (list_snapshots shows
    /// both).
    pub snapshot_tag: String,
    /// How many sandboxes (default 1). All are made, or none.
    #[serde(default = "one")]
    pub n: u64,
    /// Refused when true: sandboxes here have no network, so there is no namespace to
    /// give each.
    #[serde(default)]
    pub per_child_netns: bool,
    /// An upper bound on each sandbox's memory in MiB. Each gets its template's (or
    /// snapshot's) memory, which is its VM's hard limit; a bound below that is
    /// refused. Omit to accept it.
    #[serde(default)]
    pub memory_limit_mib: Option<u64>,
    /// Accepted, with nothing to do: sandboxes start ready, and branch_sandbox has no
    /// first-time cost to move to creation.
    #[serde(default)]
    pub prewarm: bool,
    /// Accepted, with nothing to do: every sandbox can be branched.
    #[serde(default)]
    pub live_fork: bool,
}

fn one() -> u64 {
    1
}

/// `branch_sandbox`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchSandboxParams {
    /// The running sandbox to capture (it keeps running).
    pub sandbox_id: String,
    /// Name of the new snapshot: 1-64 letters, digits, '-', '_' or '.', not a
    /// template's name nor one in use. Default `branch-<sandbox_id>-<unix ms>`.
    #[serde(default)]
    pub tag: Option<String>,
    /// "full" writes the sandbox's whole memory; "diff" (the default) and "live"
    /// only what changed since its last snapshot, made whole when first spawned
    /// from (the result's pause_ms says how long the sandbox paused).
    #[serde(default)]
    pub mode: Option<String>,
    /// The same as mode "diff"; not together with mode or measure_diff.
    #[serde(default)]
    pub diff: bool,
    /// Accepted; no diff is measured here. Not together with diff.
    #[serde(default)]
    pub measure_diff: bool,
    /// Accepted: the snapshot is always ready when this returns.
    #[serde(default = "yes")]
    pub wait: bool,
    /// The token spawn_sandboxes returned with this sandbox (required: a snapshot
    /// holds everything the sandbox holds).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

fn yes() -> bool {
    true
}

/// `get_sandbox`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxIdParams {
    /// The sandbox's id, from spawn_sandboxes or list_sandboxes.
    pub sandbox_id: String,
}

/// `kill_sandbox`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillSandboxParams {
    /// The sandbox's id, from spawn_sandboxes or list_sandboxes.
    pub sandbox_id: String,
    /// The token spawn_sandboxes returned with this sandbox (required).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

/// `exec_command`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecCommandParams {
    /// The sandbox's id, from spawn_sandboxes.
    pub sandbox_id: String,
    /// The program and its arguments, run without a shell, like ["python3", "-c",
    /// "print(2+2)"]; or one shell command line as a string, like "ls -l | wc -l",
    /// run with /bin/sh -c (pipes, redirections, variables).
    pub args: CommandArgs,
    /// Seconds before the command is killed with all it started (default 30, at
    /// most 300).
    #[serde(default = "exec_timeout")]
    pub timeout_secs: f64,
    /// The token spawn_sandboxes returned with this sandbox (required).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

fn exec_timeout() -> f64 {
    30.0
}

/// `exec_command`'s `args`: a list, as sandstorm takes it, or a command line, as
/// models often write it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandArgs {
    /// The program and its arguments, run without a shell.
    Argv(Vec<String>),
    /// A shell command line, run with /bin/sh -c.
    Line(String),
}

impl CommandArgs {
    /// What the agent runs; `None` when there is nothing to run (an empty list, an
    /// empty program name, a blank line).
    pub fn into_command(self) -> Option<sandbox_protocol::Command> {
        match self {
            Self::Argv(argv) if argv.first().is_some_and(|program| !program.is_empty()) => {
                Some(sandbox_protocol::Command::Argv(argv))
            }
            Self::Line(line) if !line.trim().is_empty() => {
                Some(sandbox_protocol::Command::Shell(line))
            }
            Self::Argv(_) | Self::Line(_) => None,
        }
    }
}

/// `eval_code`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalCodeParams {
    /// The sandbox's id, from spawn_sandboxes.
    pub sandbox_id: String,
    /// Python code; the value of a last expression is the result. Variables and
    /// imports persist between calls.
    pub code: String,
    /// The token spawn_sandboxes returned with this sandbox (required).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

/// `wait_for_text`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitForTextParams {
    /// The sandbox's id, from spawn_sandboxes.
    pub sandbox_id: String,
    /// Absolute path of the file in the sandbox; it may not exist yet.
    pub path: String,
    /// The exact text to wait for (not a pattern), at most 4096 bytes.
    pub marker: String,
    /// Most seconds to wait (default 60, at most 300).
    #[serde(default = "wait_timeout")]
    pub timeout_secs: f64,
    /// Accepted: the file is watched, not polled, so the text is seen as soon as it
    /// is written.
    #[serde(default = "poll_interval")]
    pub poll_interval_ms: u64,
    /// The token spawn_sandboxes returned with this sandbox (required).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

fn wait_timeout() -> f64 {
    60.0
}

fn poll_interval() -> u64 {
    200
}

/// `ping_sandbox`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PingSandboxParams {
    /// The sandbox's id, from spawn_sandboxes.
    pub sandbox_id: String,
    /// The token spawn_sandboxes returned with this sandbox (required).
    #[serde(default)]
    pub sandbox_token: Option<String>,
}

/// The arguments of a call that reads or ends a sandbox: the sandbox and its token
/// (see [`super::ops::authorized`]). sandstorm requires it for the calls that reach
/// the guest; here `branch_sandbox` (a snapshot is a copy of everything the sandbox
/// holds) and `kill_sandbox` need it too.
pub trait Guarded {
    /// The sandbox's id.
    fn sandbox_id(&self) -> &str;
    /// The token given, if any.
    fn sandbox_token(&self) -> Option<&str>;
}

/// [`Guarded`] for parameters with `sandbox_id` and `sandbox_token` fields.
macro_rules! guarded {
    ($($params:ty),+) => {$(
        impl Guarded for $params {
            fn sandbox_id(&self) -> &str {
                &self.sandbox_id
            }
            fn sandbox_token(&self) -> Option<&str> {
                self.sandbox_token.as_deref()
            }
        }
    )+};
}

guarded!(
    ExecCommandParams,
    EvalCodeParams,
    WaitForTextParams,
    PingSandboxParams,
    BranchSandboxParams,
    KillSandboxParams
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandstorm_calls_parse_with_its_names_and_defaults() {
        let spawn: SpawnSandboxesParams =
            serde_json::from_str(r#"{"snapshot_tag":"python"}"#).unwrap();
        assert_eq!(spawn.n, 1);
        assert!(!spawn.prewarm && !spawn.per_child_netns && !spawn.live_fork);
        let spawn: SpawnSandboxesParams = serde_json::from_str(
            r#"{"snapshot_tag":"python","n":3,"prewarm":true,"memory_limit_mib":256}"#,
        )
        .unwrap();
        assert_eq!((spawn.n, spawn.memory_limit_mib), (3, Some(256)));

        let exec: ExecCommandParams =
            serde_json::from_str(r#"{"sandbox_id":"s","args":["echo","hi"],"sandbox_token":"t"}"#)
                .unwrap();
        assert_eq!(exec.timeout_secs, 30.0);
        assert_eq!(exec.sandbox_token.as_deref(), Some("t"));
        // The token may be left out at parse time: the tool refuses it, saying why.
        let exec: ExecCommandParams =
            serde_json::from_str(r#"{"sandbox_id":"s","args":["id"],"timeout_secs":5}"#).unwrap();
        assert!(exec.sandbox_token.is_none());

        let wait: WaitForTextParams =
            serde_json::from_str(r#"{"sandbox_id":"s","path":"/tmp/o","marker":"READY"}"#).unwrap();
        assert_eq!((wait.timeout_secs, wait.poll_interval_ms), (60.0, 200));

        let branch: BranchSandboxParams = serde_json::from_str(r#"{"sandbox_id":"s"}"#).unwrap();
        assert!(branch.wait && branch.tag.is_none() && branch.mode.is_none());
        assert!(branch.sandbox_token.is_none());

        // Where seed 001's clients put a token: `sandbox_token`, beside `sandbox_id`.
        let branch: BranchSandboxParams =
            serde_json::from_str(r#"{"sandbox_id":"s","tag":"t","sandbox_token":"k"}"#).unwrap();
        assert_eq!(branch.sandbox_token(), Some("k"));
        let kill: KillSandboxParams =
            serde_json::from_str(r#"{"sandbox_id":"s","sandbox_token":"k"}"#).unwrap();
        assert_eq!((kill.sandbox_id(), kill.sandbox_token()), ("s", Some("k")));
        let kill: KillSandboxParams = serde_json::from_str(r#"{"sandbox_id":"s"}"#).unwrap();
        assert!(kill.sandbox_token.is_none());
    }

    /// Regression: `args` as a string failed to deserialize.
    #[test]
    fn exec_args_are_a_list_or_a_shell_command_line() {
        use sandbox_protocol::Command;
        let args = |json: &str| {
            serde_json::from_str::<ExecCommandParams>(&format!(
                r#"{{"sandbox_id":"s","args":{json}}}"#
            ))
            .map(|params| params.args.into_command())
        };
        assert_eq!(
            args(r#"["echo","a b"]"#).unwrap(),
            Some(Command::Argv(vec!["echo".into(), "a b".into()]))
        );
        assert_eq!(
            args(r#""ls -l | wc -l""#).unwrap(),
            Some(Command::Shell("ls -l | wc -l".into()))
        );
        assert_eq!(args("[]").unwrap(), None);
        assert_eq!(args(r#"[""]"#).unwrap(), None);
        assert_eq!(args(r#""  ""#).unwrap(), None);
        assert!(args("42").is_err());
    }

    #[test]
    fn misspelt_arguments_are_refused() {
        let err = serde_json::from_str::<ExecCommandParams>(
            r#"{"sandbox_id":"s","argv":["id"],"sandbox_token":"t"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("argv"), "{err}");
        let err = serde_json::from_str::<SpawnSandboxesParams>(r#"{"snapshot_tag":"p","count":2}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("count"), "{err}");
    }
}
