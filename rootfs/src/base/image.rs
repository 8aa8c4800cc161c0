//! A base from a container image tarball: `docker save` output or an OCI image
//! layout packed as a tar.
//!
//! 1. Index the outer tarball once: member name → byte range. Layers are read in
//!    place from those ranges; nothing is unpacked twice.
//! 2. Find the layers and the config: `manifest.json` (`docker save`, including
//!    Docker 25+ which writes OCI blobs) or `index.json` → manifest (→ `linux/amd64`
//!    from an index). The config's `Env`, `WorkingDir` and `User` become the
//!    template's defaults ([`super::oci_config`]).
//! 3. Apply each layer in order, in two passes: first its whiteouts, which only
//!    ever hide what lower layers made (`.wh.NAME` removes `NAME`, `.wh..wh..opq`
//!    empties its folder); then its files.
//!
//! Safety: every path is made relative and may not contain `..`; whiteouts never act
//! through a symlink; files are unpacked with `tar`'s `unpack_in`, which refuses to
//! write outside the staging folder. Device nodes are skipped (the guest's `/dev`
//! is a devtmpfs).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use sandbox_protocol::ImageConfig;
use serde::Deserialize;
use tracing::{info, warn};

use super::oci_config::OciImageConfig;
use crate::tree::remove_path;

/// Prefix of whiteout entries.
const WHITEOUT_PREFIX: &str = ".wh.";

/// The opaque-folder marker.
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// What to do with an entry that would act outside the root: a path with `..`, or
/// one below a symlink (which could point anywhere, `/` included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryPolicy {
    /// Skip it with a warning: a local tarball or the builder's own Debian base,
    /// where the entry is a packaging oddity rather than an attack.
    Skip,
    /// Fail the layer with an [`EscapingEntry`]: an image from a registry, whose
    /// author is not trusted.
    Refuse,
}

/// The error payload (inside an [`io::Error`]) of an entry refused under
/// [`EntryPolicy::Refuse`]; find it with [`escaping_entry`].
#[derive(Debug, thiserror::Error)]
#[error("{} {reason}", path.display())]
pub struct EscapingEntry {
    /// The entry's path as the layer names it.
    pub path: PathBuf,
    /// How it would escape.
    pub reason: &'static str,
}

/// The [`EscapingEntry`] an unpacking error carries, if that is what it is.
pub fn escaping_entry(error: &io::Error) -> Option<&EscapingEntry> {
    error.get_ref().and_then(|inner| inner.downcast_ref())
}

/// Skips (returning `Ok(())` after a warning) or refuses an escaping entry.
fn escape(policy: EntryPolicy, path: &Path, reason: &'static str) -> io::Result<()> {
    match policy {
        EntryPolicy::Skip => {
            warn!(path = %path.display(), reason, "entry skipped");
            Ok(())
        }
        EntryPolicy::Refuse => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            EscapingEntry {
                path: path.to_owned(),
                reason,
            },
        )),
    }
}

/// Applying an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Reading the tarball failed.
    #[error("Cannot read image {}", path.display())]
    Read {
        /// The tarball.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The tarball is compressed as a whole.
    #[error("Image {} is compressed; decompress it to a plain .tar first", path.display())]
    Compressed {
        /// The tarball.
        path: PathBuf,
    },
    /// Neither `manifest.json` nor `index.json` describes an image.
    #[error("Image tarball has no usable manifest: {reason}")]
    NoManifest {
        /// What is missing.
        reason: String,
    },
    /// A JSON document in the image is malformed.
    #[error("Malformed {member} in the image")]
    Json {
        /// The member.
        member: String,
        /// Why.
        #[source]
        error: serde_json::Error,
    },
    /// A layer is missing from the tarball.
    #[error("Layer {member} is not in the image tarball")]
    MissingLayer {
        /// The member.
        member: String,
    },
    /// A layer uses a compression this builder does not read.
    #[error("Layer {member} uses an unsupported compression (only plain and gzip tar)")]
    UnsupportedCompression {
        /// The member.
        member: String,
    },
    /// Unpacking a layer failed.
    #[error("Cannot apply layer {member}")]
    Layer {
        /// The member.
        member: String,
        /// Why.
        #[source]
        error: io::Error,
    },
}

