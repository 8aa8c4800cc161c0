//! Snapshots of sandboxes as tools: `fork`, `checkpoint`, `branch_checkpoint`,
//! `list_checkpoints`, `delete_checkpoint`, `hibernate` and `promote`, over the
//! engine's snapshot operations (`sandbox_engine::snapshot`).
//!
//! # How data flows
//! [`tools`] is a second tool router on [`crate::tools::SandboxServer`]: each tool
//! checks its arguments ([`params`]), calls an operation of the node, and turns its
//! domain result into a [`render`] type. Failures become `isError` results whose hint
//! names the tool to call next ([`errors`]).
//!
//! # What belongs to whom
//! - **Fork and branch children** are sandboxes of this session like any claim: own
//!   ids and agent tokens, a one-hour deadline, destroyed with the session.
//! - **Checkpoints** are the host's (`SANDBOX_HOME/checkpoints`): they outlive the
//!   session and the server, and `branch_checkpoint` takes any id or name the store
//!   holds, whoever made it.
//! - **Promoted templates** are the host's (`SANDBOX_HOME/templates/NAME`).
//! - **Hibernation** is a state of the sandbox: the tool that next reaches the guest,
//!   whichever it is, wakes it.

pub mod errors;
pub mod params;
pub mod render;
pub mod tools;
