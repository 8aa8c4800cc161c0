//! A fleet of sandbox nodes sharing one etcd.
//!
//! - [`membership`]: each node's record under a lease it keeps alive, the owner
//!   records of its claimed sandboxes, and the "lost" rule for sandboxes whose node
//!   vanished.

pub mod membership;