/// Where one member's data lies in the outer tarball.
#[derive(Debug, Clone, Copy)]
struct Span {
    offset: u64,
    len: u64,
}

/// Applies the image at `tarball` to `staging`; returns the defaults its config
/// asks for (none when it has no config).
pub fn apply(tarball: &Path, staging: &Path) -> Result<ImageConfig, ImageError> {
    let read_error = |error| ImageError::Read {
        path: tarball.to_owned(),
        error,
    };
    let mut file = File::open(tarball).map_err(read_error)?;
    let mut magic = [0u8; 4];
    let got = file.read(&mut magic).map_err(read_error)?;
    if got >= 2 && (magic[..2] == [0x1f, 0x8b] || magic == [0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(ImageError::Compressed {
            path: tarball.to_owned(),
        });
    }
    file.seek(SeekFrom::Start(0)).map_err(read_error)?;
    let members = index_members(&mut file).map_err(read_error)?;
    let ImageParts { layers, config } = find_parts(&members, &mut file)?;
    let config = match config {
        Some(member) => match read_json::<OciImageConfig>(&members, &mut file, &member)? {
            Some(config) => config.into_image_config(),
            None => {
                warn!(%member, "the image's config is not in the tarball: no Env, WorkingDir, User");
                ImageConfig::default()
            }
        },
        None => ImageConfig::default(),
    };
    info!(layers = layers.len(), image = %tarball.display(), "applying image layers");
    for (i, member) in layers.iter().enumerate() {
        let span = *members
            .get(member)
            .ok_or_else(|| ImageError::MissingLayer {
                member: member.clone(),
            })?;
        info!(layer = i + 1, of = layers.len(), %member, "applying layer");
        let layer_error = |error| ImageError::Layer {
            member: member.clone(),
            error,
        };
        let whiteouts = apply_whiteouts(
            open_layer(tarball, span, member)?,
            staging,
            EntryPolicy::Skip,
        )
        .map_err(layer_error)?;
        let skipped = unpack_files_with(
            open_layer(tarball, span, member)?,
            staging,
            EntryPolicy::Skip,
        )
        .map_err(layer_error)?;
        if whiteouts > 0 || skipped > 0 {
            info!(%member, whiteouts, skipped, "layer applied");
        }
    }
    Ok(config)
}

/// Member name (without `./`) → data span, for every regular file in the tarball.
fn index_members(file: &mut File) -> io::Result<HashMap<String, Span>> {
    let mut members = HashMap::new();
    let mut archive = tar::Archive::new(BufReader::new(file));
    for entry in archive.entries()? {
        let entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_owned();
        members.insert(
            name,
            Span {
                offset: entry.raw_file_position(),
                len: entry.size(),
            },
        );
    }
    Ok(members)
}

fn read_member(file: &mut File, span: Span) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(span.offset))?;
    let mut data = Vec::new();
    file.take(span.len).read_to_end(&mut data)?;
    Ok(data)
}

fn read_json<T: for<'de> Deserialize<'de>>(
    members: &HashMap<String, Span>,
    file: &mut File,
    member: &str,
) -> Result<Option<T>, ImageError> {
    let Some(span) = members.get(member) else {
        return Ok(None);
    };
    let data = read_member(file, *span).map_err(|error| ImageError::Layer {
        member: member.to_owned(),
        error,
    })?;
    serde_json::from_slice(&data)
        .map(Some)
        .map_err(|error| ImageError::Json {
            member: member.to_owned(),
            error,
        })
}

#[derive(Debug, Deserialize)]
struct DockerManifestEntry {
    #[serde(rename = "Config", default)]
    config: Option<String>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct OciDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<OciPlatform>,
}

#[derive(Debug, Deserialize)]
struct OciPlatform {
    architecture: String,
    os: String,
}

#[derive(Debug, Deserialize)]
struct OciIndex {
    manifests: Vec<OciDescriptor>,
}

