//! Incremental RAM images: a checkpoint's RAM kept as the pages that differ from an
//! earlier checkpoint of the same VM.
//!
//! A full RAM image costs what the guest uses, at every checkpoint: an agent that
//! checkpoints after each step of a task with 300 MiB in use writes 300 MiB each
//! time, though a step changes a few MiB. An incremental checkpoint ([`write`])
//! compares the captured RAM (the source's RAM file in a paused capture, the capture
//! QEMU's image in a live one) with its *base*, page by page, and keeps only the
//! pages that differ:
//!
//! - `ram`: a sparse file the size of the guest's RAM holding the changed pages at
//!   their offsets (a page that became zero is a hole);
//! - `ram-pages` ([`PAGES_FILE`]): one bit a 4 KiB page, set for each page `ram`
//!   holds; a clear bit means "as in the base".
//!
//! The base is itself full or incremental, so an image is a *chain*: a full image,
//! then diffs in order ([`Chain`]); its length is capped at [`MAX_CHAIN`] (the next
//! checkpoint is full again), so reading one never reads more than that many files.
//!
//! The comparison is exact (the bytes, not a hash a hostile guest could collide), so
//! a base needs no relation to the source to be correct, only to be small: the
//! host has no reliable record of which pages the guest wrote (no soft-dirty bits in
//! this kind of host kernel, and QEMU 7.2's dirty bitmap loses writes under TCG, see
//! `live`), so a capture reads the RAM in use once and the base's pages beside it,
//! at memory speed, and writes only what changed.
//!
//! QEMU maps one file as guest RAM, so a child cannot start from a chain: the first
//! restore, upload or promotion of an incremental checkpoint *flattens* it
//! ([`flatten`]) into a full image in place, once; later restores are as fast as
//! from any full checkpoint. Deleting a base does not touch what depends on it
//! from the user's side: its diffs take in the pages of it they lack first
//! ([`absorb`]). Each checkpoint folder of a chain is locked (`flock` on the folder)
//! while it is read, and a delete of one being read is refused.
//!
//! Layout: this module chooses a base and writes a diff ([`choose_base`],
//! [`write`]) and holds the files' helpers; `image` reads images (a page bitmap, a
//! file mapped with its pages that hold data, a chain); `flatten` makes one stand
//! alone ([`flatten`], [`absorb`]).

mod flatten;
mod image;
#[cfg(test)]
mod tests;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::capture::allocated_bytes;
use super::manifest::{read_manifest, Manifest, RamImage, MANIFEST_FILE};
use super::SnapshotError;

pub(crate) use flatten::absorb;
pub use flatten::flatten;
pub(crate) use image::Chain;
use image::{Bitmap, Mapped};

/// The bitmap of an incremental image's pages.
pub const PAGES_FILE: &str = "ram-pages";

/// Most images in a chain (the full one included): a capture whose base chain is
/// this long already is full.
pub const MAX_CHAIN: usize = 8;

/// A guest page.
const PAGE: usize = 4096;

/// The unit of reading and comparing: 256 pages.
const CHUNK: usize = 1 << 20;

/// A page of zeros to compare against.
static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

/// What writing an incremental image found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Pages that differ from the base (kept in the image).
    pub changed_pages: u64,
    /// Of those, pages with data (the others became zero: holes).
    pub written_pages: u64,
}

/// The base chain a capture of `source_vm` compares against: its newest kept
/// checkpoint with a RAM image of `ram_len` bytes whose chain is shorter than
/// [`MAX_CHAIN`]. Returns the base's id and chain.
pub(crate) fn choose_base(
    root: &Path,
    candidates: &[Manifest],
    source_vm: &str,
    ram_len: u64,
) -> Option<(String, Chain)> {
    let newest = candidates
        .iter()
        .filter(|m| m.source_vm == source_vm && !m.ephemeral && m.ram != RamImage::InStream)
        .max_by_key(|m| m.created_at_unix_ms)?;
    super::manifest::check_name(&newest.id).ok()?;
    let chain = match Chain::open(root, &root.join(&newest.id)) {
        Ok(Some(chain)) => chain,
        Ok(None) => return None,
        Err(error) => {
            tracing::info!(base = %newest.id, error = %crate::error_chain(&error), "no incremental checkpoint: its base cannot be read");
            return None;
        }
    };
    let whole_pages = ram_len.is_multiple_of(PAGE as u64);
    (chain.len() == ram_len && whole_pages && chain.depth() < MAX_CHAIN)
        .then(|| (newest.id.clone(), chain))
}

