//! A checkpoint as the object store holds it: `PREFIX/checkpoints/<id>.json`, the
//! list of its files, each as chunks of content-addressed blobs.
//!
//! ```json
//! {"format": 1, "id": "…", "qemu_version": "7.2.22", "machine": "x86_64",
//!  "node_id": "a", "created_at_unix_ms": 1, "meta": { …the checkpoint's own manifest… },
//!  "files": [{"name": "ram", "size": 536870912, "mode": 384,
//!             "chunks": [{"sha256": "…", "bytes": 4194304,
//!                         "extents": [{"offset": 0, "len": 4096}, …]}]}]}
//! ```
//!
//! A chunk's blob is the concatenation of its extents' bytes; `sha256` is the digest
//! of that (uncompressed) content, and the blob is stored zstd-compressed at
//! `PREFIX/blobs/sha256/<hex>`. What lies outside every extent is a hole (zeros).
//! [`StoredCheckpoint::parse`] refuses a manifest whose names could leave the
//! checkpoint's folder, whose digests are not digests, or whose extents overlap or
//! pass the file's end, before anything is downloaded.

use serde::{Deserialize, Serialize};

use super::extents::{total, Extent, CHUNK_BYTES};

/// The manifest format this node writes and reads.
pub const FORMAT: u32 = 1;

/// A checkpoint in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredCheckpoint {
    /// [`FORMAT`].
    pub format: u32,
    /// The checkpoint's id.
    pub id: String,
    /// The QEMU version that made it (`major.minor.micro`): only that version
    /// restores it.
    pub qemu_version: String,
    /// The machine type (architecture) it ran on.
    pub machine: String,
    /// The node that uploaded it.
    #[serde(default)]
    pub node_id: String,
    /// When it was uploaded, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// The checkpoint's own manifest, as its node wrote it (opaque here).
    pub meta: serde_json::Value,
    /// Its files.
    pub files: Vec<StoredFile>,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredFile {
    /// Its name in the checkpoint's folder (no `/`).
    pub name: String,
    /// Its length (holes included).
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Its data, in file order.
    pub chunks: Vec<Chunk>,
}

/// One blob's worth of a file's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chunk {
    /// The SHA-256 of the uncompressed blob (64 lowercase hex digits).
    pub sha256: String,
    /// The uncompressed blob's length: the sum of `extents`' lengths.
    pub bytes: u64,
    /// Where its bytes go, in order.
    pub extents: Vec<Extent>,
}

/// A manifest that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of this shape.
    #[error("Undecodable checkpoint manifest")]
    Decode(#[source] serde_json::Error),
    /// Written by a newer format.
    #[error("Checkpoint manifest format {0} is not {FORMAT}")]
    Format(u32),
    /// Not self-consistent.
    #[error("Invalid checkpoint manifest: {0}")]
    Invalid(String),
}

impl StoredCheckpoint {
    /// The manifest as stored.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parses and checks a stored manifest.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(ManifestError::Decode)?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Bytes of data (uncompressed, holes excluded) in every file.
    pub fn data_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| &f.chunks)
            .map(|c| c.bytes)
            .sum()
    }

    fn check(&self) -> Result<(), ManifestError> {
        let invalid = |why: String| Err(ManifestError::Invalid(why));
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format));
        }
        if !safe_name(&self.id) {
            return invalid(format!("checkpoint id {:?}", self.id));
        }
        let mut names = std::collections::BTreeSet::new();
        for file in &self.files {
            if !safe_path(&file.name) {
                return invalid(format!("file name {:?}", file.name));
            }
            if !names.insert(file.name.as_str()) {
                return invalid(format!("file {} listed twice", file.name));
            }
            let mut end = 0u64;
            for chunk in &file.chunks {
                if !is_digest(&chunk.sha256) {
                    return invalid(format!("{}: digest {:?}", file.name, chunk.sha256));
                }
                if chunk.bytes != total(&chunk.extents) || chunk.bytes > CHUNK_BYTES {
                    return invalid(format!(
                        "{}: chunk {} says {} bytes",
                        file.name, chunk.sha256, chunk.bytes
                    ));
                }
                for extent in &chunk.extents {
                    if extent.len == 0 || extent.offset < end || extent.end() > file.size {
                        return invalid(format!(
                            "{}: extent {}+{} overlaps or passes its size {}",
                            file.name, extent.offset, extent.len, file.size
                        ));
                    }
                    end = extent.end();
                }
            }
        }
        Ok(())
    }
}

