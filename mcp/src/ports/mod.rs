//! `expose_port`: a URL that reaches a server the agent started in a sandbox (a dev
//! server, Jupyter, an API under test).
//!
//! # Two backends, two answers
//! - Through a node daemon: the node's preview URL (`POST /v1/sandboxes/{id}/preview`),
//!   `http(s)://NODE/preview/{secret}/`, which anyone holding it can open with a
//!   plain HTTP client; it proxies HTTP and WebSocket upgrades and ends with the claim
//!   or its TTL.
//! - Embedded (sandboxes in this process): a TCP listener on this machine's
//!   `127.0.0.1`, any free port, whose every connection is piped to the guest port
//!   ([`sandbox_vmm::Client::dial_port`]), so any protocol works, not only HTTP. It
//!   lives until the sandbox ends (release, deadline, session end) or its TTL, and is
//!   reached only from this machine. [`Exposed`] holds these listeners: one per
//!   sandbox and port (asking again returns the same URL), at most
//!   [`MAX_EXPOSED_PER_SANDBOX`] per sandbox.
//!
//! # Layout
//! - [`forward`]: the embedded listeners.
//! - [`tools`]: the tool, its parameters and its result.

pub mod forward;
pub mod tools;

pub use forward::{Exposed, MAX_EXPOSED_PER_SANDBOX};
