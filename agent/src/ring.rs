//! The per-process output ring: the newest [`RING_BYTES`] of a process's output, with
//! the stream each byte came from and absolute offsets that only grow.
//!
//! Bytes live in a `VecDeque<u8>` that grows on demand up to the capacity and then
//! wraps (old bytes are dropped from the front), so a quiet process costs nothing.
//! A ring of the process table grows only as far as the [`RingPool`] grants, and
//! wraps early when the pool is spent.
//! Stream boundaries live beside them as marks: a mark says "from this absolute offset
//! on, bytes came from this stream", and consecutive writes of one stream share a mark.
//!
//! [`RING_BYTES`]: sandbox_protocol::limits::RING_BYTES

use std::collections::VecDeque;

use sandbox_protocol::{LogsBatch, OutputChunk, Stream};

use crate::ring_pool::{RingPool, RING_FLOOR_BYTES};

/// Where a run of same-stream bytes begins.
#[derive(Debug, Clone, Copy)]
struct StreamMark {
    stream: Stream,
    offset: u64,
}

/// A cursor past the end of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Cursor {cursor} is past the end of the output ({end})")]
pub struct CursorAhead {
    /// The cursor asked for.
    pub cursor: u64,
    /// The current end.
    pub end: u64,
}

/// Output of one process; see the module docs.
#[derive(Debug)]
pub struct OutputRing {
    capacity: usize,
    /// Bytes the ring may hold now: `capacity`, or for a pooled ring what its pool
    /// granted so far.
    window: usize,
    pool: Option<RingPool>,
    bytes: VecDeque<u8>,
    /// Absolute offset of `bytes[0]`.
    start: u64,
    /// Stream runs covering `start..end`, oldest first; `marks[0].offset <= start`.
    marks: VecDeque<StreamMark>,
}

