//! `template.json`: what a template folder holds and how to boot it.
//!
//! Paths are relative to the template folder. The launcher appends host-specific
//! kernel parameters (such as `tsc_early_khz=`) itself at boot.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sandbox_protocol::ImageConfig;
use serde::{Deserialize, Serialize};

use crate::size::Size;

/// The manifest's file name inside a template folder.
pub const MANIFEST_FILE: &str = "template.json";

/// A template's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateManifest {
    /// The template's name (its folder name).
    pub name: String,
    /// Kernel image: an uncompressed ELF `vmlinux` (PVH boot) or a bzImage.
    pub kernel: PathBuf,
    /// The initramfs (uncompressed newc cpio) with the agent as `/init`.
    pub initramfs: PathBuf,
    /// ext4 root disk, when the base did not fit the initramfs. Boot it copy-on-write.
    pub disk: Option<PathBuf>,
    /// Kernel command line, without host-specific parameters.
    pub cmdline: String,
    /// `uname -r` of the kernel.
    pub kernel_version: String,
    /// Version of the agent baked in.
    pub agent_version: String,
    /// The size a VM gets unless told otherwise; written as its name (`"small"`,
    /// `"2x1536"`) and checked on reading.
    #[serde(with = "crate::size::as_name")]
    pub default_size: Size,
    /// When the template was built (RFC 3339, UTC).
    pub created_at: String,
    /// A snapshot folder (a checkpoint of a running VM, written by `promote`): VMs
    /// of this template restore it instead of booting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<PathBuf>,
    /// What the template tells its agent (also in the guest at
    /// `/etc/sandbox/image.json`): an image's `Env`, `WorkingDir` and `User`, and the
    /// sessions started at boot. Left out when empty, so older readers still load
    /// the manifests of templates that have none.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub image_config: ImageConfig,
    /// The registry image the template was built from (`--base oci://…`): the
    /// reference as given and the manifest digest it resolved to, so that a rebuild
    /// can be pinned to the same bytes. Left out for other bases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_source: Option<ImageSource>,
}

/// Where a template built from a registry image came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSource {
    /// The reference, fully qualified (`oci://docker.io/library/python:3.12-slim`).
    pub reference: String,
    /// The digest of the `linux/amd64` image manifest the layers came from.
    pub manifest_digest: String,
    /// The digest of the index that named it, when the reference is multi-platform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
    /// A digest of the build options that shape the template (size, layout, kernel,
    /// agent, command line, sessions, limits): a rebuild from the same manifest with
    /// the same options is a cache hit that rewrites nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_options: Option<String>,
}

fn is_empty(config: &ImageConfig) -> bool {
    *config == ImageConfig::default()
}

/// The manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Reading or writing the file failed.
    #[error("Cannot access {}", path.display())]
    Io {
        /// The manifest file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The file is not a valid manifest.
    #[error("Invalid template manifest {}", path.display())]
    Parse {
        /// The manifest file.
        path: PathBuf,
        /// Why.
        #[source]
        error: serde_json::Error,
    },
}

impl TemplateManifest {
    /// Loads `template.json` from a template folder.
    pub fn load(template_dir: &Path) -> Result<Self, ManifestError> {
        let path = template_dir.join(MANIFEST_FILE);
        let text = fs::read_to_string(&path).map_err(|error| ManifestError::Io {
            path: path.clone(),
            error,
        })?;
        serde_json::from_str(&text).map_err(|error| ManifestError::Parse { path, error })
    }

    /// Writes `template.json` into a template folder.
    pub fn save(&self, template_dir: &Path) -> Result<(), ManifestError> {
        let path = template_dir.join(MANIFEST_FILE);
        let mut text =
            serde_json::to_string_pretty(self).map_err(|error| ManifestError::Parse {
                path: path.clone(),
                error,
            })?;
        text.push('\n');
        fs::write(&path, text).map_err(|error| ManifestError::Io { path, error })
    }

    /// `path` (one of the manifest's) resolved against the template folder.
    pub fn resolve(template_dir: &Path, path: &Path) -> PathBuf {
        template_dir.join(path)
    }
}

