//! The session's sandboxes as a fleet: many claimed in one call, listed, looked at,
//! pinged; and the templates they come from. Tools of the default profile
//! (`create_sandboxes`, `list_sandboxes`, `get_sandbox`, `ping_sandbox`,
//! `list_templates`), and the engine `--profile sandstorm` uses for the same work
//! (`crate::sandstorm`).
//!
//! # How data flows
//! [`tools`] is a third tool router on [`crate::tools::SandboxServer`]: each tool
//! checks its arguments ([`params`]) and calls an operation of the node ([`ops`]),
//! which answers with engine values (sandboxes, a [`ops::Ping`], [`ops::TemplateEntry`]
//! rows) that [`render`] turns into this profile's results. Failures of a batch are a
//! typed [`BatchError`], so each profile says in its own words which tool to call
//! next.
//!
//! # A batch
//! `create_sandboxes` is all or nothing: the room for every VM is checked before
//! anything is claimed, warm VMs are taken first and the rest boot (or restore from
//! the template's ready snapshot) side by side ([`sandbox_engine::pool::Pool::claim_many`]);
//! one failed boot fails the batch with nothing kept. Each sandbox is then like one
//! from `create_sandbox`: own id and token, its TTL, destroyed with the session.
//!
//! Branching a running sandbox into N is `fork` (`count` up to `--max-fork-count`):
//! no second tool does it.
//!
//! # Layout
//! - the operations are the engine's (`sandbox_engine::batch`).
//! - [`tools`], [`params`], [`render`]: the default profile's tools, inputs, outputs.

pub mod params;
pub mod render;
pub mod tools;
