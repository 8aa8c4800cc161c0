//! The layer cache: blobs (manifests, configs, layers) by digest under
//! `<cache>/oci/blobs/sha256/HEX`, and tag pins under `<cache>/oci/tags/`.
//!
//! A blob is written to a temporary file beside its final name while it is hashed,
//! and renamed into place only when its size and SHA-256 match the descriptor; so a
//! file under its digest's name always holds those bytes, and a second template that
//! shares a layer downloads nothing. A killed pull leaves at most a `.tmp-` file,
//! which the next write of that blob replaces.
//!
//! A pin records the manifest digest a tag pointed to when it was first pulled: a
//! later build of the same tag uses it without asking the registry, so a template is
//! rebuilt from the same bytes until `--refresh` asks where the tag points now.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// `sha256:` and 64 lowercase hex digits, the only digests used as file names.
pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `sha256:HEX` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tag's recorded target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// `registry/repository:tag`.
    pub tag: String,
    /// The manifest (or index) digest it pointed to.
    pub digest: String,
    /// When it was pinned (RFC 3339).
    pub pinned_at: String,
}

/// The cache folder.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// A blob being written; removed unless [`BlobWriter::commit`] renames it.
#[derive(Debug)]
pub struct BlobWriter {
    file: Option<File>,
    temp: PathBuf,
    dest: PathBuf,
    hasher: Sha256,
    written: u64,
}

impl Store {
    /// The store under `cache_dir` (`$SANDBOX_HOME/cache`).
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            root: cache_dir.join("oci"),
        }
    }

    /// Where the blob `digest` lives (a valid digest, checked by the caller).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.root.join("blobs/sha256").join(hex)
    }

    /// True when the blob is cached.
    pub fn has(&self, digest: &str) -> bool {
        valid_digest(digest) && self.blob_path(digest).is_file()
    }

    /// Reads a cached blob whole (manifests and configs, which are small).
    pub fn read(&self, digest: &str) -> io::Result<Vec<u8>> {
        fs::read(self.blob_path(digest))
    }

    /// Stores `data`, which the caller has checked against `digest`.
    pub fn put(&self, digest: &str, data: &[u8]) -> io::Result<()> {
        let mut writer = self.writer(digest)?;
        writer.write(data)?;
        writer.commit()
    }

    /// Starts writing the blob `digest`.
    pub fn writer(&self, digest: &str) -> io::Result<BlobWriter> {
        let dest = self.blob_path(digest);
        let dir = dest.parent().unwrap_or(&self.root).to_owned();
        fs::create_dir_all(&dir)?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = dir.join(format!(".tmp-{name}-{}", std::process::id()));
        let file = File::create(&temp)?;
        Ok(BlobWriter {
            file: Some(file),
            temp,
            dest,
            hasher: Sha256::new(),
            written: 0,
        })
    }

    fn pin_path(&self, tag: &str) -> PathBuf {
        // Hashed: a tag key holds ':' and '/', and a hostile one could hold "..".
        let key = sha256_digest(tag.as_bytes());
        self.root.join("tags").join(format!("{}.json", &key[7..]))
    }

    /// The pin of `tag`, if one was recorded (an unreadable one counts as none).
    pub fn pin(&self, tag: &str) -> Option<Pin> {
        let text = fs::read(self.pin_path(tag)).ok()?;
        serde_json::from_slice::<Pin>(&text)
            .ok()
            .filter(|pin| pin.tag == tag && valid_digest(&pin.digest))
    }

    /// Records that `tag` points to `digest`.
    pub fn set_pin(&self, tag: &str, digest: &str) -> io::Result<()> {
        let path = self.pin_path(tag);
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir)?;
        let pin = Pin {
            tag: tag.to_owned(),
            digest: digest.to_owned(),
            pinned_at: crate::manifest::now_rfc3339(),
        };
        let json = serde_json::to_vec_pretty(&pin).map_err(io::Error::other)?;
        let temp = path.with_extension(format!("tmp-{}", std::process::id()));
        fs::write(&temp, json)?;
        fs::rename(&temp, &path)
    }
}

impl BlobWriter {
    /// Appends bytes, hashing them.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("blob already committed"))?;
        file.write_all(data)?;
        self.hasher.update(data);
        self.written += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The digest of what was written.
    pub fn digest(&self) -> String {
        format!("sha256:{}", hex(&self.hasher.clone().finalize()))
    }

    /// Flushes the file to disk and renames it under its digest. The caller has
    /// compared [`BlobWriter::digest`] with the expected one.
    pub fn commit(mut self) -> io::Result<()> {
        if let Some(file) = self.file.take() {
            file.sync_all()?;
        }
        fs::rename(&self.temp, &self.dest)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // Not committed: a partial or mismatched download must never look cached.
        if self.file.is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_stored_by_digest_and_an_abandoned_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let digest = sha256_digest(b"hello");
        assert!(!store.has(&digest));
        let mut writer = store.writer(&digest).unwrap();
        writer.write(b"hel").unwrap();
        drop(writer);
        assert!(!store.has(&digest));
        let blobs = dir.path().join("oci/blobs/sha256");
        assert_eq!(fs::read_dir(&blobs).unwrap().count(), 0, "temp file left");
        let mut writer = store.writer(&digest).unwrap();
        writer.write(b"hel").unwrap();
        writer.write(b"lo").unwrap();
        assert_eq!((writer.written(), writer.digest()), (5, digest.clone()));
        writer.commit().unwrap();
        assert_eq!(store.read(&digest).unwrap(), b"hello");
    }

    #[test]
    fn only_sha256_digests_name_files() {
        assert!(valid_digest(&sha256_digest(b"")));
        for bad in [
            "sha256:../../etc/passwd",
            "sha256:ABCDEF",
            "sha512:00",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}/", "a".repeat(63)),
        ] {
            assert!(!valid_digest(bad), "{bad}");
        }
    }

    #[test]
    fn pins_round_trip_per_tag() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let digest = sha256_digest(b"m");
        assert_eq!(store.pin("r/x:1"), None);
        store.set_pin("r/x:1", &digest).unwrap();
        assert_eq!(store.pin("r/x:1").map(|p| p.digest), Some(digest));
        assert_eq!(store.pin("r/x:2"), None);
    }
}
