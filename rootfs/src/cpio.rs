//! A newc ("070701") cpio writer, the initramfs format the kernel unpacks.
//!
//! Written here rather than taken from a crate: the format is a fixed ASCII header,
//! a name and the data, each padded to four bytes, and the builder needs exactly two
//! things crates make awkward: every owner forced to `0:0` whoever runs the build,
//! and device nodes (`/dev/console`) that an unprivileged builder cannot create on
//! disk. [`read_entries`] parses archives back, for tests and checks.
//!
//! Entries are written in the order given; parents must come before their children
//! (the kernel does not create missing directories). [`CpioWriter::append_tree`]
//! walks a folder in sorted order, so archives are reproducible.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The newc magic.
const MAGIC: &[u8; 6] = b"070701";

/// Header bytes: the magic and 13 eight-digit hex fields.
const HEADER_BYTES: usize = 6 + 13 * 8;

/// The name of the end-of-archive entry.
const TRAILER: &str = "TRAILER!!!";

/// File type bits of `st_mode`.
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFBLK: u32 = 0o060_000;
const S_IFIFO: u32 = 0o010_000;

/// Writing an archive failed.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    /// Writing to the archive failed.
    #[error("Cannot write the archive")]
    Write(#[source] io::Error),
    /// Reading a source file or folder failed.
    #[error("Cannot read {}", path.display())]
    Read {
        /// The source.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A file is too large for newc's 32-bit size field.
    #[error("{} is too large for a cpio archive ({size} bytes, at most 4 GiB)", path.display())]
    TooLarge {
        /// The source.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// An archive being parsed is malformed.
    #[error("Malformed cpio archive: {0}")]
    Malformed(&'static str),
}

/// Metadata of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryMeta {
    /// Full `st_mode` (type and permission bits).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u32,
    /// Device number for character and block devices.
    pub rdev: (u32, u32),
}

/// Streams a newc archive to `W`.
#[derive(Debug)]
pub struct CpioWriter<W: Write> {
    out: W,
    next_ino: u32,
    written: u64,
}

impl<W: Write> CpioWriter<W> {
    /// An empty archive writing to `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            next_ino: 1,
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str, perm: u32) -> Result<(), CpioError> {
        self.entry(path, S_IFDIR | (perm & 0o7777), 0, 2, (0, 0), &[])
    }

    /// Adds a regular file with contents `data`.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> Result<(), CpioError> {
        self.entry(path, S_IFREG | (perm & 0o7777), 0, 1, (0, 0), data)
    }

    /// Adds a symbolic link to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), CpioError> {
        self.entry(path, S_IFLNK | 0o777, 0, 1, (0, 0), target.as_bytes())
    }

    /// Adds a character device node.
    pub fn char_device(
        &mut self,
        path: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        self.entry(path, S_IFCHR | (perm & 0o7777), 0, 1, (major, minor), &[])
    }

    /// Adds a regular file copied from `source` (streamed, not held in memory).
    pub fn file_from(
        &mut self,
        path: &str,
        perm: u32,
        mtime: u32,
        source: &Path,
    ) -> Result<(), CpioError> {
        let read_error = |error| CpioError::Read {
            path: source.to_owned(),
            error,
        };
        let mut file = File::open(source).map_err(read_error)?;
        let size = file.metadata().map_err(read_error)?.len();
        let size32 = u32::try_from(size).map_err(|_| CpioError::TooLarge {
            path: source.to_owned(),
            size,
        })?;
        self.header(path, S_IFREG | (perm & 0o7777), mtime, 1, (0, 0), size32)?;
        let copied = io::copy(&mut (&mut file).take(size), &mut self.out).map_err(read_error)?;
        if copied != size {
            return Err(read_error(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while being archived",
            )));
        }
        self.written += copied;
        self.pad()
    }

    /// Adds everything under `root` (not `root` itself) beneath `prefix` (`""` for
    /// the archive root), in sorted order. Sockets are skipped; hard links are stored
    /// as separate copies.
    pub fn append_tree(&mut self, root: &Path, prefix: &str) -> Result<(), CpioError> {
        let mut names = read_dir_sorted(root)?;
        for name in names.drain(..) {
            let source = root.join(&name);
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let meta = fs::symlink_metadata(&source).map_err(|error| CpioError::Read {
                path: source.clone(),
                error,
            })?;
            let perm = meta.mode() & 0o7777;
            let mtime = u32::try_from(meta.mtime().max(0)).unwrap_or(u32::MAX);
            let kind = meta.file_type();
            if kind.is_dir() {
                self.entry(&path, S_IFDIR | perm, mtime, 2, (0, 0), &[])?;
                self.append_tree(&source, &path)?;
            } else if kind.is_file() {
                self.file_from(&path, perm, mtime, &source)?;
            } else if kind.is_symlink() {
                let target = fs::read_link(&source).map_err(|error| CpioError::Read {
                    path: source.clone(),
                    error,
                })?;
                let target = target.to_string_lossy();
                self.entry(&path, S_IFLNK | 0o777, mtime, 1, (0, 0), target.as_bytes())?;
            } else if kind.is_char_device() || kind.is_block_device() {
                let rdev = meta.rdev();
                let kind_bits = if kind.is_char_device() {
                    S_IFCHR
                } else {
                    S_IFBLK
                };
                let dev = (dev_major(rdev), dev_minor(rdev));
                self.entry(&path, kind_bits | perm, mtime, 1, dev, &[])?;
            } else if kind.is_fifo() {
                self.entry(&path, S_IFIFO | perm, mtime, 1, (0, 0), &[])?;
            }
        }
        Ok(())
    }

    /// Writes the trailer, pads to 512 bytes and returns the sink.
    pub fn finish(mut self) -> Result<W, CpioError> {
        self.entry(TRAILER, 0, 0, 1, (0, 0), &[])?;
        let rem = usize::try_from(self.written % 512).unwrap_or(0);
        if rem != 0 {
            self.raw(&vec![0; 512 - rem])?;
        }
        self.out.flush().map_err(CpioError::Write)?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        path: &str,
        mode: u32,
        mtime: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), CpioError> {
        let size = u32::try_from(data.len()).map_err(|_| CpioError::TooLarge {
            path: PathBuf::from(path),
            size: data.len() as u64,
        })?;
        self.header(path, mode, mtime, nlink, rdev, size)?;
        self.raw(data)?;
        self.pad()
    }

    fn header(
        &mut self,
        path: &str,
        mode: u32,
        mtime: u32,
        nlink: u32,
        rdev: (u32, u32),
        size: u32,
    ) -> Result<(), CpioError> {
        let name = path.trim_start_matches('/');
        let name_size = u32::try_from(name.len() + 1).map_err(|_| CpioError::TooLarge {
            path: PathBuf::from(path),
            size: name.len() as u64,
        })?;
        let ino = if name == TRAILER { 0 } else { self.next_ino };
        self.next_ino = self.next_ino.wrapping_add(1);
        let fields = [
            ino, mode, 0, // uid: always root
            0, // gid: always root
            nlink, mtime, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        let mut header = Vec::with_capacity(HEADER_BYTES + name.len() + 1);
        header.extend_from_slice(MAGIC);
        for field in fields {
            header.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        header.extend_from_slice(name.as_bytes());
        header.push(0);
        self.raw(&header)?;
        self.pad()
    }

    fn raw(&mut self, bytes: &[u8]) -> Result<(), CpioError> {
        self.out.write_all(bytes).map_err(CpioError::Write)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Pads what was written so far to a multiple of four bytes.
    fn pad(&mut self) -> Result<(), CpioError> {
        let rem = usize::try_from(self.written % 4).unwrap_or(0);
        if rem == 0 {
            Ok(())
        } else {
            self.raw(&[0; 4][..4 - rem])
        }
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<String>, CpioError> {
    let read_error = |error| CpioError::Read {
        path: dir.to_owned(),
        error,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name();
        match name.to_str() {
            Some(name) => names.push(name.to_owned()),
            None => {
                return Err(CpioError::Read {
                    path: entry.path(),
                    error: io::Error::new(io::ErrorKind::InvalidData, "file name is not UTF-8"),
                })
            }
        }
    }
    names.sort();
    Ok(names)
}

/// The major number of a Linux `dev_t`.
fn dev_major(rdev: u64) -> u32 {
    u32::try_from(((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff)).unwrap_or(0)
}

/// The minor number of a Linux `dev_t`.
fn dev_minor(rdev: u64) -> u32 {
    u32::try_from(((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)).unwrap_or(0)
}

/// One parsed entry, for checks and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedEntry {
    /// The name as stored.
    pub name: String,
    /// Full mode.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (major, minor).
    pub rdev: (u32, u32),
    /// Contents (the target for symlinks).
    pub data: Vec<u8>,
}

impl ParsedEntry {
    /// True for directories.
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    /// True for character devices.
    pub fn is_char_device(&self) -> bool {
        self.mode & S_IFMT == S_IFCHR
    }
    /// True for symlinks.
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }
}

/// Parses a whole newc archive (up to the trailer).
pub fn read_entries(bytes: &[u8]) -> Result<Vec<ParsedEntry>, CpioError> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    loop {
        let header = bytes
            .get(pos..pos + HEADER_BYTES)
            .ok_or(CpioError::Malformed("truncated header"))?;
        if &header[..6] != MAGIC {
            return Err(CpioError::Malformed("bad magic"));
        }
        let field = |i: usize| -> Result<u32, CpioError> {
            let text = std::str::from_utf8(&header[6 + i * 8..6 + i * 8 + 8])
                .map_err(|_| CpioError::Malformed("non-ASCII header"))?;
            u32::from_str_radix(text, 16).map_err(|_| CpioError::Malformed("bad hex field"))
        };
        let (mode, uid, gid, size) = (field(1)?, field(2)?, field(3)?, field(6)?);
        let rdev = (field(9)?, field(10)?);
        let name_size = field(11)? as usize;
        let name_start = pos + HEADER_BYTES;
        let name_bytes = bytes
            .get(name_start..name_start + name_size)
            .ok_or(CpioError::Malformed("truncated name"))?;
        let name = String::from_utf8_lossy(name_bytes.strip_suffix(&[0]).unwrap_or(name_bytes))
            .into_owned();
        let data_start = align4(name_start + name_size);
        let data_end = data_start + size as usize;
        let data = bytes
            .get(data_start..data_end)
            .ok_or(CpioError::Malformed("truncated data"))?
            .to_vec();
        pos = align4(data_end);
        if name == TRAILER {
            return Ok(entries);
        }
        entries.push(ParsedEntry {
            name,
            mode,
            uid,
            gid,
            rdev,
            data,
        });
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};

    fn sample_archive() -> (tempfile::TempDir, Vec<u8>) {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir(src.path().join("bin")).unwrap();
        fs::write(src.path().join("bin/tool"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(
            src.path().join("bin/tool"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("tool", src.path().join("bin/alias")).unwrap();
        fs::write(src.path().join("odd"), b"12345").unwrap();

        let mut writer = CpioWriter::new(Vec::new());
        writer.dir("dev", 0o755).unwrap();
        writer.char_device("dev/console", 0o600, 5, 1).unwrap();
        writer.file("init", 0o755, b"\x7fELF").unwrap();
        writer.append_tree(src.path(), "").unwrap();
        (src, writer.finish().unwrap())
    }

    #[test]
    fn archive_round_trips_through_the_parser() {
        let (_src, bytes) = sample_archive();
        assert_eq!(bytes.len() % 512, 0);
        let entries = read_entries(&bytes).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "dev",
                "dev/console",
                "init",
                "bin",
                "bin/alias",
                "bin/tool",
                "odd"
            ]
        );
        let console = &entries[1];
        assert!(console.is_char_device());
        assert_eq!((console.rdev, console.mode & 0o7777), ((5, 1), 0o600));
        assert!(entries[4].is_symlink());
        assert_eq!(entries[4].data, b"tool");
        assert_eq!(entries[5].mode & 0o777, 0o755);
        assert_eq!(entries[6].data, b"12345");
        assert!(entries.iter().all(|e| e.uid == 0 && e.gid == 0));
    }

    #[test]
    fn archive_is_readable_by_cpio_tool() {
        let Ok(status) = Command::new("cpio")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
        else {
            eprintln!("cpio not installed; skipping");
            return;
        };
        assert!(status.success());
        let (_src, bytes) = sample_archive();
        let mut child = Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        let listing = String::from_utf8(output.stdout).unwrap();
        assert_eq!(
            listing.lines().collect::<Vec<_>>(),
            [
                "dev",
                "dev/console",
                "init",
                "bin",
                "bin/alias",
                "bin/tool",
                "odd"
            ]
        );
    }

    #[test]
    fn dev_numbers_split_like_glibc() {
        // makedev(5, 1) and makedev(259, 70000)
        assert_eq!((dev_major(0x501), dev_minor(0x501)), (5, 1));
        let (major, minor) = (259u64, 70000u64);
        let rdev =
            (major & 0xfff) << 8 | (major & !0xfff) << 32 | (minor & 0xff) | (minor & !0xff) << 12;
        assert_eq!((dev_major(rdev), dev_minor(rdev)), (259, 70000));
    }
}
