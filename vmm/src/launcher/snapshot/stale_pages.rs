//! The last step of a live capture, with both VMs stopped: make the sink's RAM
//! image equal the source's RAM file, page for page.
//!
//! Why it is needed: QEMU 7.2's dirty tracking under TCG misses writes. A vCPU
//! writes to a page through its software TLB; the first write after a page's
//! migration bit was cleared takes the slow path and sets the bit, and then the TLB
//! entry is made fast. When the migration's next pass clears the bit again, the
//! entry stays fast and later writes through it are not recorded (kernel pages, which
//! the guest maps global, keep their entries longest). Measured on a guest writing
//! all along: about 30 of 131072 pages stale at the switchover, enough to crash the
//! restored kernel. KVM's dirty log (write protection or PML in the host kernel)
//! does not have this gap, and the check runs under TCG only.
//!
//! What it costs: a comparison (no copy) of the source's allocated RAM with the
//! image, both mapped, on two threads, while the source is stopped: so under TCG the
//! pause still grows with the RAM in use, at about half the rate of the paused
//! capture's sparse copy (which reads every page and writes a new file).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::Mmap;
use nix::unistd::{lseek, Whence};

/// What the pass found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Patched {
    /// Bytes of the source compared (its allocated extents).
    pub compared_bytes: u64,
    /// Pages that differed and were written into the image.
    pub pages: u64,
}

const PAGE: usize = 4096;

/// A byte range `[start, end)` of a file.
type Extent = (u64, u64);

/// Writes into `image` every page of `source` that differs from it. Both must hold
/// still meanwhile (their VMs stopped). The source's holes are pages the guest never
/// touched, zero in both: only its data extents are compared.
pub(crate) fn patch(source: &Path, image: &Path) -> io::Result<Patched> {
    let source = File::open(source)?;
    let image = OpenOptions::new().read(true).write(true).open(image)?;
    let length = source.metadata()?.len();
    if image.metadata()?.len() < length {
        image.set_len(length)?;
    }
    if length == 0 {
        return Ok(Patched::default());
    }
    // Not populated: that would fault in the holes too, and a read fault on a tmpfs
    // hole allocates a page: the source's RAM would grow to its full size. Only the
    // data extents are touched.
    // SAFETY: the source is the RAM file of a stopped VM: nothing writes to it while
    // the map lives.
    let source_map = unsafe { Mmap::map(&source)? };
    // SAFETY: the image is the RAM of a stopped capture QEMU; the only writes while
    // the map lives are this function's own `write_at`s, each after the comparison
    // of the page it replaces, and no slice of the map outlives its comparison.
    let image_map = unsafe { Mmap::map(&image)? };
    let extents = data_extents(&source, length)?;
    let compared_bytes = extents.iter().map(|(start, end)| end - start).sum();
    // Two halves on two threads: the comparison is bound by memory bandwidth, which
    // one core does not fill.
    let (first, second) = split_extents(&extents, compared_bytes / 2);
    let (pages_first, pages_second) = std::thread::scope(|scope| {
        let other = scope.spawn(|| patch_extents(&second, &source_map, &image_map, &image));
        let mine = patch_extents(&first, &source_map, &image_map, &image);
        (
            mine,
            other
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("compare thread panicked"))),
        )
    });
    Ok(Patched {
        compared_bytes,
        pages: pages_first? + pages_second?,
    })
}

/// Compares and patches the pages of `extents`; returns how many were written.
fn patch_extents(
    extents: &[Extent],
    source_map: &Mmap,
    image_map: &Mmap,
    image: &File,
) -> io::Result<u64> {
    let mut pages = 0;
    for &(start, end) in extents {
        let mut offset = start;
        while offset < end {
            let page_end = (offset + PAGE as u64).min(end);
            let range = to_usize(offset)?..to_usize(page_end)?;
            let (Some(want), Some(have)) = (source_map.get(range.clone()), image_map.get(range))
            else {
                break;
            };
            if want != have {
                image.write_at(want, offset)?;
                pages += 1;
            }
            offset = page_end;
        }
    }
    Ok(pages)
}