/// 64 lowercase hex digits.
pub fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A file's path inside a folder: one [`safe_name`], or two joined by `/` (a
/// template's `snapshot/state`): never absolute, never `..`, never hidden.
pub fn safe_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    parts.len() <= 2 && parts.iter().all(|part| safe_name(part))
}

/// A name that stays inside a folder: 1-128 letters, digits, `-`, `_`, `.`, not
/// starting with `.`.
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn digest(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn sample() -> StoredCheckpoint {
        StoredCheckpoint {
            format: FORMAT,
            id: "c1".into(),
            qemu_version: "7.2.22".into(),
            machine: "x86_64".into(),
            node_id: "a".into(),
            created_at_unix_ms: 5,
            meta: serde_json::json!({"id": "c1", "ram": "file"}),
            files: vec![StoredFile {
                name: "ram".into(),
                size: 100,
                mode: 0o600,
                chunks: vec![
                    Chunk {
                        sha256: digest('a'),
                        bytes: 30,
                        extents: vec![
                            Extent { offset: 0, len: 10 },
                            Extent {
                                offset: 50,
                                len: 20,
                            },
                        ],
                    },
                    Chunk {
                        sha256: digest('b'),
                        bytes: 30,
                        extents: vec![Extent {
                            offset: 70,
                            len: 30,
                        }],
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_counts_its_data() {
        let manifest = sample();
        let parsed = StoredCheckpoint::parse(&manifest.encode()).unwrap();
        assert_eq!(parsed, manifest);
        assert_eq!(parsed.data_bytes(), 60);
        // The shape is pinned: the keys other nodes read.
        let json: serde_json::Value = serde_json::from_slice(&manifest.encode()).unwrap();
        assert_eq!(json["files"][0]["chunks"][0]["extents"][1]["offset"], 50);
        assert_eq!(json["qemu_version"], "7.2.22");
        assert_eq!(json["meta"]["ram"], "file");
    }

    #[test]
    fn manifests_that_could_escape_the_folder_or_lie_about_extents_are_refused() {
        let refused = |change: &dyn Fn(&mut StoredCheckpoint)| {
            let mut manifest = sample();
            change(&mut manifest);
            StoredCheckpoint::parse(&manifest.encode())
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&|m| m.files[0].name = "../etc/passwd".into()).contains("file name"));
        for escaping in ["/etc/passwd", "a/../b", "a/b/c", ".hidden/x", "a//b", "a/"] {
            let name = escaping.to_owned();
            assert!(
                refused(&|m| m.files[0].name = name.clone()).contains("file name"),
                "{escaping}"
            );
        }
        let mut nested = sample();
        nested.files[0].name = "snapshot/state".into();
        assert!(StoredCheckpoint::parse(&nested.encode()).is_ok());
        assert!(refused(&|m| m.id = "a/b".into()).contains("checkpoint id"));
        assert!(refused(&|m| m.files[0].chunks[0].sha256 = "ABC".into()).contains("digest"));
        assert!(refused(&|m| m.files[0].chunks[0].bytes = 31).contains("says 31 bytes"));
        assert!(refused(&|m| m.files[0].chunks[1].extents[0].offset = 60).contains("overlaps"));
        assert!(refused(&|m| m.files[0].size = 99).contains("passes its size"));
        assert!(refused(&|m| m.format = 2).contains("format 2"));
        let twice = refused(&|m| {
            let again = m.files[0].clone();
            m.files.push(again);
        });
        assert!(twice.contains("listed twice"), "{twice}");
        assert!(StoredCheckpoint::parse(b"{\"format\": 1}")
            .unwrap_err()
            .to_string()
            .contains("Undecodable"));
        let mut unknown: serde_json::Value = serde_json::from_slice(&sample().encode()).unwrap();
        unknown["surprise"] = serde_json::json!(1);
        assert!(StoredCheckpoint::parse(unknown.to_string().as_bytes()).is_err());
    }
}