#[derive(Debug, Deserialize)]
struct OciManifest {
    #[serde(default)]
    config: Option<OciDescriptor>,
    layers: Vec<OciDescriptor>,
}

/// Where an image's parts are in the tarball.
#[derive(Debug)]
struct ImageParts {
    /// The layer members, lowest first.
    layers: Vec<String>,
    /// The config member, when the manifest names one.
    config: Option<String>,
}

/// The layer members, lowest first, and the config member.
fn find_parts(members: &HashMap<String, Span>, file: &mut File) -> Result<ImageParts, ImageError> {
    if let Some(entries) = read_json::<Vec<DockerManifestEntry>>(members, file, "manifest.json")? {
        if entries.len() > 1 {
            warn!(
                images = entries.len(),
                "the tarball holds several images; using the first"
            );
        }
        let entry = entries
            .into_iter()
            .next()
            .ok_or_else(|| ImageError::NoManifest {
                reason: "manifest.json lists no image".into(),
            })?;
        return Ok(ImageParts {
            layers: entry
                .layers
                .into_iter()
                .map(|layer| layer.trim_start_matches("./").to_owned())
                .collect(),
            config: entry
                .config
                .map(|config| config.trim_start_matches("./").to_owned()),
        });
    }
    let index = read_json::<OciIndex>(members, file, "index.json")?.ok_or_else(|| {
        ImageError::NoManifest {
            reason: "neither manifest.json nor index.json found".into(),
        }
    })?;
    // An index may point at another index (multi-platform images); follow a few.
    let mut manifests = index.manifests;
    for _ in 0..4 {
        let chosen = pick_manifest(manifests).ok_or_else(|| ImageError::NoManifest {
            reason: "index.json lists no manifest".into(),
        })?;
        let member = blob_member(&chosen.digest);
        if chosen.media_type.contains("index") || chosen.media_type.contains("manifest.list") {
            manifests = read_json::<OciIndex>(members, file, &member)?
                .ok_or(ImageError::MissingLayer { member })?
                .manifests;
            continue;
        }
        let manifest = read_json::<OciManifest>(members, file, &member)?
            .ok_or(ImageError::MissingLayer { member })?;
        return Ok(ImageParts {
            layers: manifest
                .layers
                .iter()
                .map(|layer| blob_member(&layer.digest))
                .collect(),
            config: manifest.config.map(|config| blob_member(&config.digest)),
        });
    }
    Err(ImageError::NoManifest {
        reason: "image indexes nest too deeply".into(),
    })
}

/// The `linux/amd64` manifest if the index names platforms, else the first.
fn pick_manifest(manifests: Vec<OciDescriptor>) -> Option<OciDescriptor> {
    let wanted = manifests.iter().position(|m| {
        m.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    });
    manifests.into_iter().nth(wanted.unwrap_or(0))
}

/// `sha256:abc` → `blobs/sha256/abc`.
fn blob_member(digest: &str) -> String {
    let (algorithm, hex) = digest.split_once(':').unwrap_or(("sha256", digest));
    format!("blobs/{algorithm}/{hex}")
}

/// A layer's tar stream, decompressed if it is gzip.
fn open_layer(tarball: &Path, span: Span, member: &str) -> Result<Box<dyn Read>, ImageError> {
    let read_error = |error| ImageError::Read {
        path: tarball.to_owned(),
        error,
    };
    let mut file = File::open(tarball).map_err(read_error)?;
    file.seek(SeekFrom::Start(span.offset))
        .map_err(read_error)?;
    let mut magic = [0u8; 4];
    let got = (&mut file).take(4).read(&mut magic).map_err(read_error)?;
    file.seek(SeekFrom::Start(span.offset))
        .map_err(read_error)?;
    let raw = BufReader::new(file.take(span.len));
    if got >= 2 && magic[..2] == [0x1f, 0x8b] {
        Ok(Box::new(GzDecoder::new(raw)))
    } else if got == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Err(ImageError::UnsupportedCompression {
            member: member.to_owned(),
        })
    } else {
        Ok(Box::new(raw))
    }
}

