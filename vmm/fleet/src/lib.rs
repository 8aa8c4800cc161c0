//! A fleet of sandbox nodes sharing one etcd.
//!
//! - [`membership`]: each node's record under a lease it keeps alive, the owner
//!   records of its claimed sandboxes, and the "lost" rule for sandboxes whose node
//!   vanished.
//! - [`placement`]: which node a claim goes to (the freer of two sampled nodes that
//!   can take it, preferring one that holds what it needs).

pub mod membership;
pub mod placement;
