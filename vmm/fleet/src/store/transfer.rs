//! Moving a checkpoint's files: upload (sparse chunks, HEAD before PUT, the
//! manifest last) and download (each blob checked against its digest).

use std::fs::File;
use std::os::unix::fs::{
    DirBuilderExt as _, FileExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt as _, PutPayload};
use sha2::{Digest as _, Sha256};

use super::extents::{data_extents, pack, Extent, CHUNK_BYTES};
use super::manifest::{safe_path, Chunk, StoredCheckpoint, StoredFile, FORMAT};
use super::{CheckpointStore, StoreError, PARALLEL_BLOBS};

/// zstd's level for blobs: level 3 (its default) packs a guest's RAM ~3x at
/// ~300 MB/s on one core, faster than a store link usually is.
const ZSTD_LEVEL: i32 = 3;

/// What to upload.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The checkpoint's id.
    pub id: String,
    /// The QEMU version that made it.
    pub qemu_version: String,
    /// The machine type.
    pub machine: String,
    /// This node's id.
    pub node_id: String,
    /// The checkpoint's own manifest.
    pub meta: serde_json::Value,
    /// Its files: name in the checkpoint's folder → where it is here.
    pub files: Vec<(String, PathBuf)>,
}

/// What an upload moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UploadReport {
    /// Data bytes of every file (holes excluded, uncompressed).
    pub data_bytes: u64,
    /// Bytes sent (compressed blobs not already in the store).
    pub sent_bytes: u64,
    /// Blobs the checkpoint has.
    pub blobs: usize,
    /// Blobs the store lacked, and got.
    pub blobs_sent: usize,
    /// From the first HEAD to the manifest's PUT, in milliseconds.
    pub took_ms: u64,
}

/// What a download moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DownloadReport {
    /// Data bytes written (uncompressed).
    pub data_bytes: u64,
    /// Bytes received (compressed).
    pub received_bytes: u64,
    /// Blobs fetched.
    pub blobs: usize,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
}

fn millis(took: Duration) -> u64 {
    u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn local(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_owned();
    move |error| StoreError::Local { what, path, error }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| {
            Err(StoreError::Local {
                what: "finish a blocking task for",
                path: PathBuf::new(),
                error: std::io::Error::other(join),
            })
        })
}

/// One chunk uploaded: its manifest entry, and the bytes sent (0: it was there).
struct Sent {
    chunk: Chunk,
    sent: u64,
}

impl CheckpointStore {
    /// Uploads `upload`'s files and then its manifest; returns what moved.
    pub async fn upload(&self, upload: Upload) -> Result<UploadReport, StoreError> {
        let started = Instant::now();
        let mut report = UploadReport::default();
        let mut files = Vec::with_capacity(upload.files.len());
        for (name, path) in &upload.files {
            if !safe_path(name) {
                return Err(StoreError::Local {
                    what: "upload (its name is not a plain file name or DIR/NAME)",
                    path: path.clone(),
                    error: std::io::Error::from(std::io::ErrorKind::InvalidInput),
                });
            }
            let (stored, sent) = self.upload_file(name, path).await?;
            report.blobs += stored.chunks.len();
            report.blobs_sent += sent.iter().filter(|s| **s > 0).count();
            report.sent_bytes += sent.iter().sum::<u64>();
            report.data_bytes += stored.chunks.iter().map(|c| c.bytes).sum::<u64>();
            files.push(stored);
        }
        let manifest = StoredCheckpoint {
            format: FORMAT,
            id: upload.id.clone(),
            qemu_version: upload.qemu_version,
            machine: upload.machine,
            node_id: upload.node_id,
            created_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            meta: upload.meta,
            files,
        };
        // Last: from here on the checkpoint is listed, and every blob it names is in.
        self.client
            .put(
                &ObjectPath::from(self.manifest_key(&upload.id)),
                PutPayload::from(manifest.encode()),
            )
            .await
            .map_err(|e| self.unreachable("write the manifest", &e))?;
        report.took_ms = millis(started.elapsed());
        tracing::info!(
            checkpoint = %upload.id,
            data_bytes = report.data_bytes,
            sent_bytes = report.sent_bytes,
            blobs = report.blobs,
            blobs_sent = report.blobs_sent,
            took_ms = report.took_ms,
            "checkpoint uploaded to the store"
        );
        Ok(report)
    }