/// Writes the pages of the full image `source` that differ from `base` into a new
/// incremental image: the pages at `ram_path`, the bitmap at `pages_path`, not yet
/// synced (see [`sync`]).
///
/// Every file is mapped and compared in place (reading them into buffers cost more
/// than the whole copy this replaces: 185 against 166 ms for 334 MiB in use), and
/// only its pages that hold data are touched, so a tmpfs file's holes are not
/// allocated by the reading.
pub(crate) fn write(
    source: &Path,
    base: &Chain,
    ram_path: &Path,
    pages_path: &Path,
) -> Result<DiffStats, SnapshotError> {
    let source_file = File::open(source).map_err(|error| io_error(source, error))?;
    let len = len_of(&source_file, source)?;
    if len != base.len() || !len.is_multiple_of(PAGE as u64) {
        return Err(damaged(
            &source.display().to_string(),
            "the RAM is not whole pages the size of its base's",
        ));
    }
    let now = Mapped::new(&source_file, len).map_err(|error| io_error(source, error))?;
    let out = create_private(ram_path)?;
    out.set_len(len)
        .map_err(|error| io_error(ram_path, error))?;
    let count = page_index(len);
    // The pages in as many slices as there are cores (a paused capture's guest is
    // stopped: its vCPU's core is free), compared at once.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let per_thread = count.div_ceil(threads).max(1);
    let slices: Vec<std::ops::Range<usize>> = (0..count)
        .step_by(per_thread)
        .map(|start| start..(start + per_thread).min(count))
        .collect();
    let compared = std::thread::scope(|scope| {
        let workers: Vec<_> = slices
            .into_iter()
            .map(|slice| {
                let (now, out) = (&now, &out);
                scope.spawn(move || compare(now, base, slice, out))
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("a comparing thread panicked")))
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .map_err(|error| io_error(ram_path, error))?;
    let mut pages = Bitmap::new(count);
    let mut stats = DiffStats::default();
    for (changed, written) in compared {
        stats.changed_pages += changed.len() as u64;
        stats.written_pages += written;
        for index in changed {
            pages.set(index);
        }
    }
    let pages_file = create_private(pages_path)?;
    pages_file
        .write_all_at(&pages.bytes, 0)
        .map_err(|error| io_error(pages_path, error))?;
    Ok(stats)
}

/// Compares pages `slice` of `now` with `base`, writing the changed ones with data
/// to `out` (runs in one call each, straight from the mapping). Returns the changed
/// pages and how many were written.
fn compare(
    now: &Mapped,
    base: &Chain,
    slice: std::ops::Range<usize>,
    out: &File,
) -> io::Result<(Vec<usize>, u64)> {
    let mut changed_pages = Vec::new();
    let mut written = 0;
    let mut run: Option<usize> = None;
    let end = slice.end;
    for index in slice.start..=end {
        let changed_data = index < end && {
            let (changed, data) = match (now.page(index), base.page(index)) {
                (None, None) => (false, false),
                (None, Some(old)) => (old != ZERO_PAGE, false),
                (Some(new), None) => (new != ZERO_PAGE, true),
                (Some(new), Some(old)) => (new != old, new != ZERO_PAGE),
            };
            if changed {
                changed_pages.push(index);
            }
            changed && data
        };
        match (run, changed_data) {
            (None, true) => run = Some(index),
            (Some(start), false) => {
                out.write_all_at(now.pages(start..index), (start * PAGE) as u64)?;
                written += (index - start) as u64;
                run = None;
            }
            _ => {}
        }
    }
    Ok((changed_pages, written))
}

/// Makes an incremental image's files durable (after the pause: `write` leaves
/// them to the page cache).
pub(crate) fn sync(ram_path: &Path, pages_path: &Path) -> Result<(), SnapshotError> {
    for path in [ram_path, pages_path] {
        File::open(path)
            .and_then(|file| file.sync_all())
            .map_err(|error| io_error(path, error))?;
    }
    Ok(())
}

/// Replaces `folder`'s manifest atomically.
fn write_manifest(folder: &Path, manifest: &Manifest) -> Result<(), SnapshotError> {
    let path = folder.join(MANIFEST_FILE);
    let temp = folder.join(".manifest.json");
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|error| io_error(&path, io::Error::other(error)))?;
    let _ = fs::remove_file(&temp);
    let file = create_private(&temp)?;
    file.write_all_at(&text, 0)
        .and_then(|()| file.sync_all())
        .map_err(|error| io_error(&temp, error))?;
    fs::rename(&temp, &path).map_err(|error| io_error(&path, error))?;
    // The rename itself durable before anything relies on it (a base's removal).
    File::open(folder)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| io_error(folder, error))
}