/// Splits extents into two lists of about `half` bytes and the rest, cutting one
/// extent at a page boundary if need be.
fn split_extents(extents: &[Extent], half: u64) -> (Vec<Extent>, Vec<Extent>) {
    let (mut first, mut second) = (Vec::new(), Vec::new());
    let mut taken = 0u64;
    for &(start, end) in extents {
        let room = half.saturating_sub(taken);
        if room == 0 {
            second.push((start, end));
        } else if end - start <= room {
            first.push((start, end));
            taken += end - start;
        } else {
            let cut = start + (room / PAGE as u64) * PAGE as u64;
            if cut > start {
                first.push((start, cut));
            }
            second.push((cut, end));
            taken = half;
        }
    }
    (first, second)
}

/// The file's data extents (`SEEK_DATA`/`SEEK_HOLE`), page-aligned outwards. A
/// filesystem without hole reporting reports the whole file as data.
fn data_extents(file: &File, length: u64) -> io::Result<Vec<Extent>> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let to_off = |n: u64| i64::try_from(n).map_err(|_| io::Error::other("file too large"));
    let mut extents = Vec::new();
    let mut position = 0u64;
    while position < length {
        let start = match lseek(fd, to_off(position)?, Whence::SeekData) {
            Ok(start) => start.cast_unsigned(),
            // No data after `position`.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(errno) => return Err(io::Error::from(errno)),
        };
        let end = match lseek(fd, to_off(start)?, Whence::SeekHole) {
            Ok(end) => end.cast_unsigned().min(length),
            Err(errno) => return Err(io::Error::from(errno)),
        };
        let aligned_start = start - start % PAGE as u64;
        let aligned_end = end.div_ceil(PAGE as u64) * PAGE as u64;
        extents.push((aligned_start, aligned_end.min(length)));
        position = end.max(start + 1);
    }
    Ok(extents)
}

fn to_usize(n: u64) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::other("offset out of range"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("stale-pages-{}-{name}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir
    }

    #[test]
    fn differing_pages_are_written_and_holes_skipped() {
        let dir = temp("patch");
        let (source, image) = (dir.join("source"), dir.join("image"));
        let size = 64 * PAGE as u64;
        let src = File::create(&source).unwrap();
        src.set_len(size).unwrap();
        src.write_at(&[7u8; PAGE], 3 * PAGE as u64).unwrap();
        src.write_at(&[9u8; 100], 40 * PAGE as u64 + 5).unwrap();
        let img = File::create(&image).unwrap();
        img.set_len(size).unwrap();
        img.write_at(&[7u8; PAGE], 3 * PAGE as u64).unwrap();
        let patched = patch(&source, &image).unwrap();
        assert_eq!(patched.pages, 1, "{patched:?}");
        assert!(
            patched.compared_bytes < size,
            "holes were compared: {patched:?}"
        );
        assert_eq!(
            std::fs::read(&source).unwrap(),
            std::fs::read(&image).unwrap()
        );
        // Equal now: nothing more to write.
        assert_eq!(patch(&source, &image).unwrap().pages, 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn extents_split_in_two_cover_the_same_bytes() {
        let extents = [(0, 8 * PAGE as u64), (16 * PAGE as u64, 20 * PAGE as u64)];
        let (a, b) = split_extents(&extents, 6 * PAGE as u64);
        assert_eq!(a, [(0, 6 * PAGE as u64)]);
        assert_eq!(
            b,
            [
                (6 * PAGE as u64, 8 * PAGE as u64),
                (16 * PAGE as u64, 20 * PAGE as u64)
            ]
        );
        let (a, b) = split_extents(&extents, 0);
        assert!(a.is_empty());
        assert_eq!(b, extents);
    }

    #[test]
    fn a_shorter_image_grows_to_the_source() {
        let dir = temp("grow");
        let (source, image) = (dir.join("source"), dir.join("image"));
        std::fs::write(&source, vec![1u8; 2 * PAGE + 10]).unwrap();
        std::fs::write(&image, b"").unwrap();
        let patched = patch(&source, &image).unwrap();
        assert_eq!(patched.pages, 3);
        assert_eq!(
            std::fs::read(&source).unwrap(),
            std::fs::read(&image).unwrap()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
