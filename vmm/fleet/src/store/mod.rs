//! Checkpoints in an S3-compatible object store, so any node can branch any
//! checkpoint.
//!
//! Layout under `s3://BUCKET/PREFIX`:
//! - `PREFIX/blobs/sha256/<hex>`: content-addressed blobs, zstd-compressed; `<hex>`
//!   is the digest of the *uncompressed* content, so the same bytes from any node or
//!   checkpoint are one object ([`transfer`] asks with HEAD before it uploads).
//! - `PREFIX/checkpoints/<id>.json`: a [`StoredCheckpoint`] naming the blobs of
//!   every file; `PREFIX/parked/<sandbox id>.json` the same for the image of a
//!   hibernated sandbox handed to the fleet ([`CheckpointStore::parked`]). It is written **last**, after every blob is in: a checkpoint whose
//!   upload failed halfway has no manifest and is never listed (its blobs stay, as
//!   garbage for a collector this module does not have).
//!
//! Files are uploaded sparse: only their allocated runs ([`extents`]), packed into
//! chunks of at most [`extents::CHUNK_BYTES`]. A download checks the manifest
//! ([`manifest`]), refuses a checkpoint made by another QEMU or machine type before
//! fetching anything, and checks every blob against its digest: a blob that does not
//! match fails the download, and the caller removes what was written.
//!
//! Every call has a short connect timeout and two retries, so a store that is down
//! fails in seconds with [`StoreError::Unreachable`], never hangs a claim.

pub mod extents;
pub mod gc;
pub mod manifest;
pub mod transfer;

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt as _;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt as _, RetryConfig};

pub use manifest::{ManifestError, StoredCheckpoint, StoredFile};
pub use transfer::{DownloadReport, Upload, UploadReport};

/// How long connecting to the store may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one request (a 4 MiB blob at worst) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Retries of a failed request (a store that is down fails after these).
pub const RETRIES: usize = 2;

/// Blobs moved at once per file.
pub const PARALLEL_BLOBS: usize = 4;

/// Where the store is and how to reach it, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The bucket.
    pub bucket: String,
    /// The key prefix inside it (no leading or trailing `/`; may be empty).
    pub prefix: String,
    /// The endpoint of a store other than AWS (`http://127.0.0.1:8333`).
    pub endpoint: Option<String>,
    /// The region.
    pub region: String,
    /// Path-style requests (`ENDPOINT/BUCKET/KEY`), as most non-AWS stores want;
    /// else virtual-hosted (`BUCKET.ENDPOINT/KEY`).
    pub path_style: bool,
    /// Plain HTTP allowed (a store on loopback).
    pub allow_http: bool,
    /// Static credentials; `None`: the provider chain (instance metadata, ...).
    pub credentials: Option<Credentials>,
}

/// An access key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url())
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("allow_http", &self.allow_http)
            .field(
                "access_key_id",
                &self.credentials.as_ref().map(|c| &c.access_key_id),
            )
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl StoreConfig {
    /// `s3://BUCKET/PREFIX` → bucket and prefix.
    pub fn parse_url(url: &str) -> Result<(String, String), String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{url:?} is not s3://BUCKET/PREFIX"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(format!("{bucket:?} is not an S3 bucket name"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|part| part == ".." || part == ".") || prefix.contains("//") {
            return Err(format!("{prefix:?} is not a key prefix"));
        }
        Ok((bucket.to_owned(), prefix.to_owned()))
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer, or refused the request.
    #[error("The object store {store} is unreachable: {why}")]
    Unreachable {
        /// `s3://BUCKET/PREFIX` (and the endpoint).
        store: String,
        /// What failed.
        why: String,
    },
    /// The client could not be made from the configuration.
    #[error("Cannot use the object store {store}: {why}")]
    Config {
        /// `s3://BUCKET/PREFIX`.
        store: String,
        /// What is wrong.
        why: String,
    },
    /// No such checkpoint in the store.
    #[error("No checkpoint {id} in the object store")]
    NotFound {
        /// The id.
        id: String,
    },
    /// The stored manifest is unusable.
    #[error("The stored manifest of checkpoint {id} is unusable")]
    Manifest {
        /// The id.
        id: String,
        /// Why.
        #[source]
        error: ManifestError,
    },
    /// A blob's content is not what its digest says.
    #[error("Checkpoint {id} is refused: blob {sha256} of its {file} fails its digest check ({why}); nothing of it was kept")]
    Tampered {
        /// The checkpoint.
        id: String,
        /// The file the blob belongs to.
        file: String,
        /// The digest the manifest gives.
        sha256: String,
        /// What was found instead.
        why: String,
    },
    /// Made by another QEMU or machine type than this node's.
    #[error("Checkpoint {id} cannot be restored here: {why}")]
    Incompatible {
        /// The checkpoint.
        id: String,
        /// What differs.
        why: String,
    },
    /// A local file could not be read or written.
    #[error("Cannot {what} {}", path.display())]
    Local {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
}

