//! Read buffers for output chunks, reused while output flows.
//!
//! musl's allocator maps a buffer of tens of KiB afresh and unmaps it once it is
//! freed, so every chunk read from a busy pipe landed in fresh pages: a page fault
//! per 4 KiB of output, dear under TCG (about 5,800 in PID 1 per 20 MiB streamed).
//! A chunk's buffer comes back to [`OUTPUT_BUFFERS`] once its bytes are in the ring
//! (an exec that captures) or encoded for the client (a streaming one, see the
//! connection's writer), and the next read takes it again. The spares are dropped
//! once none was taken or given back for [`KEEP_WHILE_QUIET`]: an idle agent holds
//! none.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::pump::READ_BYTES;

/// The agent's output buffers.
pub static OUTPUT_BUFFERS: BufferPool = BufferPool::new();

/// Reads of at least this many bytes get a pooled buffer of [`READ_BYTES`];
/// smaller ones a buffer of their own size (a chatty writer's few bytes need no
/// 64 KiB, and small allocations come from musl's slots, not fresh mappings).
pub const POOLED_FROM: usize = 8 * 1024;

/// Spares kept: a streaming exec's queue and a batch of its frames.
const SPARES: usize = 16;

/// How long spares are kept without use.
const KEEP_WHILE_QUIET: Duration = Duration::from_millis(100);

/// Spare buffers of [`READ_BYTES`], kept while they are in use.
#[derive(Debug)]
pub struct BufferPool(Mutex<Spares>);

#[derive(Debug)]
struct Spares {
    buffers: Vec<Vec<u8>>,
    last_used: Option<Instant>,
    /// A task drops the buffers once the pool goes quiet.
    sweeping: bool,
}

impl BufferPool {
    /// An empty pool.
    pub const fn new() -> Self {
        Self(Mutex::new(Spares {
            buffers: Vec::new(),
            last_used: None,
            sweeping: false,
        }))
    }

    fn spares(&self) -> MutexGuard<'_, Spares> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An empty buffer with room for at least `len` bytes: a spare when `len` is
    /// at least [`POOLED_FROM`] (and at most [`READ_BYTES`]) and one is there.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if !(POOLED_FROM..=READ_BYTES).contains(&len) {
            return Vec::with_capacity(len);
        }
        let mut spares = self.spares();
        spares.last_used = Some(Instant::now());
        spares
            .buffers
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(READ_BYTES))
    }

    /// Takes `buffer` back for a later [`Self::take`] when it is one of the pool's
    /// (a capacity of [`READ_BYTES`]) and there is room; else frees it.
    pub fn give_back(&'static self, mut buffer: Vec<u8>) {
        if buffer.capacity() != READ_BYTES {
            return;
        }
        let sweep = {
            let mut spares = self.spares();
            if spares.buffers.len() >= SPARES {
                return;
            }
            buffer.clear();
            spares.buffers.push(buffer);
            spares.last_used = Some(Instant::now());
            !std::mem::replace(&mut spares.sweeping, true)
        };
        if sweep {
            self.start_sweeper();
        }
    }

    /// Drops the spares once the pool has been quiet for [`KEEP_WHILE_QUIET`].
    /// Outside a runtime they are dropped at once.
    fn start_sweeper(&'static self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.drop_spares();
            return;
        };
        runtime.spawn(async move {
            let mut wait = KEEP_WHILE_QUIET;
            loop {
                tokio::time::sleep(wait).await;
                let quiet_for = {
                    let spares = self.spares();
                    spares.last_used.map_or(KEEP_WHILE_QUIET, |at| at.elapsed())
                };
                if quiet_for >= KEEP_WHILE_QUIET {
                    self.drop_spares();
                    return;
                }
                wait = KEEP_WHILE_QUIET - quiet_for;
            }
        });
    }

    fn drop_spares(&self) {
        let buffers = {
            let mut spares = self.spares();
            spares.sweeping = false;
            std::mem::take(&mut spares.buffers)
        };
        drop(buffers);
    }

    /// Spare buffers held now.
    #[cfg(test)]
    fn spare_count(&self) -> usize {
        self.spares().buffers.len()
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> &'static BufferPool {
        Box::leak(Box::new(BufferPool::new()))
    }

    #[tokio::test]
    async fn a_buffer_given_back_is_taken_again_and_dropped_once_quiet() {
        let pool = pool();
        let mut first = pool.take(READ_BYTES);
        assert_eq!(first.capacity(), READ_BYTES);
        first.extend_from_slice(b"output");
        let address = first.as_ptr();
        pool.give_back(first);
        assert_eq!(pool.spare_count(), 1);
        let again = pool.take(POOLED_FROM);
        assert_eq!(again.as_ptr(), address, "the spare is reused");
        assert!(again.is_empty(), "a spare comes back empty");
        pool.give_back(again);

        // Kept while in use: each take or give-back puts the sweep off.
        for _ in 0..3 {
            tokio::time::sleep(KEEP_WHILE_QUIET / 2).await;
            let buffer = pool.take(READ_BYTES);
            pool.give_back(buffer);
            assert_eq!(pool.spare_count(), 1);
        }
        tokio::time::sleep(KEEP_WHILE_QUIET * 3).await;
        assert_eq!(pool.spare_count(), 0, "dropped once quiet");
    }

    #[tokio::test]
    async fn small_and_foreign_buffers_are_not_kept() {
        let pool = pool();
        let small = pool.take(100);
        assert!(small.capacity() < POOLED_FROM);
        pool.give_back(small);
        pool.give_back(Vec::with_capacity(READ_BYTES * 2));
        assert_eq!(pool.spare_count(), 0);
        for _ in 0..SPARES + 3 {
            pool.give_back(Vec::with_capacity(READ_BYTES));
        }
        assert_eq!(pool.spare_count(), SPARES);
    }
}