impl OutputRing {
    /// An empty ring that will hold at most `capacity` bytes. Allocates nothing yet.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            window: capacity,
            pool: None,
            bytes: VecDeque::new(),
            start: 0,
            marks: VecDeque::new(),
        }
    }

    /// An empty ring of at most `capacity` bytes that takes its memory from `pool`
    /// as it grows.
    pub fn pooled(capacity: usize, pool: RingPool) -> Self {
        let mut ring = Self::new(capacity);
        ring.window = 0;
        ring.pool = Some(pool);
        ring
    }

    /// Absolute offset of the oldest byte held.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Absolute offset one past the newest byte: the total ever written.
    pub fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// Appends `data` from `stream`, dropping the oldest bytes past the capacity.
    pub fn push(&mut self, stream: Stream, data: &[u8]) {
        if data.is_empty() || self.capacity == 0 {
            self.start += data.len() as u64;
            return;
        }
        self.grow_for(data.len());
        let old_end = self.end();
        let new_end = old_end + data.len() as u64;
        let new_start = self.start.max(new_end.saturating_sub(self.window as u64));

        // Drop what falls out of the window: first held bytes, then (if `data` alone
        // is larger than the ring) the head of `data` itself.
        let drop_held = usize::try_from(new_start - self.start)
            .unwrap_or(usize::MAX)
            .min(self.bytes.len());
        self.bytes.drain(..drop_held);
        let skip_new = usize::try_from(new_start.saturating_sub(old_end)).unwrap_or(data.len());
        self.bytes.extend(&data[skip_new..]);
        self.start = new_start;

        // Record the stream of the new bytes unless the last run is the same stream.
        if self.marks.back().map(|mark| mark.stream) != Some(stream) {
            self.marks.push_back(StreamMark {
                stream,
                offset: old_end.max(new_start),
            });
        }
        // Forget runs that now lie wholly before the window.
        while self.marks.len() > 1 && self.marks[1].offset <= new_start {
            self.marks.pop_front();
        }
    }

    /// Widens a pooled ring's window for `incoming` bytes as far as its pool grants,
    /// in doubling steps (so that many small writes do not each reallocate), and
    /// reserves exactly the window.
    fn grow_for(&mut self, incoming: usize) {
        let Some(pool) = &self.pool else {
            return;
        };
        let wanted = self.bytes.len().saturating_add(incoming).min(self.capacity);
        if wanted <= self.window {
            return;
        }
        let target = wanted
            .max(self.window.saturating_mul(2))
            .max(RING_FLOOR_BYTES)
            .min(self.capacity);
        let growth = target - self.window;
        let floor = RING_FLOOR_BYTES.saturating_sub(self.window).min(growth);
        self.window += pool.grant(floor, growth - floor);
        let room = self.window.min(wanted);
        if self.bytes.capacity() < room {
            self.bytes
                .reserve_exact(self.window.saturating_sub(self.bytes.len()));
        }
    }

    /// Everything from `cursor` to the end, as chunks, with the bytes between `cursor`
    /// and the window counted as dropped. No cursor means offset 0, so a first read
    /// learns how much output was lost before the window.
    pub fn read_from(&self, cursor: Option<u64>) -> Result<LogsBatch, CursorAhead> {
        let end = self.end();
        let from = cursor.unwrap_or(0);
        if from > end {
            return Err(CursorAhead { cursor: from, end });
        }
        let pos = from.max(self.start);
        let mut chunks = Vec::new();
        for (i, mark) in self.marks.iter().enumerate() {
            let run_end = self.marks.get(i + 1).map_or(end, |next| next.offset);
            let run_start = mark.offset.max(pos);
            if run_start >= run_end {
                continue;
            }
            chunks.push(OutputChunk {
                stream: mark.stream,
                offset: run_start,
                data: self.slice(run_start, run_end),
            });
        }
        Ok(LogsBatch {
            chunks,
            dropped: pos - from,
            end,
        })
    }

    /// Copies absolute range `from..to`, which must lie within the window.
    fn slice(&self, from: u64, to: u64) -> Vec<u8> {
        let lo = usize::try_from(from - self.start).unwrap_or(0);
        let hi = usize::try_from(to - self.start).unwrap_or(0);
        self.bytes.range(lo..hi).copied().collect()
    }

    /// Drops every byte held and frees the memory; offsets keep counting, so
    /// readers see the discarded bytes as dropped.
    pub fn discard_all(&mut self) {
        self.start = self.end();
        self.bytes = VecDeque::new();
        self.marks.clear();
        self.return_window();
    }

    /// Gives a pooled ring's window back to its pool.
    fn return_window(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give_back(self.window);
            self.window = 0;
        }
    }

    /// Bytes of memory the ring has reserved (for tests and accounting).
    pub fn reserved_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

