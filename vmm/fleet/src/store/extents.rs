//! The allocated regions of a sparse file, and how they are packed into blobs.
//!
//! A checkpoint's RAM image is a sparse file the size of the guest's RAM (512 MiB
//! for the default template) of which the guest touched ~70 MiB, scattered in
//! thousands of runs. Uploading one blob per run would cost thousands of requests;
//! uploading fixed windows with their holes would upload zeros. So the runs are
//! found with `SEEK_DATA`/`SEEK_HOLE` ([`data_extents`]) and packed, in file order,
//! into chunks of at most [`CHUNK_BYTES`] of data each ([`pack`]): a chunk's blob is
//! the concatenation of its runs' bytes, and the manifest lists the runs it scatters
//! back to. The bytes uploaded are the allocated bytes, in ~`data / CHUNK_BYTES`
//! blobs.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use nix::unistd::{lseek, Whence};

/// Most data bytes in one chunk (one blob, before compression).
pub const CHUNK_BYTES: u64 = 4 << 20;

/// A run of bytes in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Extent {
    /// Where it starts.
    pub offset: u64,
    /// How long it is.
    pub len: u64,
}

impl Extent {
    /// Just past its end.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// The allocated runs of `file` (of `size` bytes), in order. A filesystem without
/// `SEEK_DATA` reports the whole file as data, which is correct, only larger.
pub fn data_extents(file: &File, size: u64) -> io::Result<Vec<Extent>> {
    let mut extents = Vec::new();
    let mut at = 0u64;
    while at < size {
        let start = match lseek(file.as_raw_fd(), offset(at)?, Whence::SeekData) {
            Ok(start) => u64::try_from(start).map_err(io::Error::other)?,
            // No data after `at`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(nix::errno::Errno::EINVAL) if at == 0 => {
                return Ok(vec![Extent {
                    offset: 0,
                    len: size,
                }])
            }
            Err(errno) => return Err(errno.into()),
        };
        let end = match lseek(file.as_raw_fd(), offset(start)?, Whence::SeekHole) {
            Ok(end) => u64::try_from(end).map_err(io::Error::other)?,
            Err(errno) => return Err(errno.into()),
        }
        .min(size);
        if end > start {
            extents.push(Extent {
                offset: start,
                len: end - start,
            });
        }
        at = end.max(start + 1);
    }
    Ok(extents)
}

fn offset(at: u64) -> io::Result<i64> {
    i64::try_from(at).map_err(io::Error::other)
}

/// `extents` (in order, not overlapping) packed into chunks of at most `max` data
/// bytes each; a run longer than what is left of a chunk is split across chunks.
pub fn pack(extents: &[Extent], max: u64) -> Vec<Vec<Extent>> {
    let max = max.max(1);
    let mut chunks = Vec::new();
    let mut chunk: Vec<Extent> = Vec::new();
    let mut filled = 0u64;
    for extent in extents {
        let mut rest = *extent;
        while rest.len > 0 {
            let take = rest.len.min(max - filled);
            chunk.push(Extent {
                offset: rest.offset,
                len: take,
            });
            filled += take;
            rest.offset += take;
            rest.len -= take;
            if filled == max {
                chunks.push(std::mem::take(&mut chunk));
                filled = 0;
            }
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// The total length of `extents`.
pub fn total(extents: &[Extent]) -> u64 {
    extents.iter().map(|e| e.len).sum()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::FileExt;

    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_sparse_file_reports_only_its_written_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let file = File::create(&path).unwrap();
        let size = 64 * MIB;
        file.set_len(size).unwrap();
        // Two runs far apart, block-aligned so any filesystem keeps the holes.
        file.write_all_at(&[1u8; 8192], 4 * MIB).unwrap();
        file.write_all_at(&[2u8; 4096], 40 * MIB).unwrap();
        file.sync_all().unwrap();
        let file = File::open(&path).unwrap();
        let extents = data_extents(&file, size).unwrap();
        // Filesystems may allocate a little around a write, never less than it.
        let covered = |at: u64, len: u64| {
            extents
                .iter()
                .any(|e| e.offset <= at && e.end() >= at + len)
        };
        assert!(covered(4 * MIB, 8192), "{extents:?}");
        assert!(covered(40 * MIB, 4096), "{extents:?}");
        assert!(
            total(&extents) < 4 * MIB,
            "the holes were reported as data: {extents:?}"
        );
        assert!(extents.windows(2).all(|w| w[0].end() <= w[1].offset));
    }

    #[test]
    fn a_file_of_holes_has_no_extents_and_a_full_one_has_one() {
        let dir = tempfile::tempdir().unwrap();
        let holes = dir.path().join("holes");
        let file = File::create(&holes).unwrap();
        file.set_len(8 * MIB).unwrap();
        assert_eq!(
            data_extents(&File::open(&holes).unwrap(), 8 * MIB).unwrap(),
            vec![]
        );
        let full = dir.path().join("full");
        std::fs::write(&full, vec![7u8; 10_000]).unwrap();
        assert_eq!(
            data_extents(&File::open(&full).unwrap(), 10_000).unwrap(),
            vec![Extent {
                offset: 0,
                len: 10_000
            }]
        );
        assert_eq!(
            data_extents(&File::open(&full).unwrap(), 0).unwrap(),
            vec![]
        );
    }

    #[test]
    fn runs_are_packed_into_chunks_of_at_most_the_limit_and_split_across_them() {
        let e = |offset, len| Extent { offset, len };
        let runs = [e(0, 3), e(10, 4), e(100, 9), e(200, 1)];
        let chunks = pack(&runs, 5);
        assert_eq!(
            chunks,
            vec![
                vec![e(0, 3), e(10, 2)],
                vec![e(12, 2), e(100, 3)],
                vec![e(103, 5)],
                vec![e(108, 1), e(200, 1)],
            ]
        );
        for chunk in &chunks {
            assert!(total(chunk) <= 5);
        }
        // Every byte once, in order.
        let flat: Vec<Extent> = chunks.concat();
        assert_eq!(total(&flat), total(&runs));
        assert!(flat.windows(2).all(|w| w[0].end() <= w[1].offset));
        assert!(pack(&[], 5).is_empty());
        assert_eq!(pack(&[e(0, 10)], 10), vec![vec![e(0, 10)]]);
    }
}