    /// One file: its allocated runs in chunks, each blob sent unless the store has
    /// it. Returns its manifest entry and the bytes sent per chunk.
    async fn upload_file(
        &self,
        name: &str,
        path: &Path,
    ) -> Result<(StoredFile, Vec<u64>), StoreError> {
        let open = path.to_owned();
        let (file, size, mode, chunks) = blocking(move || {
            let file = File::open(&open).map_err(local("open", &open))?;
            let meta = file.metadata().map_err(local("read the size of", &open))?;
            let extents =
                data_extents(&file, meta.len()).map_err(local("find the data in", &open))?;
            let mode = meta.permissions().mode() & 0o777;
            Ok((file, meta.len(), mode, pack(&extents, CHUNK_BYTES)))
        })
        .await?;
        let file = Arc::new(file);
        let results: Vec<Sent> = futures::stream::iter(chunks)
            .map(|extents| self.upload_chunk(file.clone(), path.to_owned(), extents))
            .buffered(PARALLEL_BLOBS)
            .try_collect()
            .await?;
        let sent = results.iter().map(|s| s.sent).collect();
        Ok((
            StoredFile {
                name: name.to_owned(),
                size,
                mode,
                chunks: results.into_iter().map(|s| s.chunk).collect(),
            },
            sent,
        ))
    }

    async fn upload_chunk(
        &self,
        file: Arc<File>,
        path: PathBuf,
        extents: Vec<Extent>,
    ) -> Result<Sent, StoreError> {
        let read = extents.clone();
        let (data, sha256) = blocking(move || {
            let mut data =
                Vec::with_capacity(usize::try_from(super::extents::total(&read)).unwrap_or(0));
            for extent in &read {
                let start = data.len();
                data.resize(start + usize::try_from(extent.len).unwrap_or(0), 0);
                file.read_exact_at(&mut data[start..], extent.offset)
                    .map_err(local("read", &path))?;
            }
            let sha256 = hex(&Sha256::digest(&data));
            Ok((data, sha256))
        })
        .await?;
        let chunk = Chunk {
            sha256: sha256.clone(),
            bytes: u64::try_from(data.len()).unwrap_or(u64::MAX),
            extents,
        };
        let key = ObjectPath::from(self.blob_key(&sha256));
        match self.client.head(&key).await {
            // A blob written long ago is written again: the collector
            // (`super::gc`) spares only blobs younger than its grace, and this
            // upload's manifest is not there yet to name it.
            Ok(meta) if !super::gc::needs_refresh(meta.last_modified.timestamp()) => {
                return Ok(Sent { chunk, sent: 0 })
            }
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(self.unreachable("look up a blob", &error)),
        }
        let compressed = blocking(move || {
            zstd::bulk::compress(&data, ZSTD_LEVEL).map_err(|error| StoreError::Local {
                what: "compress a blob of",
                path: PathBuf::new(),
                error,
            })
        })
        .await?;
        let sent = u64::try_from(compressed.len()).unwrap_or(u64::MAX);
        self.client
            .put(&key, PutPayload::from(Bytes::from(compressed)))
            .await
            .map_err(|e| self.unreachable("upload a blob", &e))?;
        Ok(Sent { chunk, sent })
    }

