//! The images an incremental RAM image is read through: a page bitmap, a file
//! mapped with the pages that hold data, and a chain of images from a full one on.

use std::fs::File;
use std::io;
use std::path::Path;

use super::{
    damaged, data_ranges, io_error, len_of, lock_folder, manifest_of, page_index, read_pages,
    MAX_CHAIN, PAGE,
};
use crate::launcher::snapshot::manifest::{RamImage, RAM_FILE};
use crate::launcher::snapshot::SnapshotError;

/// One bit a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bitmap {
    pub(super) bytes: Vec<u8>,
}

impl Bitmap {
    pub(super) fn new(pages: usize) -> Self {
        Self {
            bytes: vec![0; pages.div_ceil(8)],
        }
    }

    pub(super) fn set(&mut self, page: usize) {
        if let Some(byte) = self.bytes.get_mut(page / 8) {
            *byte |= 1 << (page % 8);
        }
    }

    pub(super) fn get(&self, page: usize) -> bool {
        self.bytes
            .get(page / 8)
            .is_some_and(|byte| byte & (1 << (page % 8)) != 0)
    }
}

/// One image of a chain.
pub(crate) struct Level {
    pub(super) file: File,
    /// `None` for the full image at the root.
    pub(super) pages: Option<Bitmap>,
    /// Byte ranges of `file` that hold data (the rest are holes: zeros).
    pub(super) data: Vec<(u64, u64)>,
    /// `file` mapped, its data prefaulted when the chain is opened (before a
    /// paused capture stops the guest).
    pub(super) map: Mapped,
    /// The checkpoint folder, locked (shared) while the chain is open.
    _lock: File,
}

/// A RAM image as the files that make it: a full image, then diffs, oldest first.
pub(crate) struct Chain {
    pub(super) levels: Vec<Level>,
    pub(super) len: u64,
}

impl Chain {
    /// The chain of the checkpoint in `folder` (in the store at `root`), each of its
    /// folders locked shared until the chain is dropped. `None` for a checkpoint
    /// whose RAM is in its stream.
    pub(crate) fn open(root: &Path, folder: &Path) -> Result<Option<Self>, SnapshotError> {
        let mut folders = vec![folder.to_owned()];
        let mut manifest = manifest_of(folder)?;
        loop {
            match manifest.ram {
                RamImage::InStream => return Ok(None),
                RamImage::File => break,
                RamImage::Diff => {}
            }
            let base = manifest
                .ram_base
                .as_deref()
                .filter(|base| crate::launcher::snapshot::manifest::check_name(base).is_ok())
                .ok_or_else(|| damaged(&manifest.id, "its RAM is a diff with no base"))?;
            if folders.len() >= MAX_CHAIN {
                return Err(damaged(&manifest.id, "its RAM's chain is too long"));
            }
            let base_folder = root.join(base);
            manifest = manifest_of(&base_folder).map_err(|_| {
                damaged(
                    &manifest.id,
                    &format!("the base of its RAM, {base}, is gone"),
                )
            })?;
            folders.push(base_folder);
        }
        folders.reverse();
        let mut levels = Vec::with_capacity(folders.len());
        let mut len = None;
        for (index, folder) in folders.iter().enumerate() {
            let lock = lock_folder(folder, false)?;
            let ram = folder.join(RAM_FILE);
            let file = File::open(&ram).map_err(|error| io_error(&ram, error))?;
            let size = len_of(&file, &ram)?;
            if *len.get_or_insert(size) != size {
                return Err(damaged(
                    &folder.display().to_string(),
                    "its RAM image is not the size of its base's",
                ));
            }
            let pages = if index == 0 {
                None
            } else {
                Some(read_pages(folder, size)?)
            };
            let data = data_ranges(&file, size).map_err(|error| io_error(&ram, error))?;
            let map = Mapped::new(&file, size).map_err(|error| io_error(&ram, error))?;
            levels.push(Level {
                file,
                pages,
                data,
                map,
                _lock: lock,
            });
        }
        Ok(Some(Self {
            levels,
            len: len.unwrap_or(0),
        }))
    }

    /// How many images make it.
    pub(crate) fn depth(&self) -> usize {
        self.levels.len()
    }

    /// The image's size in bytes (the guest's RAM).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Page `index` of the chain's content, from the newest image that holds it;
    /// `None` for zeros.
    pub(super) fn page(&self, index: usize) -> Option<&[u8]> {
        self.levels
            .iter()
            .rev()
            .find(|level| level.pages.as_ref().is_none_or(|pages| pages.get(index)))?
            .map
            .page(index)
    }
}

/// A file mapped read-only, and which of its pages hold data.
pub(crate) struct Mapped {
    /// `None` for an empty file (which cannot be mapped).
    pub(super) map: Option<memmap2::Mmap>,
    pub(super) data: Bitmap,
}

impl Mapped {
    /// Maps `file` (`len` bytes, whole pages) and prefaults the pages that hold
    /// data, only those.
    pub(super) fn new(file: &File, len: u64) -> io::Result<Self> {
        let mut data = Bitmap::new(page_index(len));
        let ranges = data_ranges(file, len)?;
        for &(start, end) in &ranges {
            for index in page_index(start)..page_index(end.div_ceil(PAGE as u64) * PAGE as u64) {
                data.set(index);
            }
        }
        if len == 0 {
            return Ok(Self { map: None, data });
        }
        // SAFETY: the mapping is read-only and private to this function's caller,
        // and none of these files shrinks while mapped: a checkpoint's images are
        // written once, then only renamed or unlinked (a flatten or absorb writes a
        // new file, or pages a reader's bitmap does not name), and a VM's RAM file
        // keeps its size for the VM's life. A page written underneath (never in a
        // paused or finished capture) would only change the bytes compared.
        let map = unsafe { memmap2::MmapOptions::new().map(file)? };
        for (start, end) in ranges {
            let (start, end) = (
                usize::try_from(start).unwrap_or(usize::MAX),
                usize::try_from(end).unwrap_or(usize::MAX),
            );
            // Best effort: the pages fault in one by one otherwise.
            let _ = map.advise_range(
                memmap2::Advice::PopulateRead,
                start,
                end.saturating_sub(start),
            );
        }
        Ok(Self {
            map: Some(map),
            data,
        })
    }

    /// Page `index`, or `None` for a hole (zeros).
    pub(super) fn page(&self, index: usize) -> Option<&[u8]> {
        if !self.data.get(index) {
            return None;
        }
        self.map
            .as_ref()
            .and_then(|map| map.get(index * PAGE..(index + 1) * PAGE))
    }

    /// Pages `range`, all of which hold data.
    pub(super) fn pages(&self, range: std::ops::Range<usize>) -> &[u8] {
        self.map
            .as_ref()
            .and_then(|map| map.get(range.start * PAGE..range.end * PAGE))
            .unwrap_or_default()
    }
}
