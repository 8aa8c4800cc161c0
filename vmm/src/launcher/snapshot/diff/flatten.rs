//! Making an incremental image stand alone: whole ([`flatten`]), or based past a
//! base that goes ([`absorb`]).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{
    allocated_bytes, create_private, damaged, data_ranges, io_error, len_of, lock_folder,
    manifest_of, overlaps, page_index, read_full, read_pages, try_lock_for_delete, write_manifest,
    Bitmap, Chain, Mapped, CHUNK, PAGE, PAGES_FILE, ZERO_PAGE,
};
use crate::launcher::snapshot::manifest::{Manifest, RamImage, RAM_FILE};
use crate::launcher::snapshot::SnapshotError;

/// Makes the incremental checkpoint in `folder` full, in place, if it is not: its
/// chain's content is written to a new `ram` (zeros as holes), renamed over the
/// diff, then the manifest says so and the bitmap goes. Returns the manifest as it
/// now is. Concurrent callers wait for the first (an exclusive lock on the folder);
/// each step leaves a readable checkpoint: until the manifest changes, a full `ram`
/// read through the old bitmap gives the same pages.
pub fn flatten(root: &Path, folder: &Path) -> Result<Manifest, SnapshotError> {
    let manifest = manifest_of(folder)?;
    if manifest.ram != RamImage::Diff {
        return Ok(manifest);
    }
    let _exclusive = lock_folder(folder, true)?;
    // Another caller may have flattened it while this one waited.
    let manifest = manifest_of(folder)?;
    if manifest.ram != RamImage::Diff {
        return Ok(manifest);
    }
    let ram_path = folder.join(RAM_FILE);
    let full_path = folder.join(".ram-full");
    let _ = fs::remove_file(&full_path);
    // A failure leaves no half-written image (after the rename, nothing is there).
    let _scratch = RemoveOnDrop(full_path.clone());
    {
        // The levels below through the base's chain (shared locks on the base
        // folders; this folder's own is held exclusive here), this one by hand.
        let base = manifest
            .ram_base
            .as_deref()
            .filter(|base| crate::launcher::snapshot::manifest::check_name(base).is_ok())
            .ok_or_else(|| damaged(&manifest.id, "its RAM is a diff with no base"))?;
        let chain = Chain::open(root, &root.join(base))?
            .ok_or_else(|| damaged(&manifest.id, "the base of its RAM has no image"))?;
        let diff = File::open(&ram_path).map_err(|error| io_error(&ram_path, error))?;
        let len = chain.len();
        let diff_len = len_of(&diff, &ram_path)?;
        if diff_len != len {
            return Err(damaged(
                &manifest.id,
                "its RAM image is not the size of its base's",
            ));
        }
        let pages = read_pages(folder, len)?;
        let out = create_private(&full_path)?;
        out.set_len(len)
            .map_err(|error| io_error(&full_path, error))?;
        // The root image's data, copied in the kernel; then each diff's pages over
        // it, oldest first, this one last.
        let root_level = &chain.levels[0];
        copy_ranges(&root_level.file, &root_level.data, &out)
            .map_err(|error| io_error(&full_path, error))?;
        let own_map = Mapped::new(&diff, len).map_err(|error| io_error(&ram_path, error))?;
        let own = [(&own_map, &pages)];
        let diffs = chain.levels[1..]
            .iter()
            .filter_map(|level| Some((&level.map, level.pages.as_ref()?)))
            .chain(own);
        for (map, pages) in diffs {
            apply(map, pages, len, &out).map_err(|error| io_error(&full_path, error))?;
        }
        out.sync_all()
            .map_err(|error| io_error(&full_path, error))?;
    }
    fs::rename(&full_path, &ram_path).map_err(|error| io_error(&ram_path, error))?;
    let mut flat = manifest;
    flat.ram = RamImage::File;
    flat.ram_base = None;
    flat.ram_bytes = allocated_bytes(&ram_path);
    write_manifest(folder, &flat)?;
    let _ = fs::remove_file(folder.join(PAGES_FILE));
    tracing::info!(checkpoint = %flat.id, ram_bytes = flat.ram_bytes, "flattened an incremental checkpoint");
    Ok(flat)
}

