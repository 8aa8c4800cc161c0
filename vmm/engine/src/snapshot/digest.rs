//! A promoted template's content digest: `sha256:` over every regular file of its
//! folder (memory image, disk, manifest), in name order, each as its relative
//! path, a NUL, its length in decimal, a NUL, and its bytes. Two promotions of the
//! same state under two names share the digest only if their files are equal, so
//! seed 000's clients can tell templates apart (their `content_digest`).
//!
//! Hashing reads the whole image: about a second per 500 MiB on this project's
//! build (sha2 is optimized in dev builds too), done on a blocking thread.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Bytes read per step.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Every regular file under `dir`, relative, sorted.
fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(dir.join(&relative))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = relative.join(entry.file_name());
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The digest of the folder `dir` (see the module docs).
pub fn content_digest(dir: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    for relative in files(dir)? {
        let mut file = std::fs::File::open(dir.join(&relative))?;
        let len = file.metadata()?.len();
        hasher.update(relative.as_os_str().as_encoded_bytes());
        hasher.update([0]);
        hasher.update(len.to_string().as_bytes());
        hasher.update([0]);
        loop {
            let read = file.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::content_digest;

    #[test]
    fn the_digest_follows_content_and_names_not_folder_names() {
        let base = std::env::temp_dir().join(format!("digest-test-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        for dir in [&a, &b] {
            std::fs::create_dir_all(dir.join("sub")).unwrap();
            std::fs::write(dir.join("mem"), b"memory").unwrap();
            std::fs::write(dir.join("sub/disk"), b"disk").unwrap();
        }
        let first = content_digest(&a).unwrap();
        assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
        assert_eq!(first, content_digest(&b).unwrap());
        std::fs::write(b.join("mem"), b"memorY").unwrap();
        assert_ne!(first, content_digest(&b).unwrap());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
