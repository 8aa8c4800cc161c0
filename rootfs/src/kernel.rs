//! The guest kernel: Debian's cloud kernel fetched and unpacked, or one the user gives.
//!
//! Debian path ([`debian_cloud`]), cached under `cache/kernel/<version>/`:
//! 1. resolve the current ABI: `apt-cache depends linux-image-cloud-amd64` names
//!    `linux-image-<version>` (not pinned: whatever Debian ships now; when apt knows
//!    nothing, the newest cached version is used);
//! 2. `apt-get download` the package and `dpkg-deb -x` it (no install, no root);
//! 3. `depmod -b` so `modules.dep` exists;
//! 4. carve the uncompressed ELF `vmlinux` out of the bzImage ([`extract_vmlinux`]):
//!    QEMU's `microvm` boots it directly through its PVH note, skipping the
//!    decompressor (about 0.2 s per boot under TCG).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;

use tracing::{info, warn};

use crate::cmd::{self, CmdError};

/// Debian's metapackage that depends on the current cloud kernel.
pub const DEBIAN_CLOUD_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// A kernel ready to go into a template.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The image to boot.
    pub image: PathBuf,
    /// True for an ELF `vmlinux`, false for a bzImage.
    pub is_elf: bool,
    /// `uname -r`.
    pub version: String,
    /// Its `/lib/modules/<version>` folder, with `modules.dep`, if it has modules.
    pub modules_dir: Option<PathBuf>,
}

/// Getting the kernel failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A host tool failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// apt does not know the cloud kernel and nothing is cached.
    #[error("Cannot resolve {DEBIAN_CLOUD_METAPACKAGE} (run `apt-get update`?)")]
    Unresolved,
    /// A file could not be read or written.
    #[error("Cannot access {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The file is not a bzImage this builder understands.
    #[error("{} is not a bzImage: {reason}", path.display())]
    NotBzImage {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// Decompressing the payload did not give a whole ELF file.
    #[error("Extracting vmlinux from {} failed: {reason}", path.display())]
    Extract {
        /// The bzImage.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A downloaded package did not hold what it should.
    #[error("{} lacks {what}", path.display())]
    Incomplete {
        /// The unpacked package.
        path: PathBuf,
        /// What is missing.
        what: &'static str,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> KernelError + '_ {
    move |error| KernelError::Io {
        path: path.to_owned(),
        error,
    }
}

/// Fetches (or reuses from `cache_dir`) Debian's current cloud kernel.
pub fn debian_cloud(cache_dir: &Path) -> Result<Kernel, KernelError> {
    let version = match resolve_debian_version() {
        Ok(version) => version,
        Err(error) => {
            let cached = newest_cached(cache_dir).ok_or(error)?;
            warn!(version = %cached, "apt cannot resolve the cloud kernel; using the cached one");
            cached
        }
    };
    let dir = cache_dir.join(&version);
    let root = dir.join("root");
    let modules_dir = root.join("lib/modules").join(&version);
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{version}"));
    let vmlinux = dir.join("vmlinux");
    fs::create_dir_all(&dir).map_err(io_error(&dir))?;

    if !vmlinuz.is_file() {
        let package = format!("linux-image-{version}");
        info!(%package, "downloading the kernel package");
        cmd::run(
            Command::new("apt-get")
                .arg("download")
                .arg(&package)
                .current_dir(&dir),
        )?;
        let deb = find_deb(&dir, &package)?;
        info!(deb = %deb.display(), "unpacking");
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        if !vmlinuz.is_file() {
            return Err(KernelError::Incomplete {
                path: root,
                what: "the kernel image",
            });
        }
    }
    if !modules_dir.join("modules.dep").is_file() {
        info!(%version, "generating modules.dep");
        cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(&version))?;
    }
    let (image, is_elf) = if vmlinux.is_file() {
        (vmlinux, true)
    } else {
        info!("extracting vmlinux from the bzImage");
        match extract_vmlinux(&vmlinuz, &vmlinux) {
            Ok(()) => (vmlinux, true),
            Err(error) => {
                warn!(%error, "booting the bzImage instead of vmlinux");
                (vmlinuz, false)
            }
        }
    };
    Ok(Kernel {
        image,
        is_elf,
        version,
        modules_dir: Some(modules_dir),
    })
}

/// A kernel the user built or downloaded, with its modules folder if it has one.
pub fn user_kernel(image: &Path, modules_dir: Option<&Path>) -> Result<Kernel, KernelError> {
    let mut magic = [0u8; 4];
    File::open(image)
        .and_then(|mut file| file.read_exact(&mut magic))
        .map_err(io_error(image))?;
    let version = modules_dir
        .and_then(|dir| dir.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    if let Some(dir) = modules_dir {
        if !dir.join("modules.dep").is_file() {
            info!(dir = %dir.display(), "generating modules.dep");
            let base = dir
                .parent()
                .and_then(Path::parent)
                .and_then(Path::parent)
                .ok_or(KernelError::Incomplete {
                    path: dir.to_owned(),
                    what: "a lib/modules/<version> layout",
                })?;
            cmd::run(Command::new("depmod").arg("-b").arg(base).arg(&version))?;
        }
    }
    Ok(Kernel {
        image: image.to_owned(),
        is_elf: magic == *b"\x7fELF",
        version,
        modules_dir: modules_dir.map(Path::to_owned),
    })
}

/// The kernel ABI Debian currently ships, e.g. `6.1.0-56-cloud-amd64`.
fn resolve_debian_version() -> Result<String, KernelError> {
    let text =
        cmd::stdout_of(Command::new("apt-cache").args(["depends", DEBIAN_CLOUD_METAPACKAGE]))
            .map_err(|error| {
                warn!(%error, "apt-cache failed");
                KernelError::Unresolved
            })?;
    parse_depends(&text).ok_or(KernelError::Unresolved)
}

/// The version from `apt-cache depends` output (`Depends: linux-image-<version>`).
pub fn parse_depends(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line
            .trim()
            .trim_start_matches('|')
            .strip_prefix("Depends:")?;
        let version = rest.trim().strip_prefix("linux-image-")?;
        version
            .ends_with("-cloud-amd64")
            .then(|| version.to_owned())
    })
}

/// The newest version folder in the cache that has a kernel image.
fn newest_cached(cache_dir: &Path) -> Option<String> {
    let mut versions: Vec<String> = fs::read_dir(cache_dir)
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|version| {
            cache_dir
                .join(version)
                .join("root/boot")
                .join(format!("vmlinuz-{version}"))
                .is_file()
        })
        .collect();
    versions.sort_by_key(|version| version_key(version));
    versions.pop()
}