    /// Writes every file of `manifest` into the folder `into` (which exists and is
    /// the caller's to remove on failure), checking each blob against its digest.
    pub async fn download(
        &self,
        manifest: &StoredCheckpoint,
        into: &Path,
    ) -> Result<DownloadReport, StoreError> {
        let started = Instant::now();
        let mut report = DownloadReport::default();
        for stored in &manifest.files {
            let path = into.join(&stored.name);
            let (create, mode, size) = (path.clone(), stored.mode & 0o777, stored.size);
            // `DIR/NAME` (checked by the manifest's parse: one plain folder inside).
            let nested = stored.name.contains('/');
            let file = blocking(move || {
                if nested {
                    if let Some(parent) = create.parent() {
                        std::fs::DirBuilder::new()
                            .mode(0o700)
                            .recursive(true)
                            .create(parent)
                            .map_err(local("create the folder of", &create))?;
                    }
                }
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&create)
                    .map_err(local("create", &create))?;
                file.set_len(size).map_err(local("size", &create))?;
                Ok(file)
            })
            .await?;
            let file = Arc::new(file);
            let received: Vec<u64> = futures::stream::iter(stored.chunks.iter().cloned())
                .map(|chunk| {
                    self.download_chunk(&manifest.id, &stored.name, chunk, file.clone(), &path)
                })
                .buffer_unordered(PARALLEL_BLOBS)
                .try_collect()
                .await?;
            let sync = path.clone();
            blocking(move || file.sync_all().map_err(local("sync", &sync))).await?;
            report.blobs += received.len();
            report.received_bytes += received.iter().sum::<u64>();
            report.data_bytes += stored.chunks.iter().map(|c| c.bytes).sum::<u64>();
        }
        report.took_ms = millis(started.elapsed());
        Ok(report)
    }

    /// One blob: fetched, decompressed (never past its declared length), checked,
    /// written at its extents. Returns the bytes received.
    async fn download_chunk(
        &self,
        id: &str,
        file_name: &str,
        chunk: Chunk,
        file: Arc<File>,
        path: &Path,
    ) -> Result<u64, StoreError> {
        let key = ObjectPath::from(self.blob_key(&chunk.sha256));
        let sha256 = chunk.sha256.clone();
        let tampered = |why: String| StoreError::Tampered {
            id: id.to_owned(),
            file: file_name.to_owned(),
            sha256,
            why,
        };
        // A blob larger than its chunk can compress to is refused before it is
        // read: a hostile store cannot make the node hold a huge object.
        let capacity = usize::try_from(chunk.bytes).unwrap_or(usize::MAX);
        let most = u64::try_from(zstd::zstd_safe::compress_bound(capacity)).unwrap_or(u64::MAX);
        let compressed = match self.client.get(&key).await {
            Ok(found) if found.meta.size > most => {
                return Err(tampered(format!(
                    "the blob is {} bytes, more than {most}, the most its {} bytes compress to",
                    found.meta.size, chunk.bytes
                )))
            }
            Ok(found) => found
                .bytes()
                .await
                .map_err(|e| self.unreachable("read a blob", &e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(tampered("the blob is missing from the store".to_owned()))
            }
            Err(error) => return Err(self.unreachable("read a blob", &error)),
        };
        let received = u64::try_from(compressed.len()).unwrap_or(u64::MAX);
        let path = path.to_owned();
        let result = blocking(move || {
            let data = match zstd::bulk::decompress(&compressed, capacity) {
                Ok(data) => data,
                Err(error) => return Ok(Err(format!("it does not decompress: {error}"))),
            };
            let found = hex(&Sha256::digest(&data));
            if data.len() != capacity || found != chunk.sha256 {
                return Ok(Err(format!("its {} bytes have digest {found}", data.len())));
            }
            let mut at = 0usize;
            for extent in &chunk.extents {
                let len = usize::try_from(extent.len).unwrap_or(0);
                file.write_all_at(&data[at..at + len], extent.offset)
                    .map_err(local("write", &path))?;
                at += len;
            }
            Ok(Ok(()))
        })
        .await?;
        result.map_err(tampered)?;
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn digests_are_lowercase_hex_of_sha256() {
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// A checkpoint folder: a sparse 64 MiB `ram` with 9 MiB written in three runs,
    /// and a small `state`.
    fn folder(dir: &Path) -> Vec<(String, PathBuf)> {
        let ram = dir.join("ram");
        let file = File::create(&ram).unwrap();
        file.set_len(64 * MIB).unwrap();
        let pattern = |seed: u8, len: u64| -> Vec<u8> {
            (0..len)
                .map(|i| seed.wrapping_add((i % 251) as u8))
                .collect()
        };
        file.write_all_at(&pattern(1, 5 * MIB), MIB).unwrap();
        file.write_all_at(&pattern(2, 3 * MIB), 20 * MIB).unwrap();
        file.write_all_at(&pattern(3, MIB), 63 * MIB).unwrap();
        file.sync_all().unwrap();
        let state = dir.join("state");
        std::fs::write(&state, b"device state").unwrap();
        vec![("ram".into(), ram), ("state".into(), state)]
    }

    fn upload(files: Vec<(String, PathBuf)>) -> Upload {
        Upload {
            id: "c1".into(),
            qemu_version: "7.2.22".into(),
            machine: "x86_64".into(),
            node_id: "a".into(),
            meta: serde_json::json!({"id": "c1"}),
            files,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_sparse_folder_goes_up_as_its_data_once_and_comes_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        std::fs::create_dir(&source).unwrap();
        let files = folder(&source);
        let store = CheckpointStore::in_memory("fleet");
        runtime().block_on(async {
            let sent = store.upload(upload(files.clone())).await.unwrap();
            // The written runs only: 9 MiB of the 64, plus the state.
            assert_eq!(sent.data_bytes, 9 * MIB + 12);
            assert!(sent.sent_bytes < sent.data_bytes, "{sent:?}");
            assert!(sent.blobs >= 3 && sent.blobs_sent == sent.blobs, "{sent:?}");
            // Again: every blob is there already, only the manifest is written.
            let again = store.upload(upload(files)).await.unwrap();
            assert_eq!((again.blobs_sent, again.sent_bytes), (0, 0), "{again:?}");

            let manifest = store.manifest("c1").await.unwrap().unwrap();
            assert_eq!(store.list().await.unwrap(), vec!["c1".to_owned()]);
            let into = dir.path().join("into");
            std::fs::create_dir(&into).unwrap();
            let got = store.download(&manifest, &into).await.unwrap();
            assert_eq!(got.data_bytes, 9 * MIB + 12);
            for name in ["ram", "state"] {
                assert!(
                    std::fs::read(source.join(name)).unwrap()
                        == std::fs::read(into.join(name)).unwrap(),
                    "{name} differs"
                );
            }
            // Still sparse: the holes were not written.
            use std::os::unix::fs::MetadataExt as _;
            let blocks = std::fs::metadata(into.join("ram")).unwrap().blocks() * 512;
            assert!(blocks < 16 * MIB, "{blocks} bytes allocated");
            assert!(store.delete("c1").await.unwrap());
            assert!(!store.delete("c1").await.unwrap());
            assert_eq!(store.manifest("c1").await.unwrap(), None);
        });
    }

    #[test]
    fn a_blob_altered_in_the_store_fails_its_digest_check() {
        let dir = tempfile::tempdir().unwrap();
        let files = folder(dir.path());
        let store = CheckpointStore::in_memory("");
        runtime().block_on(async {
            store.upload(upload(files)).await.unwrap();
            let manifest = store.manifest("c1").await.unwrap().unwrap();
            let chunk = &manifest.files[0].chunks[1];
            let key = ObjectPath::from(store.blob_key(&chunk.sha256));
            assert!(key.to_string().starts_with("blobs/sha256/"));
            // Valid zstd of other bytes: only the digest tells.
            let other = zstd::bulk::compress(&vec![0u8; 4096], 3).unwrap();
            store.client.put(&key, PutPayload::from(other)).await.unwrap();
            let into = dir.path().join("into");
            std::fs::create_dir(&into).unwrap();
            let error = store.download(&manifest, &into).await.unwrap_err();
            assert!(
                matches!(&error, StoreError::Tampered { sha256, file, .. } if *sha256 == chunk.sha256 && file == "ram"),
                "{error}"
            );
            assert!(error.to_string().contains("digest"), "{error}");
            // Larger than the chunk could compress to: refused before it is read.
            let huge = vec![7u8; usize::try_from(chunk.bytes).unwrap() * 2 + 4096];
            store.client.put(&key, PutPayload::from(huge)).await.unwrap();
            let into = dir.path().join("huge");
            std::fs::create_dir(&into).unwrap();
            let error = store.download(&manifest, &into).await.unwrap_err();
            assert!(matches!(&error, StoreError::Tampered { .. }), "{error}");
            assert!(error.to_string().contains("the most its"), "{error}");
            // Missing altogether: refused too.
            store.client.delete(&key).await.unwrap();
            let into = dir.path().join("again");
            std::fs::create_dir(&into).unwrap();
            let error = store.download(&manifest, &into).await.unwrap_err();
            assert!(error.to_string().contains("missing"), "{error}");
        });
    }
}