/// Now, as RFC 3339 UTC with seconds (`2024-05-01T12:00:00Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Seconds since the epoch as RFC 3339 UTC.
pub fn rfc3339(unix_secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(unix_secs))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TemplateManifest {
        TemplateManifest {
            snapshot: None,
            name: "default".into(),
            kernel: "vmlinux".into(),
            initramfs: "initramfs.cpio".into(),
            disk: None,
            cmdline: "console=ttyS0 quiet panic=-1".into(),
            kernel_version: "6.1.0-56-cloud-amd64".into(),
            agent_version: "0.1.0".into(),
            default_size: Size::SMALL,
            created_at: "2024-05-01T12:00:00Z".into(),
            image_config: ImageConfig::default(),
            image_source: None,
        }
    }

    #[test]
    fn manifest_round_trips_through_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = sample();
        manifest.disk = Some("rootfs.ext4".into());
        manifest.save(dir.path()).unwrap();
        assert_eq!(TemplateManifest::load(dir.path()).unwrap(), manifest);
    }

    #[test]
    fn manifest_json_field_names_are_stable() {
        let json = serde_json::to_value(sample()).unwrap();
        assert_eq!(json["kernel"], "vmlinux");
        assert_eq!(json["disk"], serde_json::Value::Null);
        assert_eq!(json["default_size"], "small");
    }

    #[test]
    fn sizes_are_written_by_name_and_checked_on_reading() {
        let mut manifest = sample();
        manifest.default_size = Size::new(3, 1536).unwrap();
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["default_size"], "3x1536");
        assert_eq!(
            serde_json::from_value::<TemplateManifest>(json).unwrap(),
            manifest
        );
        for bad in ["huge", "0x512", "1x64"] {
            let mut json = serde_json::to_value(sample()).unwrap();
            json["default_size"] = bad.into();
            let error = serde_json::from_value::<TemplateManifest>(json).unwrap_err();
            assert!(error.to_string().contains("ize"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_image_config_is_recorded_and_older_manifests_load_without_it() {
        let json = serde_json::to_value(sample()).unwrap();
        assert!(
            json.get("image_config").is_none(),
            "an empty config is left out"
        );
        // A manifest written before the field existed.
        let old = r#"{"name":"default","kernel":"vmlinux","initramfs":"initramfs.cpio",
            "disk":null,"cmdline":"console=ttyS0","kernel_version":"6.1.0-56-cloud-amd64",
            "agent_version":"0.1.0","default_size":"small","created_at":"2024-05-01T12:00:00Z"}"#;
        let loaded: TemplateManifest = serde_json::from_str(old).unwrap();
        assert_eq!(loaded.image_config, ImageConfig::default());

        let mut manifest = sample();
        manifest.image_config = ImageConfig {
            env: vec![("PATH".into(), "/usr/local/bin:/usr/bin".into())],
            cwd: Some("/app".into()),
            user: Some("1000:1000".into()),
            sessions: vec![sandbox_protocol::WarmSession {
                name: "default".into(),
                language: sandbox_protocol::Language::Python,
                setup: "import json".into(),
            }],
        };
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["image_config"]["cwd"], "/app");
        assert_eq!(json["image_config"]["env"][0][0], "PATH");
        assert_eq!(json["image_config"]["sessions"][0]["language"], "python");
        assert_eq!(
            serde_json::from_value::<TemplateManifest>(json).unwrap(),
            manifest
        );
    }

    #[test]
    fn the_image_source_is_recorded_only_for_registry_images() {
        let json = serde_json::to_value(sample()).unwrap();
        assert!(json.get("image_source").is_none());
        let mut manifest = sample();
        manifest.image_source = Some(ImageSource {
            reference: "oci://docker.io/library/python:3.12-slim".into(),
            manifest_digest: format!("sha256:{}", "a".repeat(64)),
            index_digest: None,
            build_options: None,
        });
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(
            json["image_source"]["reference"],
            "oci://docker.io/library/python:3.12-slim"
        );
        assert_eq!(
            serde_json::from_value::<TemplateManifest>(json).unwrap(),
            manifest
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let mut json = serde_json::to_value(sample()).unwrap();
        json["surprise"] = 1.into();
        assert!(serde_json::from_value::<TemplateManifest>(json).is_err());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_714_564_800), "2024-05-01T12:00:00Z");
    }
}