/// Sorts `6.1.0-56-…` numerically by its number groups.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

fn find_deb(dir: &Path, package: &str) -> Result<PathBuf, KernelError> {
    let prefix = format!("{package}_");
    fs::read_dir(dir)
        .map_err(io_error(dir))?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".deb"))
        })
        .ok_or(KernelError::Incomplete {
            path: dir.to_owned(),
            what: "the downloaded .deb",
        })
}

/// Offsets into the x86 boot protocol's setup header.
const SETUP_SECTS_OFFSET: usize = 0x1f1;
const HEADER_MAGIC_OFFSET: usize = 0x202;
const PAYLOAD_OFFSET_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH_OFFSET: usize = 0x24c;

/// Writes the uncompressed ELF kernel inside `bzimage` to `out`, using the setup
/// header's payload offset and length and the matching decompressor.
pub fn extract_vmlinux(bzimage: &Path, out: &Path) -> Result<(), KernelError> {
    let mut file = File::open(bzimage).map_err(io_error(bzimage))?;
    let mut header = [0u8; 0x250];
    file.read_exact(&mut header).map_err(io_error(bzimage))?;
    let not_bz = |reason| KernelError::NotBzImage {
        path: bzimage.to_owned(),
        reason,
    };
    if &header[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4] != b"HdrS" {
        return Err(not_bz("no HdrS signature"));
    }
    let setup_sects = match header[SETUP_SECTS_OFFSET] {
        0 => 4,
        n => u64::from(n),
    };
    let le32 = |at: usize| {
        u64::from(u32::from_le_bytes([
            header[at],
            header[at + 1],
            header[at + 2],
            header[at + 3],
        ]))
    };
    let start = (setup_sects + 1) * 512 + le32(PAYLOAD_OFFSET_OFFSET);
    let length = le32(PAYLOAD_LENGTH_OFFSET);
    if length == 0 {
        return Err(not_bz("no payload (boot protocol older than 2.08)"));
    }
    file.seek(SeekFrom::Start(start))
        .map_err(io_error(bzimage))?;
    let mut payload = Vec::new();
    (&mut file)
        .take(length)
        .read_to_end(&mut payload)
        .map_err(io_error(bzimage))?;
    let tool = decompressor(&payload).ok_or(not_bz("unknown payload compression"))?;

    let partial = out.with_extension("partial");
    let sink = File::create(&partial).map_err(io_error(&partial))?;
    let mut command = Command::new(tool);
    command
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(sink)
        .stderr(Stdio::null());
    let mut child = command
        .spawn()
        .map_err(|error| cmd::spawn_error(&command, error))?;
    let mut stdin = child.stdin.take().ok_or_else(|| KernelError::Extract {
        path: bzimage.to_owned(),
        reason: "no pipe to the decompressor".into(),
    })?;
    // Feed from a thread so a full stdout pipe cannot deadlock us; trailing bytes
    // (the kernel appends the decompressed size) make some tools exit non-zero, so
    // the result is judged by the ELF it produced, not by the exit status.
    let feeder = thread::spawn(move || {
        let _ = stdin.write_all(&payload);
    });
    let _ = child.wait();
    let _ = feeder.join();
    match check_elf(&partial) {
        Ok(()) => fs::rename(&partial, out).map_err(io_error(out)),
        Err(reason) => {
            let _ = fs::remove_file(&partial);
            Err(KernelError::Extract {
                path: bzimage.to_owned(),
                reason,
            })
        }
    }
}