impl Drop for OutputRing {
    fn drop(&mut self) {
        self.return_window();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(batch: &LogsBatch) -> Vec<(Stream, u64, String)> {
        batch
            .chunks
            .iter()
            .map(|c| {
                (
                    c.stream,
                    c.offset,
                    String::from_utf8_lossy(&c.data).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn keeps_stream_order_and_merges_same_stream_writes() {
        let mut ring = OutputRing::new(64);
        ring.push(Stream::Stdout, b"a");
        ring.push(Stream::Stdout, b"b");
        ring.push(Stream::Stderr, b"E");
        ring.push(Stream::Stdout, b"c");
        let batch = ring.read_from(None).unwrap();
        assert_eq!(
            text(&batch),
            vec![
                (Stream::Stdout, 0, "ab".into()),
                (Stream::Stderr, 2, "E".into()),
                (Stream::Stdout, 3, "c".into())
            ]
        );
        assert_eq!((batch.dropped, batch.end), (0, 4));
    }

    #[test]
    fn a_pooled_ring_grows_as_far_as_its_pool_grants_then_wraps() {
        let pool = RingPool::new(20_000);
        let mut ring = OutputRing::pooled(64 * 1024, pool.clone());
        assert_eq!(pool.available(), 20_000, "an empty ring takes nothing");
        ring.push(Stream::Stdout, &[b'a'; 10_000]);
        assert_eq!(pool.available(), 10_000);
        // Wants 30 kB; gets the 10 kB left and wraps at 20 kB.
        ring.push(Stream::Stdout, &[b'b'; 20_000]);
        assert_eq!(pool.available(), 0);
        assert_eq!((ring.start(), ring.end()), (10_000, 30_000));
        assert!(ring.reserved_bytes() <= 20_000);
        let batch = ring.read_from(None).unwrap();
        assert_eq!(batch.dropped, 10_000);
        // Another ring still gets its floor from the empty pool.
        let mut other = OutputRing::pooled(64 * 1024, pool.clone());
        other.push(Stream::Stderr, &[b'c'; 10_000]);
        assert_eq!(
            (other.start(), other.end()),
            (10_000 - RING_FLOOR_BYTES as u64, 10_000)
        );
        drop(ring);
        other.discard_all();
        assert_eq!(pool.available(), 20_000, "both windows went back");
    }

    #[test]
    fn wrap_drops_oldest_and_reports_it() {
        let mut ring = OutputRing::new(4);
        ring.push(Stream::Stdout, b"012");
        ring.push(Stream::Stderr, b"345");
        assert_eq!((ring.start(), ring.end()), (2, 6));
        let batch = ring.read_from(Some(0)).unwrap();
        assert_eq!(batch.dropped, 2);
        assert_eq!(
            text(&batch),
            vec![
                (Stream::Stdout, 2, "2".into()),
                (Stream::Stderr, 3, "345".into())
            ]
        );
    }

    #[test]
    fn a_write_larger_than_the_ring_keeps_its_tail() {
        let mut ring = OutputRing::new(4);
        ring.push(Stream::Stdout, b"ab");
        ring.push(Stream::Stderr, b"0123456789");
        assert_eq!((ring.start(), ring.end()), (8, 12));
        let batch = ring.read_from(Some(1)).unwrap();
        assert_eq!(batch.dropped, 7);
        assert_eq!(text(&batch), vec![(Stream::Stderr, 8, "6789".into())]);
    }

    #[test]
    fn cursor_reads_resume_without_gaps_or_duplicates() {
        let mut ring = OutputRing::new(8);
        let mut seen = Vec::new();
        let mut cursor = 0;
        for i in 0..100u8 {
            ring.push(
                if i % 3 == 0 {
                    Stream::Stderr
                } else {
                    Stream::Stdout
                },
                &[i, i],
            );
            let batch = ring.read_from(Some(cursor)).unwrap();
            assert_eq!(batch.dropped, 0);
            for chunk in &batch.chunks {
                assert_eq!(chunk.offset, cursor + (seen.len() as u64 - cursor));
                seen.extend_from_slice(&chunk.data);
            }
            cursor = batch.end;
        }
        let expected: Vec<u8> = (0..100u8).flat_map(|i| [i, i]).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn delivered_plus_dropped_always_equals_the_distance_read() {
        let mut ring = OutputRing::new(10);
        for (i, len) in [3usize, 7, 1, 12, 5, 9, 2].into_iter().enumerate() {
            let stream = if i % 2 == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            ring.push(stream, &vec![b'x'; len]);
            for cursor in 0..=ring.end() {
                let batch = ring.read_from(Some(cursor)).unwrap();
                let delivered: u64 = batch.chunks.iter().map(|c| c.data.len() as u64).sum();
                assert_eq!(batch.dropped + delivered, ring.end() - cursor);
                assert!(ring.reserved_bytes() <= 2 * 10 + 16);
            }
        }
    }

    #[test]
    fn cursor_past_the_end_is_an_error() {
        let mut ring = OutputRing::new(8);
        ring.push(Stream::Stdout, b"abc");
        assert_eq!(
            ring.read_from(Some(4)),
            Err(CursorAhead { cursor: 4, end: 3 })
        );
    }

    #[test]
    fn an_unused_ring_allocates_nothing() {
        let ring = OutputRing::new(256 * 1024);
        assert_eq!(ring.reserved_bytes(), 0);
    }
}