/// The checkpoints in one store; cloning shares the client.
#[derive(Clone)]
pub struct CheckpointStore {
    client: Arc<dyn ObjectStore>,
    /// Shown in errors: `s3://BUCKET/PREFIX at ENDPOINT`.
    name: String,
    prefix: String,
    /// The manifests' folder: `checkpoints`, or `parked`.
    kind: &'static str,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("store", &self.name)
            .finish_non_exhaustive()
    }
}

impl CheckpointStore {
    /// A client of the store `config` names (nothing is sent yet).
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let name = match &config.endpoint {
            Some(endpoint) => format!("{} at {endpoint}", config.url()),
            None => config.url(),
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_allow_http(config.allow_http)
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_allow_http(config.allow_http),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(1),
                    base: 2.0,
                },
                max_retries: RETRIES,
                retry_timeout: Duration::from_secs(10),
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(credentials) = &config.credentials {
            builder = builder
                .with_access_key_id(&credentials.access_key_id)
                .with_secret_access_key(&credentials.secret_access_key);
            if let Some(token) = &credentials.session_token {
                builder = builder.with_token(token);
            }
        }
        let client = builder.build().map_err(|error| StoreError::Config {
            store: name.clone(),
            why: error.to_string(),
        })?;
        Ok(Self {
            client: Arc::new(client),
            name,
            prefix: config.prefix.clone(),
            kind: "checkpoints",
        })
    }

    /// A store in memory (object_store's own), for unit tests of what moves.
    #[cfg(test)]
    pub(crate) fn in_memory(prefix: &str) -> Self {
        Self {
            client: Arc::new(object_store::memory::InMemory::new()),
            name: "memory".to_owned(),
            prefix: prefix.to_owned(),
            kind: "checkpoints",
        }
    }

    /// The same store's parked sandbox images: manifests under `PREFIX/parked/`,
    /// blobs shared with the checkpoints.
    pub fn parked(&self) -> Self {
        Self {
            kind: "parked",
            ..self.clone()
        }
    }

    /// The same store's published templates: manifests under `PREFIX/templates/`.
    pub fn templates(&self) -> Self {
        Self {
            kind: "templates",
            ..self.clone()
        }
    }

    /// `s3://BUCKET/PREFIX at ENDPOINT`.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn key(&self, rest: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rest)
        } else {
            ObjectPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    /// `PREFIX/blobs/sha256/<hex>`.
    pub fn blob_key(&self, sha256: &str) -> String {
        self.key(&format!("blobs/sha256/{sha256}")).to_string()
    }

    /// `PREFIX/checkpoints/<id>.json` (`PREFIX/parked/<id>.json` for parked images).
    pub fn manifest_key(&self, id: &str) -> String {
        self.key(&format!("{}/{id}.json", self.kind)).to_string()
    }

    fn unreachable(&self, what: &str, error: &object_store::Error) -> StoreError {
        StoreError::Unreachable {
            store: self.name.clone(),
            why: format!("{what}: {error}"),
        }
    }

    /// The stored manifest of `id`, when there is one.
    pub async fn manifest(&self, id: &str) -> Result<Option<StoredCheckpoint>, StoreError> {
        if !manifest::safe_name(id) {
            return Ok(None);
        }
        let key = ObjectPath::from(self.manifest_key(id));
        let bytes = match self.client.get(&key).await {
            Ok(found) => found
                .bytes()
                .await
                .map_err(|e| self.unreachable("read a manifest", &e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(self.unreachable("read a manifest", &error)),
        };
        let manifest = StoredCheckpoint::parse(&bytes).map_err(|error| StoreError::Manifest {
            id: id.to_owned(),
            error,
        })?;
        if manifest.id != id {
            return Err(StoreError::Manifest {
                id: id.to_owned(),
                error: ManifestError::Invalid(format!("it names checkpoint {}", manifest.id)),
            });
        }
        Ok(Some(manifest))
    }

    /// The ids of every checkpoint whose manifest is in the store.
    pub async fn list(&self) -> Result<Vec<String>, StoreError> {
        let prefix = self.key(self.kind);
        let listed: Vec<object_store::ObjectMeta> = self
            .client
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.unreachable("list the checkpoints", &e))?;
        let mut ids: Vec<String> = listed
            .iter()
            .filter_map(|meta| meta.location.filename())
            .filter_map(|name| name.strip_suffix(".json"))
            .filter(|id| manifest::safe_name(id))
            .map(str::to_owned)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Removes the manifest of `id`: the checkpoint is no longer listed anywhere
    /// (its blobs stay). True when there was one.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        if !manifest::safe_name(id) {
            return Ok(false);
        }
        let key = ObjectPath::from(self.manifest_key(id));
        match self.client.head(&key).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(error) => return Err(self.unreachable("look up a manifest", &error)),
        }
        self.client
            .delete(&key)
            .await
            .map_err(|e| self.unreachable("delete a manifest", &e))?;
        Ok(true)
    }

    /// Refuses `manifest` unless this node's QEMU (`major.minor.micro`) and machine
    /// type made it.
    pub fn check_compatible(
        manifest: &StoredCheckpoint,
        qemu_version: Option<&str>,
        machine: &str,
    ) -> Result<(), StoreError> {
        let refuse = |why: String| {
            Err(StoreError::Incompatible {
                id: manifest.id.clone(),
                why,
            })
        };
        if manifest.machine != machine {
            return refuse(format!(
                "it was made on a {} machine and this is {machine}",
                manifest.machine
            ));
        }
        match qemu_version {
            Some(here) if here != manifest.qemu_version => refuse(format!(
                "it was made by QEMU {} and this node runs QEMU {here}: QEMU restores only its own version's state",
                manifest.qemu_version
            )),
            None => refuse("this node's QEMU version cannot be told".to_owned()),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn store_urls_name_a_bucket_and_a_prefix() {
        let parse = StoreConfig::parse_url;
        assert_eq!(
            parse("s3://ckpt/fleet/one/").unwrap(),
            ("ckpt".into(), "fleet/one".into())
        );
        assert_eq!(parse("s3://ckpt").unwrap(), ("ckpt".into(), String::new()));
        assert!(parse("http://ckpt/x").unwrap_err().contains("s3://"));
        assert!(parse("s3://Bad_Bucket/x")
            .unwrap_err()
            .contains("bucket name"));
        assert!(parse("s3://ckpt/a/../b").unwrap_err().contains("prefix"));
    }

    #[test]
    fn a_checkpoint_of_another_qemu_or_machine_is_refused() {
        let manifest = StoredCheckpoint {
            format: manifest::FORMAT,
            id: "c1".into(),
            qemu_version: "7.2.22".into(),
            machine: "x86_64".into(),
            node_id: String::new(),
            created_at_unix_ms: 0,
            meta: serde_json::Value::Null,
            files: Vec::new(),
        };
        let check = |qemu, machine| CheckpointStore::check_compatible(&manifest, qemu, machine);
        assert!(check(Some("7.2.22"), "x86_64").is_ok());
        let qemu = check(Some("8.0.0"), "x86_64").unwrap_err().to_string();
        assert!(
            qemu.contains("QEMU 7.2.22") && qemu.contains("8.0.0"),
            "{qemu}"
        );
        let machine = check(Some("7.2.22"), "aarch64").unwrap_err().to_string();
        assert!(machine.contains("x86_64 machine"), "{machine}");
        assert!(check(None, "x86_64").is_err());
    }

    #[test]
    fn the_secret_key_is_never_in_debug_output() {
        let config = StoreConfig {
            bucket: "ckpt".into(),
            prefix: "p".into(),
            endpoint: None,
            region: "us-east-1".into(),
            path_style: true,
            allow_http: false,
            credentials: Some(Credentials {
                access_key_id: "AKID".into(),
                secret_access_key: "very-secret".into(),
                session_token: Some("tok".into()),
            }),
        };
        let shown = format!("{config:?}");
        assert!(shown.contains("AKID") && !shown.contains("very-secret") && !shown.contains("tok"));
    }
}