/// The tool that decompresses a payload, from its magic bytes.
fn decompressor(payload: &[u8]) -> Option<&'static str> {
    const MAGICS: [(&[u8], &str); 5] = [
        (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
        (&[0x1f, 0x8b], "gzip"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
        (b"BZh", "bzip2"),
    ];
    MAGICS
        .iter()
        .find(|(magic, _)| payload.starts_with(magic))
        .map(|(_, tool)| *tool)
}

/// Checks that `path` is a complete 64-bit ELF file: its section header table,
/// which the linker puts at the end, lies inside the file.
fn check_elf(path: &Path) -> Result<(), String> {
    let mut header = [0u8; 64];
    let mut file = File::open(path).map_err(|error| error.to_string())?;
    file.read_exact(&mut header)
        .map_err(|_| "output shorter than an ELF header".to_owned())?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 {
        return Err("output is not a 64-bit ELF file".into());
    }
    let len = file.metadata().map_err(|error| error.to_string())?.len();
    let shoff = u64::from_le_bytes(header[0x28..0x30].try_into().unwrap_or_default());
    let shentsize = u64::from(u16::from_le_bytes([header[0x3a], header[0x3b]]));
    let shnum = u64::from(u16::from_le_bytes([header[0x3c], header[0x3d]]));
    if shoff + shentsize * shnum > len {
        return Err(format!("output truncated at {len} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_cache_depends_output_names_the_abi() {
        let text = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-56-cloud-amd64\n";
        assert_eq!(parse_depends(text).as_deref(), Some("6.1.0-56-cloud-amd64"));
        assert_eq!(parse_depends("linux-image-cloud-amd64\n"), None);
    }

    #[test]
    fn versions_sort_numerically() {
        let mut versions = [
            "6.1.0-9-cloud-amd64",
            "6.1.0-56-cloud-amd64",
            "6.1.0-10-cloud-amd64",
        ];
        versions.sort_by_key(|v| version_key(v));
        assert_eq!(versions[2], "6.1.0-56-cloud-amd64");
    }

    #[test]
    fn payload_compression_is_recognized() {
        assert_eq!(decompressor(&[0x02, 0x21, 0x4c, 0x18, 0]), Some("lz4"));
        assert_eq!(decompressor(&[0x28, 0xb5, 0x2f, 0xfd]), Some("zstd"));
        assert_eq!(decompressor(b"nope"), None);
    }
}
