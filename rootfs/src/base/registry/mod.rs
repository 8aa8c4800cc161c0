//! A base pulled from an OCI registry (`--base oci://REGISTRY/REPO[:TAG|@DIGEST]`,
//! or docker's short forms such as `python:3.12-slim`).
//!
//! # Flow ([`pull`])
//! 1. [`reference`]: the reference, fully qualified; [`auth`]: the credentials.
//! 2. Which manifest: the reference's digest; else the tag's pin in the cache
//!    ([`store`], unless `--refresh`); else the registry's answer for the tag, which
//!    is then pinned. So a tag is resolved once, and later builds use the same bytes
//!    (and need no network when the cache holds them) until asked to look again.
//! 3. [`fetch`]: the manifest (an index resolves to `linux/amd64`, [`document`]),
//!    the config and the layers, each verified against its digest and size, through
//!    the content-addressed cache: what it holds is not downloaded again.
//! 4. The layers are applied lowest first, by the same code as image tarballs
//!    ([`super::image`]), but strictly: an entry that would land outside the root
//!    (`..`, a path through a symlink, a hard link out) fails the build
//!    ([`RegistryError::Escaping`]) instead of being skipped; the unpacked bytes
//!    count against the size limit, so a compressed bomb stops there.
//! 5. The config's `Env`, `WorkingDir` and `User` become the template's defaults
//!    ([`super::oci_config`]); the reference and digests are returned for
//!    `template.json` ([`ImageSource`]).
//!
//! Everything is written into the build's staging folder, which the build removes
//! on failure: a refused image leaves nothing in the templates folder, and the cache
//! holds only verified blobs.

pub mod auth;
pub mod document;
pub mod fetch;
pub mod reference;
pub mod store;

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use flate2::read::GzDecoder;
use oci_client::errors::OciDistributionError;
use sandbox_protocol::ImageConfig;
use tracing::info;

use super::image::{apply_whiteouts, escaping_entry, unpack_files_with, EntryPolicy};
use super::oci_config::OciImageConfig;
use crate::manifest::ImageSource;
use auth::{AuthError, AuthSource};
use document::{ConfigPlatform, Descriptor, Document, DocumentError};
use fetch::{Fetcher, PullStats, DOCUMENT_MAX_BYTES};
use reference::ImageRef;
use store::Store;

/// Default for [`RegistryOptions::max_bytes`]: 8 GiB.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 8 << 30;

/// One progress report of a download.
#[derive(Debug)]
pub struct Progress<'a> {
    /// `layer 2/5`, `the config`.
    pub what: &'a str,
    /// The blob.
    pub digest: &'a str,
    /// Bytes so far.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

/// Where download progress goes (the command line draws it on a terminal).
#[derive(Clone)]
pub struct ProgressSink(pub Arc<dyn Fn(&Progress<'_>) + Send + Sync>);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// How to pull.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Credentials.
    pub auth: AuthSource,
    /// `HOST:PORT`s spoken to in plain HTTP (`--insecure-registry`); all others
    /// only over HTTPS.
    pub insecure: Vec<String>,
    /// Ask the registry where a tag points even when it is pinned.
    pub refresh: bool,
    /// The largest image: its layers as downloaded, and as unpacked.
    pub max_bytes: u64,
    /// Download progress, if anyone watches.
    pub progress: Option<ProgressSink>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            auth: AuthSource::default(),
            insecure: Vec::new(),
            refresh: false,
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
            progress: None,
        }
    }
}

