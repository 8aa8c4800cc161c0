//! Talking to the registry: manifests and blobs through the distribution API
//! ([`oci_client::Client`]: token challenges, Basic auth, HTTPS unless the host is
//! named insecure), each checked against its digest and size before the layer cache
//! ([`super::store`]) keeps it. What the cache already holds is not fetched again.

use std::time::Duration;

use futures::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use tracing::debug;

use super::document::Descriptor;
use super::store::{sha256_digest, valid_digest, Store};
use super::{Progress, ProgressSink, RegistryError};

/// Manifests and configs are read whole; no real one comes near this (a manifest
/// with 100 layers is ~20 KiB; configs with long histories a few hundred KiB).
pub const DOCUMENT_MAX_BYTES: u64 = 4 << 20;

/// What a manifest refused by its announced size is called in the error.
pub const MANIFEST_ANNOUNCED: &str = "the manifest (as its Content-Length announces it)";

/// The manifest media types asked for, newest first.
const ACCEPTED: &[&str] = &[
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
];

/// What one pull fetched and found cached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullStats {
    /// Blobs and manifests downloaded.
    pub downloaded: usize,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
    /// Blobs and manifests the cache already held.
    pub cached: usize,
}

/// One registry session.
pub struct Fetcher<'a> {
    client: Client,
    /// For the manifest's HEAD request ([`Fetcher::check_manifest_size`]).
    http: reqwest::Client,
    /// Hosts spoken to over plain HTTP.
    insecure: Vec<String>,
    auth: RegistryAuth,
    store: &'a Store,
    progress: Option<&'a ProgressSink>,
    /// What was fetched so far.
    pub stats: PullStats,
    /// The reference as the user gave it, for errors.
    shown: String,
}

impl std::fmt::Debug for Fetcher<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("reference", &self.shown)
            .finish()
    }
}

