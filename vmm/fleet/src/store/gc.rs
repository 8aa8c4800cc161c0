//! The store's garbage: blobs no manifest names (a deleted checkpoint's, a parked
//! sandbox's once it woke, a template's once deleted, an upload that failed
//! halfway), removed by [`CheckpointStore::collect_garbage`].
//!
//! Every manifest of every kind (checkpoints, parked images, templates) is read
//! first; a manifest that cannot be read stops the collection before anything is
//! deleted. Then every blob that none names and that is older than the grace is
//! deleted. The grace protects uploads under way: their blobs go up before their
//! manifest. An upload reuses a blob already in the store only when that blob is
//! younger than [`REFRESH_AFTER`] (half the shortest grace); an older one is
//! written again, which makes it young. So a blob an upload relies on is never
//! older than the grace while that upload runs, as long as an upload takes less
//! than [`MIN_GRACE`] minus [`REFRESH_AFTER`].

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;

use super::manifest::{is_digest, StoredCheckpoint};
use super::{CheckpointStore, StoreError};

/// The shortest grace a collection accepts.
pub const MIN_GRACE: Duration = Duration::from_secs(60 * 60);

/// A reused blob older than this is uploaded again.
pub const REFRESH_AFTER: Duration = Duration::from_secs(30 * 60);

/// The kinds of manifests that name blobs.
const KINDS: [&str; 3] = ["checkpoints", "parked", "templates"];

/// What a collection found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Manifests read.
    pub manifests: usize,
    /// Blobs in the store.
    pub blobs: usize,
    /// Blobs some manifest names.
    pub referenced: usize,
    /// Unnamed blobs spared because they are younger than the grace.
    pub young: usize,
    /// Blobs deleted (or, in a dry run, that would be).
    pub deleted: usize,
    /// Their bytes, as stored (compressed).
    pub deleted_bytes: u64,
    /// Whether nothing was deleted on purpose.
    pub dry_run: bool,
}

/// Whether a blob written at `modified` (Unix seconds) must be written again
/// before an upload relies on it.
pub(crate) fn needs_refresh(modified: i64) -> bool {
    age(modified) > REFRESH_AFTER
}

/// How long ago `modified` (Unix seconds) was; zero for a time ahead of this
/// host's clock.
fn age(modified: i64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Duration::from_secs(now.saturating_sub(u64::try_from(modified).unwrap_or(0)))
}

impl CheckpointStore {
    /// Deletes the blobs no manifest names that are older than `grace`; with
    /// `dry_run`, only counts them. A grace below [`MIN_GRACE`] can delete the
    /// blobs of an upload under way: callers that serve operators refuse it.
    pub async fn collect_garbage(
        &self,
        grace: Duration,
        dry_run: bool,
    ) -> Result<GcReport, StoreError> {
        let mut report = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let mut named = BTreeSet::new();
        for kind in KINDS {
            let prefix = self.key(kind);
            let listed: Vec<object_store::ObjectMeta> = self
                .client
                .list(Some(&prefix))
                .try_collect()
                .await
                .map_err(|e| self.unreachable("list the manifests", &e))?;
            for meta in listed {
                let found = match self.client.get(&meta.location).await {
                    Ok(found) => found,
                    // Deleted since the listing: it names nothing any more.
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(error) => return Err(self.unreachable("read a manifest", &error)),
                };
                let bytes = found
                    .bytes()
                    .await
                    .map_err(|e| self.unreachable("read a manifest", &e))?;
                let manifest =
                    StoredCheckpoint::parse(&bytes).map_err(|error| StoreError::Manifest {
                        id: meta.location.to_string(),
                        error,
                    })?;
                report.manifests += 1;
                named.extend(
                    manifest
                        .files
                        .iter()
                        .flat_map(|file| &file.chunks)
                        .map(|chunk| chunk.sha256.clone()),
                );
            }
        }
        let prefix = self.key("blobs/sha256");
        let blobs: Vec<object_store::ObjectMeta> = self
            .client
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.unreachable("list the blobs", &e))?;
        for blob in blobs {
            let Some(digest) = blob.location.filename().filter(|name| is_digest(name)) else {
                continue;
            };
            report.blobs += 1;
            if named.contains(digest) {
                report.referenced += 1;
                continue;
            }
            if age(blob.last_modified.timestamp()) <= grace {
                report.young += 1;
                continue;
            }
            // The listing may be old by now: an upload may have written this blob
            // again (to rely on it) since. Asked again just before it goes.
            match self.client.head(&blob.location).await {
                Ok(now) if age(now.last_modified.timestamp()) > grace => {}
                Ok(_) => {
                    report.young += 1;
                    continue;
                }
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(error) => return Err(self.unreachable("look up a blob", &error)),
            }
            if !dry_run {
                match self.client.delete(&blob.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(error) => return Err(self.unreachable("delete a blob", &error)),
                }
            }
            report.deleted += 1;
            report.deleted_bytes += blob.size;
        }
        tracing::info!(?report, "store garbage collected");
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::transfer::Upload;
    use object_store::path::Path as ObjectPath;

    #[test]
    fn blobs_no_manifest_names_go_once_past_the_grace_and_named_ones_stay() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = CheckpointStore::in_memory("p");
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("state");
            std::fs::write(&file, b"kept by a manifest").unwrap();
            store
                .upload(Upload {
                    id: "c1".into(),
                    qemu_version: "7.2.22".into(),
                    machine: "x86_64".into(),
                    node_id: "a".into(),
                    meta: serde_json::Value::Null,
                    files: vec![("state".into(), file)],
                })
                .await
                .unwrap();
            let orphan = ObjectPath::from(store.blob_key(&"0".repeat(64)));
            store
                .client
                .put(&orphan, b"orphan".to_vec().into())
                .await
                .unwrap();
            // Just written: young, spared.
            let report = store.collect_garbage(MIN_GRACE, false).await.unwrap();
            assert_eq!((report.manifests, report.blobs), (1, 2), "{report:?}");
            assert_eq!((report.referenced, report.young, report.deleted), (1, 1, 0));
            assert!(store.client.head(&orphan).await.is_ok());
            // Past the grace: the orphan goes, the named blob stays.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let dry = store.collect_garbage(Duration::ZERO, true).await.unwrap();
            assert_eq!((dry.deleted, dry.dry_run), (1, true), "{dry:?}");
            assert!(store.client.head(&orphan).await.is_ok());
            let report = store.collect_garbage(Duration::ZERO, false).await.unwrap();
            assert_eq!((report.referenced, report.deleted), (1, 1), "{report:?}");
            assert!(store.client.head(&orphan).await.is_err());
            assert!(store.manifest("c1").await.unwrap().is_some());
            let again = store.collect_garbage(Duration::ZERO, false).await.unwrap();
            assert_eq!((again.blobs, again.deleted), (1, 0), "{again:?}");
            // A blob reused long after it was written is written again.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            assert!(!needs_refresh(i64::try_from(now).unwrap()));
            assert!(needs_refresh(0));
        });
    }
}
