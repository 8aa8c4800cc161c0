//! A fleet of sandbox nodes sharing one etcd and one object store.
//!
//! - [`membership`]: each node's record under a lease it keeps alive, the owner
//!   records of its claimed sandboxes, the "lost" rule for sandboxes whose node
//!   vanished, and the durable records of checkpoints in the store.
//! - [`placement`]: which node a claim goes to (the freer of two sampled nodes that
//!   can take it, preferring one that holds what it needs).
//! - [`store`]: checkpoints in an S3-compatible object store: content-addressed,
//!   compressed blobs of their files' allocated runs, and a manifest written last;
//!   downloads checked blob by blob against their digests.

pub mod membership;
pub mod placement;
pub mod store;