impl<'a> Fetcher<'a> {
    /// A client for `shown`'s registry; plain HTTP only for the `insecure` hosts.
    pub fn new(
        shown: String,
        auth: RegistryAuth,
        insecure: &[String],
        store: &'a Store,
        progress: Option<&'a ProgressSink>,
    ) -> Self {
        // reqwest is built without a crypto provider of its own: ring, as every TLS
        // user of the workspace. Installing twice is harmless (the first one stays).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(insecure.to_vec()),
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(120)),
            ..ClientConfig::default()
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_default();
        Self {
            client: Client::new(config),
            http,
            insecure: insecure.to_vec(),
            auth,
            store,
            progress,
            stats: PullStats::default(),
            shown,
        }
    }

    /// The manifest or index at `reference`, with its digest (computed from the
    /// bytes; equal to `expected` when one is given). From the cache when `expected`
    /// is cached.
    pub async fn manifest(
        &mut self,
        reference: &Reference,
        expected: Option<&str>,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        if let Some(digest) = expected {
            if self.store.has(digest) {
                self.stats.cached += 1;
                let bytes = self
                    .store
                    .read(digest)
                    .map_err(|error| RegistryError::Cache {
                        path: self.store.blob_path(digest),
                        error,
                    })?;
                return Ok((bytes, digest.to_owned()));
            }
        }
        self.check_manifest_size(reference).await?;
        debug!(reference = %reference.whole(), "fetching manifest");
        let (body, _) = self
            .client
            .pull_manifest_raw(reference, &self.auth, ACCEPTED)
            .await
            .map_err(|error| match error {
                // The client compares the body with the digest asked for and with
                // the registry's Docker-Content-Digest header.
                OciDistributionError::DigestError(DigestError::VerificationError {
                    expected,
                    actual,
                }) => RegistryError::DigestMismatch {
                    what: "the manifest".into(),
                    expected,
                    actual,
                },
                error => self.classify(error),
            })?;
        if body.len() as u64 > DOCUMENT_MAX_BYTES {
            return Err(RegistryError::TooLarge {
                what: "the manifest".into(),
                bytes: body.len() as u64,
                max: DOCUMENT_MAX_BYTES,
            });
        }
        let digest = sha256_digest(&body);
        if let Some(expected) = expected {
            if digest != expected {
                return Err(RegistryError::DigestMismatch {
                    what: "the manifest".into(),
                    expected: expected.to_owned(),
                    actual: digest,
                });
            }
        }
        self.store
            .put(&digest, &body)
            .map_err(|error| RegistryError::Cache {
                path: self.store.blob_path(&digest),
                error,
            })?;
        self.stats.downloaded += 1;
        self.stats.downloaded_bytes += body.len() as u64;
        Ok((body.to_vec(), digest))
    }

    /// Refuses a manifest the registry announces (`Content-Length` of a HEAD request)
    /// as over [`DOCUMENT_MAX_BYTES`], before any of it is read: the client's
    /// `pull_manifest_raw` reads a body whole, with no limit of its own. A registry
    /// that announces no length, or lies, is still caught after the GET (with the
    /// body in memory); a HEAD that fails leaves the verdict to the GET, which
    /// reports credentials and missing tags in its own words.
    async fn check_manifest_size(&self, reference: &Reference) -> Result<(), RegistryError> {
        let Ok(bearer) = self
            .client
            .auth(reference, &self.auth, RegistryOperation::Pull)
            .await
        else {
            return Ok(());
        };
        let host = reference.resolve_registry();
        let scheme = if self.insecure.iter().any(|insecure| insecure == host) {
            "http"
        } else {
            "https"
        };
        let target = reference.digest().or(reference.tag()).unwrap_or("latest");
        let url = format!(
            "{scheme}://{host}/v2/{}/manifests/{target}",
            reference.repository()
        );
        let mut request = self
            .http
            .head(&url)
            .header(reqwest::header::ACCEPT, ACCEPTED.join(", "));
        match (&bearer, &self.auth) {
            (Some(token), _) => request = request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => {
                request = request.basic_auth(user, Some(password))
            }
            _ => {}
        }
        let Ok(response) = request.send().await else {
            return Ok(());
        };
        let announced = response
            .headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        match announced {
            Some(bytes) if response.status().is_success() && bytes > DOCUMENT_MAX_BYTES => {
                Err(RegistryError::TooLarge {
                    what: MANIFEST_ANNOUNCED.into(),
                    bytes,
                    max: DOCUMENT_MAX_BYTES,
                })
            }
            _ => Ok(()),
        }
    }

    /// Makes sure the cache holds `blob` (`what` names it in progress and errors):
    /// fetched unless cached, refused when its size or digest differs from the
    /// descriptor's, or when it grows past `max_bytes`.
    pub async fn blob(
        &mut self,
        reference: &Reference,
        blob: &Descriptor,
        what: &str,
        max_bytes: u64,
    ) -> Result<(), RegistryError> {
        let size = check_descriptor(blob, what)?;
        if size > max_bytes {
            return Err(RegistryError::TooLarge {
                what: what.to_owned(),
                bytes: size,
                max: max_bytes,
            });
        }
        if self.store.has(&blob.digest) {
            self.stats.cached += 1;
            return Ok(());
        }
        let cache_error = |store: &Store, error| RegistryError::Cache {
            path: store.blob_path(&blob.digest),
            error,
        };
        let mut writer = self
            .store
            .writer(&blob.digest)
            .map_err(|e| cache_error(self.store, e))?;
        let mut stream = self
            .client
            .pull_blob_stream(reference, blob.digest.as_str())
            .await
            .map_err(|error| self.classify(error))?;
        let report = |done| {
            if let Some(sink) = self.progress {
                (sink.0)(&Progress {
                    what,
                    digest: &blob.digest,
                    done,
                    total: size,
                });
            }
        };
        if size > 0 {
            report(0);
        }
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // The client checks the digest at the end of the stream too; say
                // which bytes arrived rather than pass its message on.
                Err(error) if digest_error(&error) => {
                    return Err(RegistryError::DigestMismatch {
                        what: what.to_owned(),
                        expected: blob.digest.clone(),
                        actual: writer.digest(),
                    })
                }
                Err(error) => {
                    return Err(RegistryError::Download {
                        what: what.to_owned(),
                        error,
                    })
                }
            };
            // Never more than the descriptor says: a registry that streams forever
            // is cut off at the declared size, not at the disk's end.
            if writer.written() + chunk.len() as u64 > size {
                return Err(RegistryError::SizeMismatch {
                    what: what.to_owned(),
                    expected: size,
                    actual: writer.written() + chunk.len() as u64,
                });
            }
            writer
                .write(&chunk)
                .map_err(|e| cache_error(self.store, e))?;
            report(writer.written());
        }
        if writer.written() != size {
            return Err(RegistryError::SizeMismatch {
                what: what.to_owned(),
                expected: size,
                actual: writer.written(),
            });
        }
        let actual = writer.digest();
        if actual != blob.digest {
            return Err(RegistryError::DigestMismatch {
                what: what.to_owned(),
                expected: blob.digest.clone(),
                actual,
            });
        }
        writer.commit().map_err(|e| cache_error(self.store, e))?;
        self.stats.downloaded += 1;
        self.stats.downloaded_bytes += size;
        Ok(())
    }

    /// The client's error as one of ours: credentials refused, not found, or else
    /// the registry's own words.
    fn classify(&self, error: OciDistributionError) -> RegistryError {
        let reference = self.shown.clone();
        let anonymous = matches!(self.auth, RegistryAuth::Anonymous);
        let unauthorized = || RegistryError::Unauthorized {
            reference: reference.clone(),
            anonymous,
        };
        match &error {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => unauthorized(),
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    unauthorized()
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                            | OciErrorCode::BlobUnknown
                    )
                }) {
                    RegistryError::NotFound { reference }
                } else {
                    RegistryError::Registry { reference, error }
                }
            }
            OciDistributionError::ServerError {
                code: 401 | 403, ..
            } => unauthorized(),
            OciDistributionError::ServerError { code: 404, .. } => {
                RegistryError::NotFound { reference }
            }
            _ => RegistryError::Registry { reference, error },
        }
    }
}

/// The descriptor's size, after checking that its digest can name a cache file.
fn check_descriptor(blob: &Descriptor, what: &str) -> Result<u64, RegistryError> {
    if !valid_digest(&blob.digest) {
        return Err(RegistryError::BadDescriptor {
            what: what.to_owned(),
            reason: format!("digest {:?} is not sha256:HEX", blob.digest),
        });
    }
    u64::try_from(blob.size).map_err(|_| RegistryError::BadDescriptor {
        what: what.to_owned(),
        reason: format!("negative size {}", blob.size),
    })
}

/// True when a stream error is the client's digest check failing.
fn digest_error(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<DigestError>())
}
