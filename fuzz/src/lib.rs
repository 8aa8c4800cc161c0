//! Helpers shared by the fuzz targets and the seed generator.
//!
//! # Layout
//! - [`stream_split`]: the header that tells `frame_decode` which frame type to decode,
//!   which limit to use and how to cut the stream into reads.
//! - [`round_trip`]: decode → encode → decode must be stable, for any frame type.
//! - [`scratch`]: rewrites request paths so the `agent_dispatch` target can only ever
//!   touch a scratch directory.
//! - [`seeds`]: valid frames of every request kind, for the committed corpus.
//!
//! Everything here panics on a broken invariant on purpose: a panic is how a fuzz
//! target reports a finding.

pub mod round_trip;
pub mod scratch;
pub mod seeds;
pub mod stream_split;
