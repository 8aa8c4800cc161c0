//! `--profile sandstorm`: sandstorm-mcp's tool set (seed 001) on this server's
//! engine, so a client configured for sandstorm-mcp works by changing only the
//! command in its `.mcp.json`.
//!
//! # What each tool is here
//! | sandstorm tool | engine |
//! | --- | --- |
//! | `list_snapshots` | the templates ([`Node::template_entries`]) and the checkpoints |
//! | `spawn_sandboxes(snapshot_tag, n)` | a template: a batch of claims ([`Node::claim_batch`]); a snapshot: [`Node::branch_into`] |
//! | `branch_sandbox(sandbox_id, tag)` | a named checkpoint ([`Node::checkpoint`]), kept on the host |
//! | `list_sandboxes`, `get_sandbox` | the registry, without tokens |
//! | `exec_command(args)` | the streamed exec ([`crate::exec`]) of an argv |
//! | `eval_code(code)` | the `default` Python session, restarted if it died |
//! | `wait_for_text(path, marker)` | the agent's file watch |
//! | `ping_sandbox` | the agent's `info` ([`Node::ping`]) |
//! | `kill_sandbox` | release |
//!
//! sandstorm's `branch_sandbox` makes a snapshot tag, and `spawn_sandboxes` of that
//! tag fans it out into N children that start from the source's state: here the tag
//! is a checkpoint's name, so the two calls do exactly that (a default-profile `fork`
//! does both at once).
//!
//! # Tokens
//! Every sandbox has its own random token ([`sandbox_engine::token`]). `spawn_sandboxes`
//! returns it next to each id, once; `list_sandboxes` and `get_sandbox` never show
//! it. Every tool that reads or ends a sandbox requires it as `sandbox_token`
//! ([`ops::authorized`]): `exec_command`, `eval_code`, `wait_for_text` and
//! `ping_sandbox`, as in sandstorm, and, stricter than sandstorm, `branch_sandbox`
//! (its snapshot holds the sandbox's memory and files, and `spawn_sandboxes` of the
//! tag hands them out under new tokens) and `kill_sandbox`. A missing or wrong one
//! is an `isError` result, the token compared in constant time. `get_sandbox` takes
//! none: it shows what `list_sandboxes` shows. sandstorm's API bearer
//! (`SANDSTORM_TOKEN`) has no counterpart: this server speaks only to the client
//! that started it, over stdio.
//!
//! # Results
//! Shaped as sandstorm-mcp's reach a client ([`render`]): an object is the
//! structured content and its JSON the text; a list is `{"result": [...]}` with one
//! JSON text block per item.
//!
//! # Layout
//! - this file: the instructions and the constants.
//! - [`tools`]: the router (`sandstorm_router`), one method per tool.
//! - [`ops`]: spawn, branch, list, kill, and the token check.
//! - [`guest`]: exec, eval, wait, ping.
//! - [`params`], [`render`], [`errors`]: inputs, outputs, failures in this
//!   profile's words.

pub mod errors;
pub mod guest;
pub mod node;
pub mod ops;
pub mod params;
pub mod render;
pub mod tools;

#[cfg(doc)]
use sandbox_engine::node::Node;

/// How long `eval_code` lets code run before interrupting it: sandstorm-mcp's
/// default per-request timeout (`SANDSTORM_HTTP_TIMEOUT`), which its clients expect.
pub const EVAL_TIMEOUT_SECS: u64 = 60;

/// How much of the file `wait_for_text` returns when the marker did not appear.
pub const EXCERPT_BYTES: usize = 256;

/// What the server tells the model at initialization under this profile.
pub const INSTRUCTIONS: &str = "Sandboxes are disposable Linux microVMs for running untrusted \
code, with no network. list_snapshots shows the templates and snapshots to start from; \
spawn_sandboxes(snapshot_tag, n) starts n sandboxes and returns each id with its token. Keep \
the tokens: exec_command (an argv list), eval_code (Python, state kept between calls), \
wait_for_text, ping_sandbox, branch_sandbox and kill_sandbox require sandbox_token, and no \
other tool shows it again. branch_sandbox captures a running sandbox as a new snapshot tag \
that spawn_sandboxes fans out into sandboxes starting from that state. kill_sandbox destroys one; each lives at most one \
hour, and all are destroyed when this session ends (snapshots are kept).";