/// Pulling or applying a registry image failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Docker's config could not be read.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The registry wants credentials, or refused the ones given.
    #[error("{}", if *anonymous {
        format!("{reference} needs credentials: pass --registry-auth USER:PASSWORD (or SANDBOX_REGISTRY_AUTH), or add them to docker's config.json")
    } else {
        format!("The registry refused the credentials for {reference}")
    })]
    Unauthorized {
        /// The image.
        reference: String,
        /// No credentials were sent.
        anonymous: bool,
    },
    /// No such repository, tag or digest.
    #[error("{reference} is not in the registry (no such repository, tag or digest)")]
    NotFound {
        /// The image.
        reference: String,
    },
    /// The image is for other platforms only.
    #[error("{reference} has no linux/amd64 image, only {}", available.join(", "))]
    WrongPlatform {
        /// The image.
        reference: String,
        /// What it offers.
        available: Vec<String>,
    },
    /// A manifest or index is not one this builder reads.
    #[error("Unusable {what}")]
    Document {
        /// Which document.
        what: String,
        /// Why.
        #[source]
        error: DocumentError,
    },
    /// Something the builder does not support.
    #[error("{what}: {reason}")]
    Unsupported {
        /// What.
        what: String,
        /// Why not.
        reason: String,
    },
    /// A descriptor with an unusable digest or size.
    #[error("Invalid descriptor of {what}: {reason}")]
    BadDescriptor {
        /// Which blob.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// The bytes served do not hash to the digest that names them.
    #[error("The registry sent {what} with digest {actual}, not {expected}: refused")]
    DigestMismatch {
        /// Which blob.
        what: String,
        /// The digest named.
        expected: String,
        /// The digest of what came.
        actual: String,
    },
    /// The bytes served are more or fewer than the descriptor says.
    #[error("The registry sent {actual} bytes of {what}, not {expected}: refused")]
    SizeMismatch {
        /// Which blob.
        what: String,
        /// The size named.
        expected: u64,
        /// The size that came (so far).
        actual: u64,
    },
    /// Over the size limit.
    #[error("{what} is {bytes} bytes, over the limit of {max} bytes (--max-image-mib)")]
    TooLarge {
        /// What.
        what: String,
        /// Its size (at least).
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A download broke off.
    #[error("Downloading {what} failed")]
    Download {
        /// Which blob.
        what: String,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The registry could not be reached or answered with an error.
    #[error("Pulling {reference} failed")]
    Registry {
        /// The image.
        reference: String,
        /// The client's error.
        #[source]
        error: OciDistributionError,
    },
    /// The layer cache could not be read or written.
    #[error("Layer cache {}", path.display())]
    Cache {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// A layer has an entry that would land outside the root.
    #[error("{layer}: entry {} {reason}: refused", path.display())]
    Escaping {
        /// The layer.
        layer: String,
        /// The entry.
        path: PathBuf,
        /// How it escapes.
        reason: &'static str,
    },
    /// A layer could not be applied.
    #[error("Cannot apply {layer}")]
    Layer {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The image config is not JSON.
    #[error("Malformed image config")]
    Config(#[source] serde_json::Error),
    /// The async runtime could not start.
    #[error("Cannot start the download runtime")]
    Runtime(#[source] io::Error),
}

/// What a pull put in the staging folder.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The config's defaults.
    pub config: ImageConfig,
    /// The reference and digests, for `template.json`.
    pub source: ImageSource,
    /// Downloads and cache hits.
    pub stats: PullStats,
}

/// A manifest's parts once fetched.
#[derive(Debug)]
struct Fetched {
    source: ImageSource,
    config: Vec<u8>,
    layers: Vec<Descriptor>,
    stats: PullStats,
}

/// The builder is synchronous; the registry client is async: one thread runs it.
fn runtime() -> Result<tokio::runtime::Runtime, RegistryError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RegistryError::Runtime)
}

/// Pulls `image` through the cache under `cache_dir` and applies it to `staging`.
pub fn pull(
    image: &ImageRef,
    opts: &RegistryOptions,
    cache_dir: &Path,
    staging: &Path,
) -> Result<Pulled, RegistryError> {
    let store = Store::new(cache_dir);
    let auth = opts.auth.resolve(image.registry())?;
    let runtime = runtime()?;
    let fetched = runtime.block_on(fetch_image(image, opts, &store, auth))?;
    let Fetched {
        source,
        config,
        layers,
        stats,
    } = fetched;
    info!(
        reference = %source.reference,
        digest = %source.manifest_digest,
        layers = layers.len(),
        downloaded = stats.downloaded,
        downloaded_bytes = stats.downloaded_bytes,
        cached = stats.cached,
        "image fetched"
    );
    apply_layers(&store, &layers, staging, opts.max_bytes)?;
    let config = serde_json::from_slice::<OciImageConfig>(&config)
        .map_err(RegistryError::Config)?
        .into_image_config();
    Ok(Pulled {
        config,
        source,
        stats,
    })
}

/// Where `image` points now, without its config or layers: the manifest digest a
/// pull would build from (the tag's pin unless `refresh`, else the registry's
/// answer). A rebuild compares it with the template's to skip work that would
/// change nothing.
pub fn resolve(
    image: &ImageRef,
    opts: &RegistryOptions,
    cache_dir: &Path,
) -> Result<ImageSource, RegistryError> {
    let store = Store::new(cache_dir);
    let auth = opts.auth.resolve(image.registry())?;
    let runtime = runtime()?;
    runtime.block_on(async {
        let mut fetcher = Fetcher::new(image.to_string(), auth, &opts.insecure, &store, None);
        let chosen = choose_manifest(image, opts, &store, &mut fetcher).await?;
        Ok(chosen.source)
    })
}

/// The image manifest a reference stands for, and what it lists.
#[derive(Debug)]
struct Chosen {
    source: ImageSource,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// Step 2: the image manifest (an index resolved to linux/amd64), fetched or read
/// from the cache, the tag pinned to it.
async fn choose_manifest(
    image: &ImageRef,
    opts: &RegistryOptions,
    store: &Store,
    fetcher: &mut Fetcher<'_>,
) -> Result<Chosen, RegistryError> {
    let shown = image.to_string();
    let tag_key = image.tag_key();
    let pin = match &tag_key {
        Some(key) if !opts.refresh => store.pin(key),
        _ => None,
    };
    let pinned = image
        .digest()
        .map(str::to_owned)
        .or_else(|| pin.as_ref().map(|p| p.digest.clone()));
    if let Some(pin) = &pin {
        info!(tag = %pin.tag, digest = %pin.digest, since = %pin.pinned_at,
            "tag pinned by an earlier pull (--refresh asks the registry again)");
    }
    let top_ref = match &pinned {
        Some(digest) => image.at_digest(digest),
        None => image.reference().clone(),
    };
    let (top, top_digest) = fetcher.manifest(&top_ref, pinned.as_deref()).await?;
    if let Some(key) = &tag_key {
        if pin.is_none() {
            if let Some(old) = store.pin(key).filter(|old| old.digest != top_digest) {
                info!(tag = %key, old = %old.digest, new = %top_digest, "the tag moved");
            }
            store
                .set_pin(key, &top_digest)
                .map_err(|error| RegistryError::Cache {
                    path: store.blob_path(&top_digest),
                    error,
                })?;
        }
    }
    let document = |what: &str, bytes: &[u8]| {
        Document::parse(bytes).map_err(|error| RegistryError::Document {
            what: what.to_owned(),
            error,
        })
    };
    let (index_digest, manifest_digest, config, layers) = match document("manifest", &top)? {
        Document::Image { config, layers } => (None, top_digest, config, layers),
        Document::Index(manifests) => {
            let chosen = document::pick_platform(&manifests).map_err(|available| {
                RegistryError::WrongPlatform {
                    reference: shown.clone(),
                    available,
                }
            })?;
            if !store::valid_digest(&chosen.digest) {
                return Err(RegistryError::BadDescriptor {
                    what: "the linux/amd64 manifest".into(),
                    reason: format!("digest {:?} is not sha256:HEX", chosen.digest),
                });
            }
            info!(index = %top_digest, manifest = %chosen.digest, "index resolved to linux/amd64");
            let (bytes, digest) = fetcher
                .manifest(&image.at_digest(&chosen.digest), Some(&chosen.digest))
                .await?;
            match document("linux/amd64 manifest", &bytes)? {
                Document::Image { config, layers } => (Some(top_digest), digest, config, layers),
                Document::Index(_) => {
                    return Err(RegistryError::Unsupported {
                        what: shown,
                        reason: "an index inside an index".into(),
                    })
                }
            }
        }
    };
    Ok(Chosen {
        source: ImageSource {
            reference: shown,
            manifest_digest,
            index_digest,
            build_options: None,
        },
        config,
        layers,
    })
}

/// Steps 2 and 3: the manifest, config and layers into the cache.
async fn fetch_image(
    image: &ImageRef,
    opts: &RegistryOptions,
    store: &Store,
    auth: oci_client::secrets::RegistryAuth,
) -> Result<Fetched, RegistryError> {
    let shown = image.to_string();
    let mut fetcher = Fetcher::new(
        shown.clone(),
        auth,
        &opts.insecure,
        store,
        opts.progress.as_ref(),
    );
    let Chosen {
        source,
        config,
        layers,
    } = choose_manifest(image, opts, store, &mut fetcher).await?;
    let manifest_digest = source.manifest_digest.clone();
    let total = layers
        .iter()
        .map(|l| u64::try_from(l.size).unwrap_or(u64::MAX))
        .fold(0u64, u64::saturating_add);
    if total > opts.max_bytes {
        return Err(RegistryError::TooLarge {
            what: format!("{shown} (its layers)"),
            bytes: total,
            max: opts.max_bytes,
        });
    }
    for (i, layer) in layers.iter().enumerate() {
        check_layer_type(layer, &layer_name(i, layers.len()))?;
    }
    let reference = image.at_digest(&manifest_digest);
    fetcher
        .blob(&reference, &config, "the config", DOCUMENT_MAX_BYTES)
        .await?;
    let config_bytes = store
        .read(&config.digest)
        .map_err(|error| RegistryError::Cache {
            path: store.blob_path(&config.digest),
            error,
        })?;
    let platform: ConfigPlatform =
        serde_json::from_slice(&config_bytes).map_err(RegistryError::Config)?;
    if !platform.fits() {
        return Err(RegistryError::WrongPlatform {
            reference: shown,
            available: vec![platform.name()],
        });
    }
    for (i, layer) in layers.iter().enumerate() {
        fetcher
            .blob(
                &reference,
                layer,
                &layer_name(i, layers.len()),
                opts.max_bytes,
            )
            .await?;
    }
    Ok(Fetched {
        source,
        config: config_bytes,
        layers,
        stats: fetcher.stats,
    })
}

fn layer_name(i: usize, count: usize) -> String {
    format!("layer {}/{count}", i + 1)
}

/// Plain and gzip tar layers (OCI and Docker media types) are applied; zstd and
/// anything else is refused before a byte is downloaded.
fn check_layer_type(layer: &Descriptor, what: &str) -> Result<(), RegistryError> {
    let media = layer.media_type.as_str();
    let tar = media.starts_with("application/vnd.oci.image.layer.")
        || media.starts_with("application/vnd.docker.image.rootfs.");
    let compression = media.rsplit_once('+').map(|(_, c)| c);
    match compression {
        _ if !tar => Err(RegistryError::Unsupported {
            what: what.to_owned(),
            reason: format!("media type {media:?} is not a filesystem layer"),
        }),
        None | Some("gzip") => Ok(()),
        Some(other) => Err(RegistryError::Unsupported {
            what: what.to_owned(),
            reason: format!("{other} compression (only plain and gzip tar layers)"),
        }),
    }
}

/// The unpacked bytes left under the size limit, shared by the layers. Whether it
/// was overrun is kept here, not only in the read error, because the tar reader
/// wraps the errors of the stream it reads in its own.
#[derive(Debug, Clone)]
struct Budget(Rc<(Cell<u64>, Cell<bool>)>);

impl Budget {
    fn new(bytes: u64) -> Self {
        Self(Rc::new((Cell::new(bytes), Cell::new(false))))
    }

    fn overrun(&self) -> bool {
        self.0 .1.get()
    }
}

/// The error of a read past the [`Budget`].
#[derive(Debug, thiserror::Error)]
#[error("over the unpacked size limit")]
struct OverBudget;

/// A reader that fails once its [`Budget`] is spent.
struct Metered<R> {
    inner: R,
    budget: Budget,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let got = self.inner.read(buf)?;
        let (left, overrun) = &*self.budget.0;
        let got_u64 = got as u64;
        if got_u64 > left.get() {
            overrun.set(true);
            return Err(io::Error::other(OverBudget));
        }
        left.set(left.get() - got_u64);
        Ok(got)
    }
}

/// Step 4: each cached layer, lowest first, whiteouts then files.
fn apply_layers(
    store: &Store,
    layers: &[Descriptor],
    staging: &Path,
    max_bytes: u64,
) -> Result<(), RegistryError> {
    let files_budget = Budget::new(max_bytes);
    for (i, layer) in layers.iter().enumerate() {
        let name = layer_name(i, layers.len());
        let path = store.blob_path(&layer.digest);
        // The whiteout pass reads the whole layer too: its own budget, so that a
        // bomb stops there as well, without counting the layer twice.
        let pass_budget = Budget::new(max_bytes);
        let fail = |error: io::Error| {
            if files_budget.overrun() || pass_budget.overrun() {
                return RegistryError::TooLarge {
                    what: "the unpacked image".into(),
                    bytes: max_bytes.saturating_add(1),
                    max: max_bytes,
                };
            }
            if let Some(entry) = escaping_entry(&error) {
                return RegistryError::Escaping {
                    layer: name.clone(),
                    path: entry.path.clone(),
                    reason: entry.reason,
                };
            }
            RegistryError::Layer {
                layer: name.clone(),
                error,
            }
        };
        info!(layer = %name, digest = %layer.digest, "applying layer");
        let reader = open_layer(&path, pass_budget.clone()).map_err(fail)?;
        let whiteouts = apply_whiteouts(reader, staging, EntryPolicy::Refuse).map_err(fail)?;
        let reader = open_layer(&path, files_budget.clone()).map_err(fail)?;
        let skipped = unpack_files_with(reader, staging, EntryPolicy::Refuse).map_err(fail)?;
        if whiteouts > 0 || skipped > 0 {
            info!(layer = %name, whiteouts, skipped_devices = skipped, "layer applied");
        }
    }
    Ok(())
}

/// A cached layer's tar stream, gunzipped when it starts with gzip's magic
/// (the media type has been checked to be plain or gzip tar).
fn open_layer(path: &Path, budget: Budget) -> io::Result<Box<dyn Read>> {
    let mut file = File::open(path)?;
    let mut magic = [0u8; 2];
    let got = file.read(&mut magic)?;
    let file = BufReader::new(File::open(path)?);
    if got == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(Metered {
            inner: GzDecoder::new(file),
            budget,
        }))
    } else {
        Ok(Box::new(Metered {
            inner: file,
            budget,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(media_type: &str) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: store::sha256_digest(b""),
            size: 0,
            platform: None,
        }
    }

    #[test]
    fn tar_and_gzip_layers_are_taken_and_others_refused_by_type() {
        for ok in [
            "application/vnd.oci.image.layer.v1.tar",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        ] {
            check_layer_type(&descriptor(ok), "l").unwrap();
        }
        for bad in [
            "application/vnd.oci.image.layer.v1.tar+zstd",
            "application/vnd.wasm.content.layer.v1+wasm",
            "",
        ] {
            assert!(
                matches!(
                    check_layer_type(&descriptor(bad), "l"),
                    Err(RegistryError::Unsupported { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_metered_reader_stops_at_its_budget() {
        let budget = Budget::new(10);
        let mut reader = Metered {
            inner: io::Cursor::new(vec![0u8; 6]),
            budget: budget.clone(),
        };
        io::copy(&mut reader, &mut io::sink()).unwrap();
        let mut reader = Metered {
            inner: io::Cursor::new(vec![0u8; 6]),
            budget,
        };
        assert!(!reader.budget.overrun());
        let error = io::copy(&mut reader, &mut io::sink()).unwrap_err();
        assert!(error.get_ref().is_some_and(|e| e.is::<OverBudget>()));
        assert!(reader.budget.overrun());
    }
}