/// `path` made relative, without `.`; `None` if it has `..`.
fn clean_path(path: &Path) -> Option<PathBuf> {
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!clean.as_os_str().is_empty()).then_some(clean)
}

/// `root/rel`, or `None` when a folder on the way is a symlink (acting there could
/// leave the staging folder).
fn join_no_symlinks(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut path = root.to_owned();
    let mut components = rel.components().peekable();
    while let Some(component) = components.next() {
        path.push(component);
        if components.peek().is_some() {
            if let Ok(meta) = fs::symlink_metadata(&path) {
                if meta.file_type().is_symlink() {
                    return None;
                }
            }
        }
    }
    Some(path)
}

/// Pass one: removes what this layer's whiteouts hide. Returns how many it applied.
pub(super) fn apply_whiteouts(
    layer: Box<dyn Read + '_>,
    staging: &Path,
    policy: EntryPolicy,
) -> io::Result<usize> {
    let mut applied = 0;
    let mut archive = tar::Archive::new(layer);
    for entry in archive.entries()? {
        let entry = entry?;
        let path = entry.path()?.into_owned();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with(WHITEOUT_PREFIX) {
            continue;
        }
        let Some(rel) = clean_path(&path) else {
            escape(policy, &path, "is a whiteout outside the root")?;
            continue;
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        if name == OPAQUE_MARKER {
            let Some(dir) = join_no_symlinks(staging, parent) else {
                escape(policy, &rel, "is an opaque whiteout through a symlink")?;
                continue;
            };
            if dir.is_dir() && !dir.symlink_metadata()?.file_type().is_symlink() {
                for child in fs::read_dir(&dir)? {
                    remove_path(&child?.path()).map_err(|e| e.error)?;
                }
            }
        } else {
            let hidden = parent.join(&name[WHITEOUT_PREFIX.len()..]);
            let Some(target) = join_no_symlinks(staging, &hidden) else {
                escape(policy, &rel, "is a whiteout through a symlink")?;
                continue;
            };
            remove_path(&target).map_err(|e| e.error)?;
        }
        applied += 1;
    }
    Ok(applied)
}

/// Pass two: unpacks the layer's files, replacing what lower layers had at the same
/// paths. Returns how many entries were skipped. (Also how a cached Debian base,
/// one plain tarball, is unpacked: see [`super::debian`].)
pub(super) fn unpack_files(layer: Box<dyn Read>, staging: &Path) -> io::Result<usize> {
    unpack_files_with(layer, staging, EntryPolicy::Skip)
}

/// [`unpack_files`] with a policy for entries that would leave the root.
pub(super) fn unpack_files_with(
    layer: Box<dyn Read + '_>,
    staging: &Path,
    policy: EntryPolicy,
) -> io::Result<usize> {
    let mut skipped = 0;
    let mut archive = tar::Archive::new(layer);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    archive.set_preserve_ownerships(nix_is_root());
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(WHITEOUT_PREFIX) {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() {
            skipped += 1;
            continue;
        }
        // The root itself (`./`, as `tar -C DIR .` writes it): the staging folder.
        if kind.is_dir()
            && path
                .components()
                .all(|c| matches!(c, Component::CurDir | Component::RootDir))
        {
            continue;
        }
        let Some(rel) = clean_path(&path) else {
            escape(policy, &path, "is outside the root")?;
            skipped += 1;
            continue;
        };
        let Some(target) = join_no_symlinks(staging, &rel) else {
            escape(policy, &rel, "lies below a symlink")?;
            skipped += 1;
            continue;
        };
        // A hard link names another entry of the image; one that leaves the root
        // (or passes a symlink) would link a host file into the template.
        if kind == tar::EntryType::Link {
            let linked = entry.link_name()?.map(|name| name.into_owned());
            let inside = linked
                .as_deref()
                .and_then(clean_path)
                .and_then(|rel| join_no_symlinks(staging, &rel));
            if inside.is_none() {
                escape(policy, &rel, "is a hard link to outside the root")?;
                skipped += 1;
                continue;
            }
        }
        // A layer replaces a lower layer's entry; only folders merge.
        if let Ok(existing) = fs::symlink_metadata(&target) {
            if !(existing.is_dir() && kind.is_dir()) {
                remove_path(&target).map_err(|e| e.error)?;
            }
        }
        match entry.unpack_in(staging) {
            Ok(true) => {}
            Ok(false) => {
                escape(policy, &rel, "was refused by the unpacker")?;
                skipped += 1;
            }
            // A half-applied entry (data written, mode or owner not) would make a
            // template that fails at run time in confusing ways: fail the build here.
            Err(error) => {
                return Err(io::Error::new(
                    error.kind(),
                    match std::error::Error::source(&error) {
                        Some(cause) => format!("cannot unpack {}: {error}: {cause}", rel.display()),
                        None => format!("cannot unpack {}: {error}", rel.display()),
                    },
                ))
            }
        }
    }
    Ok(skipped)
}

/// Ownership can be restored only when running as root.
fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn layer(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut header = tar::Header::new_gnu();
            match data {
                Some(data) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    header.set_mode(0o644);
                    header.set_uid(0);
                    header.set_gid(0);
                    header.set_mtime(0);
                    header.set_cksum();
                    builder.append_data(&mut header, path, *data).unwrap();
                }
                None => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    header.set_mode(0o755);
                    header.set_uid(0);
                    header.set_gid(0);
                    header.set_mtime(0);
                    header.set_cksum();
                    builder.append_data(&mut header, path, io::empty()).unwrap();
                }
            }
        }
        builder.into_inner().unwrap()
    }

    fn outer(members: &[(&str, Vec<u8>)]) -> tempfile::NamedTempFile {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, name, data.as_slice())
                .unwrap();
        }
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&builder.into_inner().unwrap()).unwrap();
        file
    }

    fn lower() -> Vec<u8> {
        layer(&[
            ("etc/", None),
            ("etc/keep", Some(b"keep")),
            ("etc/gone", Some(b"gone")),
            ("opq/", None),
            ("opq/old", Some(b"old")),
            ("replaced", Some(b"v1")),
        ])
    }

    fn upper() -> Vec<u8> {
        layer(&[
            ("etc/.wh.gone", Some(b"")),
            ("opq/new", Some(b"new")),
            ("opq/.wh..wh..opq", Some(b"")),
            ("replaced", Some(b"v2")),
        ])
    }

    fn check(staging: &Path) {
        let read = |p: &str| fs::read_to_string(staging.join(p)).ok();
        assert_eq!(read("etc/keep").as_deref(), Some("keep"));
        assert_eq!(read("etc/gone"), None, "whiteout removes the lower file");
        assert_eq!(read("opq/old"), None, "opaque folder hides lower contents");
        assert_eq!(
            read("opq/new").as_deref(),
            Some("new"),
            "opaque marker keeps the same layer's files, even listed before it"
        );
        assert_eq!(read("replaced").as_deref(), Some("v2"));
        assert!(!staging.join("etc/.wh.gone").exists());
        assert!(!staging.join("opq/.wh..wh..opq").exists());
    }

    #[test]
    fn an_entry_that_cannot_be_applied_fails_the_build() {
        // A header whose uid field is not a number: as root the unpacker cannot set the
        // owner, and a half-applied file must not end up in a template.
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o755);
        header.as_gnu_mut().unwrap().uid = *b"bogus!!\0";
        header.set_cksum();
        builder
            .append_data(&mut header, "bin/tool", &b"x"[..])
            .unwrap();
        let layer = builder.into_inner().unwrap();
        let staging = tempfile::tempdir().unwrap();
        let result = unpack_files(Box::new(io::Cursor::new(layer)), staging.path());
        if nix_is_root() {
            let error = result.unwrap_err().to_string();
            assert!(error.contains("bin/tool"), "{error}");
        } else {
            // Without root, owners are not applied, so the entry applies whole.
            assert_eq!(result.unwrap(), 0);
        }
    }

    #[test]
    fn docker_save_layers_apply_with_whiteouts() {
        let manifest = br#"[{"Config":"c.json","RepoTags":["t:latest"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#;
        let config = br#"{"architecture":"amd64","os":"linux","config":{
            "Env":["PATH=/usr/local/bin:/usr/bin:/bin","LANG=C.UTF-8"],
            "WorkingDir":"/srv/app","User":"app:staff","Cmd":["/bin/sh"]}}"#;
        let image = outer(&[
            ("manifest.json", manifest.to_vec()),
            ("c.json", config.to_vec()),
            ("l1/layer.tar", lower()),
            ("l2/layer.tar", upper()),
        ]);
        let staging = tempfile::tempdir().unwrap();
        let config = apply(image.path(), staging.path()).unwrap();
        check(staging.path());
        assert_eq!(
            config.env,
            vec![
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
                ("LANG".to_owned(), "C.UTF-8".to_owned())
            ]
        );
        assert_eq!(config.cwd.as_deref(), Some("/srv/app"));
        assert_eq!(config.user.as_deref(), Some("app:staff"));
    }

    #[test]
    fn an_image_without_its_config_applies_with_no_defaults() {
        let manifest = br#"[{"Config":"missing.json","Layers":["l1/layer.tar"]}]"#;
        let image = outer(&[
            ("manifest.json", manifest.to_vec()),
            ("l1/layer.tar", lower()),
        ]);
        let staging = tempfile::tempdir().unwrap();
        let config = apply(image.path(), staging.path()).unwrap();
        assert_eq!(config, ImageConfig::default());
        assert!(staging.path().join("etc/keep").is_file());
    }

    #[test]
    fn oci_layout_with_gzip_layers_applies() {
        let gzip = |data: Vec<u8>| {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&data).unwrap();
            encoder.finish().unwrap()
        };
        let index = br#"{"schemaVersion":2,"manifests":[
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:arm","platform":{"architecture":"arm64","os":"linux"}},
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:m","platform":{"architecture":"amd64","os":"linux"}}]}"#;
        let manifest = br#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:c"},"layers":[
            {"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:a"},
            {"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:b"}]}"#;
        let image = outer(&[
            ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
            ("index.json", index.to_vec()),
            ("blobs/sha256/m", manifest.to_vec()),
            (
                "blobs/sha256/c",
                br#"{"config":{"Env":["HOME=/home/x"],"WorkingDir":"/w","User":"1000"}}"#.to_vec(),
            ),
            ("blobs/sha256/a", gzip(lower())),
            ("blobs/sha256/b", upper()),
        ]);
        let staging = tempfile::tempdir().unwrap();
        let config = apply(image.path(), staging.path()).unwrap();
        check(staging.path());
        assert_eq!(config.env, vec![("HOME".to_owned(), "/home/x".to_owned())]);
        assert_eq!(config.cwd.as_deref(), Some("/w"));
        assert_eq!(config.user.as_deref(), Some("1000"));
    }

    #[test]
    fn paths_with_parent_components_are_refused() {
        assert_eq!(clean_path(Path::new("./a/b")), Some(PathBuf::from("a/b")));
        assert_eq!(clean_path(Path::new("/a")), Some(PathBuf::from("a")));
        assert_eq!(clean_path(Path::new("a/../../b")), None);
    }

    #[test]
    fn whiteouts_never_act_through_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), b"x").unwrap();
        let staging = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), staging.path().join("link")).unwrap();
        let evil = layer(&[
            ("link/.wh.precious", Some(b"")),
            ("link/.wh..wh..opq", Some(b"")),
        ]);
        apply_whiteouts(
            Box::new(io::Cursor::new(evil.clone())),
            staging.path(),
            EntryPolicy::Skip,
        )
        .unwrap();
        assert!(outside.path().join("precious").exists());
        let error = apply_whiteouts(
            Box::new(io::Cursor::new(evil)),
            staging.path(),
            EntryPolicy::Refuse,
        )
        .unwrap_err();
        let escaping = escaping_entry(&error).expect("not an escaping entry");
        assert_eq!(escaping.path, Path::new("link/.wh.precious"));
        assert!(outside.path().join("precious").exists());
    }
}