/// Before checkpoint `base` (in `base_folder`) is deleted: makes the incremental
/// checkpoint in `folder` that is based on it stand without it. The base's pages the
/// diff does not have are copied into it; then it is based on the base's own base,
/// or, when the base was a full image, is full itself. Each step leaves a readable
/// checkpoint (pages a bitmap does not name are ignored). `None` when another caller
/// holds the folder (a capture reading it as its base, a flatten).
pub(crate) fn absorb(folder: &Path, base_folder: &Path) -> Result<Option<Manifest>, SnapshotError> {
    // The base as it is now: its caller holds its folder's lock.
    let base = &manifest_of(base_folder)?;
    let Some(_exclusive) = try_lock_for_delete(folder).map_err(|error| io_error(folder, error))?
    else {
        return Ok(None);
    };
    let manifest = manifest_of(folder)?;
    if manifest.ram != RamImage::Diff || manifest.ram_base.as_deref() != Some(base.id.as_str()) {
        return Ok(Some(manifest));
    }
    let ram_path = folder.join(RAM_FILE);
    let base_ram_path = base_folder.join(RAM_FILE);
    let ram = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ram_path)
        .map_err(|error| io_error(&ram_path, error))?;
    let base_ram = File::open(&base_ram_path).map_err(|error| io_error(&base_ram_path, error))?;
    let len = len_of(&ram, &ram_path)?;
    let base_len = len_of(&base_ram, &base_ram_path)?;
    if base_len != len {
        return Err(damaged(
            &manifest.id,
            "its RAM image is not the size of its base's",
        ));
    }
    let mut pages = read_pages(folder, len)?;
    let base_pages = match base.ram {
        RamImage::Diff => Some(read_pages(base_folder, len)?),
        RamImage::File => None,
        RamImage::InStream => {
            return Err(damaged(&manifest.id, "the base of its RAM has no image"));
        }
    };
    let base_data = data_ranges(&base_ram, len).map_err(|error| io_error(&base_ram_path, error))?;
    let mut buf = vec![0; CHUNK];
    let mut offset = 0u64;
    while offset < len {
        let size = usize::try_from((len - offset).min(CHUNK as u64)).unwrap_or(CHUNK);
        let first_page = page_index(offset);
        // Pages this diff lacks and the base has (a page the base holds as a hole
        // is zero, as this diff's hole there already reads).
        let wanted: Vec<usize> = (first_page..first_page + size / PAGE)
            .filter(|&page| {
                !pages.get(page) && base_pages.as_ref().is_none_or(|base| base.get(page))
            })
            .collect();
        if !wanted.is_empty() && overlaps(&base_data, (offset, offset + size as u64)) {
            let buf = &mut buf[..size];
            read_full(&base_ram, offset, buf).map_err(|error| io_error(&base_ram_path, error))?;
            for &page in &wanted {
                let at = (page - first_page) * PAGE;
                let bytes = &buf[at..at + PAGE];
                if bytes != ZERO_PAGE {
                    ram.write_all_at(bytes, (page * PAGE) as u64)
                        .map_err(|error| io_error(&ram_path, error))?;
                }
            }
        }
        for page in wanted {
            pages.set(page);
        }
        offset += size as u64;
    }
    ram.sync_all().map_err(|error| io_error(&ram_path, error))?;
    let mut standing = manifest;
    if base.ram == RamImage::File {
        standing.ram = RamImage::File;
        standing.ram_base = None;
    } else {
        let pages_path = folder.join(PAGES_FILE);
        let temp = folder.join(".ram-pages");
        let _ = fs::remove_file(&temp);
        let file = create_private(&temp)?;
        file.write_all_at(&pages.bytes, 0)
            .and_then(|()| file.sync_all())
            .map_err(|error| io_error(&temp, error))?;
        fs::rename(&temp, &pages_path).map_err(|error| io_error(&pages_path, error))?;
        standing.ram_base.clone_from(&base.ram_base);
    }
    standing.ram_bytes = allocated_bytes(&ram_path);
    write_manifest(folder, &standing)?;
    if standing.ram == RamImage::File {
        let _ = fs::remove_file(folder.join(PAGES_FILE));
    }
    tracing::info!(checkpoint = %standing.id, deleted_base = %base.id, "an incremental checkpoint took in the pages of its deleted base");
    Ok(Some(standing))
}

/// Copies the byte ranges `data` of `from` to the same offsets of `to`
/// (`copy_file_range`: in the kernel, and holes stay holes), by hand where the
/// kernel cannot copy between these files.
fn copy_ranges(from: &File, data: &[(u64, u64)], to: &File) -> io::Result<()> {
    use nix::errno::Errno;
    for &(start, end) in data {
        let mut at = i64::try_from(start).map_err(io::Error::other)?;
        let end = i64::try_from(end).map_err(io::Error::other)?;
        while at < end {
            let want = usize::try_from(end - at).unwrap_or(usize::MAX);
            let (mut from_at, mut to_at) = (at, at);
            match nix::fcntl::copy_file_range(from, Some(&mut from_at), to, Some(&mut to_at), want)
            {
                Ok(copied) if copied > 0 => at += i64::try_from(copied).unwrap_or(i64::MAX),
                Err(Errno::EINTR) => {}
                // End of file early, or no kernel copy between these files.
                Ok(_) | Err(Errno::EXDEV | Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL) => {
                    return copy_by_hand(from, to, at, end);
                }
                Err(errno) => return Err(errno.into()),
            }
        }
    }
    Ok(())
}

/// Copies bytes `at..end` of `from` to the same offsets of `to` through a buffer.
fn copy_by_hand(from: &File, to: &File, at: i64, end: i64) -> io::Result<()> {
    let (mut at, end) = (
        u64::try_from(at).map_err(io::Error::other)?,
        u64::try_from(end).map_err(io::Error::other)?,
    );
    let mut buf = vec![0; CHUNK];
    while at < end {
        let size = usize::try_from((end - at).min(CHUNK as u64)).unwrap_or(CHUNK);
        let read = from.read_at(&mut buf[..size], at)?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the image ended before its data did",
            ));
        }
        to.write_all_at(&buf[..read], at)?;
        at += read as u64;
    }
    Ok(())
}

/// Removes a scratch file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Writes the pages `pages` names of the incremental image `mapped` over `out`
/// (`len` bytes): its pages with data as they are, the others as holes.
fn apply(mapped: &Mapped, pages: &Bitmap, len: u64, out: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let count = page_index(len);
    // Runs of named pages that are alike (all data, or all holes).
    let mut index = 0;
    while index < count {
        if !pages.get(index) {
            index += 1;
            continue;
        }
        let data = mapped.page(index).is_some();
        let start = index;
        while index < count && pages.get(index) && mapped.page(index).is_some() == data {
            index += 1;
        }
        let offset = (start * PAGE) as u64;
        if data {
            out.write_all_at(mapped.pages(start..index), offset)?;
        } else {
            let bytes = ((index - start) * PAGE) as i64;
            let offset = i64::try_from(offset).map_err(io::Error::other)?;
            nix::fcntl::fallocate(
                out.as_raw_fd(),
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                offset,
                bytes,
            )?;
        }
    }
    Ok(())
}