/// Locks a checkpoint folder: shared while it is read as a base, exclusive while
/// it is flattened (blocking) or deleted ([`try_lock_for_delete`]).
fn lock_folder(folder: &Path, exclusive: bool) -> Result<File, SnapshotError> {
    let dir = File::open(folder).map_err(|error| io_error(folder, error))?;
    crate::launcher::sys::lock_blocking(&dir, exclusive)
        .map_err(|error| io_error(folder, error))?;
    Ok(dir)
}

/// Takes the folder's lock for a delete, or `None` while a capture reads it as a
/// base or a flatten rewrites it.
pub(crate) fn try_lock_for_delete(folder: &Path) -> io::Result<Option<File>> {
    let dir = File::open(folder)?;
    Ok(crate::launcher::sys::try_lock_exclusive(&dir)?.then_some(dir))
}

/// The length of `file`, opened from `path`.
fn len_of(file: &File, path: &Path) -> Result<u64, SnapshotError> {
    file.metadata()
        .map(|meta| meta.len())
        .map_err(|error| io_error(path, error))
}

fn manifest_of(folder: &Path) -> Result<Manifest, SnapshotError> {
    read_manifest(folder).map_err(|error| io_error(&folder.join(MANIFEST_FILE), error))
}

fn read_pages(folder: &Path, len: u64) -> Result<Bitmap, SnapshotError> {
    let path = folder.join(PAGES_FILE);
    let bytes = fs::read(&path).map_err(|error| io_error(&path, error))?;
    let expected = page_index(len).div_ceil(8);
    if bytes.len() != expected {
        return Err(damaged(
            &folder.display().to_string(),
            &format!("{PAGES_FILE} has {} bytes, not {expected}", bytes.len()),
        ));
    }
    Ok(Bitmap { bytes })
}

/// The byte ranges of `file` (of `len` bytes) that hold data, by `SEEK_DATA` and
/// `SEEK_HOLE`.
fn data_ranges(file: &File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let mut ranges = Vec::new();
    let mut at = 0i64;
    let len = i64::try_from(len).map_err(io::Error::other)?;
    while at < len {
        let start = match lseek(file.as_raw_fd(), at, Whence::SeekData) {
            Ok(start) => start,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(errno) => return Err(errno.into()),
        };
        let end = lseek(file.as_raw_fd(), start, Whence::SeekHole)?.min(len);
        ranges.push((
            u64::try_from(start).unwrap_or(0),
            u64::try_from(end).unwrap_or(0),
        ));
        at = end;
    }
    Ok(ranges)
}

/// True when a sorted list of ranges meets `range`.
fn overlaps(ranges: &[(u64, u64)], (start, end): (u64, u64)) -> bool {
    let first = ranges.partition_point(|&(_, range_end)| range_end <= start);
    ranges
        .get(first)
        .is_some_and(|&(range_start, _)| range_start < end)
}

/// Fills `buf` from `file` at `offset`; bytes past the end read as zeros.
fn read_full(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(read) => done += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

fn page_index(offset: u64) -> usize {
    usize::try_from(offset / PAGE as u64).unwrap_or(usize::MAX)
}

fn create_private(path: &Path) -> Result<File, SnapshotError> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .read(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|error| io_error(path, error))
}

fn damaged(id: &str, why: &str) -> SnapshotError {
    SnapshotError::Damaged {
        id: id.to_owned(),
        why: why.to_owned(),
    }
}

/// Reading or writing `path` failed (the store's one error for both).
fn io_error(path: &Path, error: io::Error) -> SnapshotError {
    SnapshotError::Write {
        path: PathBuf::from(path),
        error,
    }
}
