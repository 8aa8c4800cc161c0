//! The input layout of `frame_decode`: a small header, then the byte stream.
//!
//! The header comes first and has a fixed size so that a seed is just a header
//! followed by real frames, and the fuzzer's mutations of the stream never shift
//! the header's meaning.

use arbitrary::{Arbitrary, Unstructured};

/// Bytes of header before the stream.
pub const HEADER_BYTES: usize = 8;

/// Which frame type the stream is decoded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Frames a client sends (the agent decodes them).
    Client,
    /// Frames an agent sends (the client decodes them).
    Agent,
}

/// How one input is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The frame type.
    pub side: Side,
    /// The decoder's body limit: small ones reach the oversize path quickly.
    pub max: usize,
    /// Lengths of the successive reads, cycled; 0 means "everything left".
    pub reads: [u8; 5],
}

impl Plan {
    /// Splits `data` into its plan and its stream. Short inputs get a default plan.
    pub fn parse(data: &[u8]) -> (Self, &[u8]) {
        let (header, stream) = data.split_at(data.len().min(HEADER_BYTES));
        let mut u = Unstructured::new(header);
        let side = match bool::arbitrary(&mut u) {
            Ok(true) => Side::Agent,
            _ => Side::Client,
        };
        // Half the inputs use the real limit, the rest a tiny one.
        let max = match u16::arbitrary(&mut u).unwrap_or(0) {
            choice if choice & 1 == 0 => sandbox_protocol::limits::MAX_FRAME_BYTES,
            choice => usize::from(choice >> 1) % 256,
        };
        let reads = <[u8; 5]>::arbitrary(&mut u).unwrap_or([0; 5]);
        (Self { side, max, reads }, stream)
    }

    /// The header that [`Self::parse`] reads back as this plan (`max` must be the
    /// real limit or under 256).
    pub fn header(&self) -> [u8; HEADER_BYTES] {
        let side = match self.side {
            Side::Client => 0,
            Side::Agent => 1,
        };
        let max: u16 = if self.max == sandbox_protocol::limits::MAX_FRAME_BYTES {
            0
        } else {
            let small = u16::try_from(self.max % 256).unwrap_or(0);
            (small << 1) | 1
        };
        let [lo, hi] = max.to_le_bytes();
        let r = self.reads;
        [side, lo, hi, r[0], r[1], r[2], r[3], r[4]]
    }

    /// The stream cut into reads as the plan says.
    pub fn reads<'a>(&self, mut stream: &'a [u8]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        for &len in self.reads.iter().cycle() {
            if stream.is_empty() {
                break;
            }
            let len = if len == 0 {
                stream.len()
            } else {
                usize::from(len).min(stream.len())
            };
            let (read, rest) = stream.split_at(len);
            out.push(read);
            stream = rest;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_parses_back_to_its_plan() {
        for plan in [
            Plan {
                side: Side::Agent,
                max: 17,
                reads: [1, 2, 3, 0, 5],
            },
            Plan {
                side: Side::Client,
                max: sandbox_protocol::limits::MAX_FRAME_BYTES,
                reads: [0; 5],
            },
        ] {
            let header = plan.header();
            assert_eq!(Plan::parse(&header).0, plan);
        }
    }
}
