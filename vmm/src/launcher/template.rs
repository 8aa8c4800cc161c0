//! Templates: what a VM boots.
//!
//! A template is a folder with a `template.json`, written by the image builder:
//!
//! ```json
//! { "name": "default", "kernel": "vmlinux", "initramfs": "initramfs.cpio",
//!   "disk": null, "cmdline": "console=ttyS0 quiet", "kernel_version": "6.1.0-…",
//!   "agent_version": "0.1.0", "default_size": "small", "created_at": "…" }
//! ```
//!
//! The format is the builder's own type, [`sandbox_rootfs::TemplateManifest`], read
//! here as written. Paths are relative to the folder (absolute ones are taken as they
//! are), `default_size` is a preset name or `VCPUSxMIB` (checked when the manifest is
//! read, and already when the template was built), and every file named must
//! exist. The launcher only reads a template; a disk is used through an overlay.

use std::fmt;
use std::path::{Path, PathBuf};

use sandbox_rootfs::manifest::ManifestError;
use sandbox_rootfs::TemplateManifest;

use super::size::Size;

/// The description file in every template folder.
pub const TEMPLATE_FILE: &str = sandbox_rootfs::MANIFEST_FILE;

/// The template booted when none is named.
pub const DEFAULT_TEMPLATE: &str = sandbox_rootfs::DEFAULT_TEMPLATE;

/// Why a template could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// No `template.json` in the folder.
    #[error("No template at {dir} ({TEMPLATE_FILE} missing); build one with the image builder")]
    NotFound {
        /// The template folder.
        dir: PathBuf,
    },
    /// `template.json` could not be read.
    #[error("Cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: std::io::Error,
    },
    /// `template.json` is not valid.
    #[error("Invalid {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: serde_json::Error,
    },
    /// A file the template names is missing.
    #[error("Template {template} names a {role} at {path}, which is not a file")]
    MissingFile {
        /// The template folder.
        template: PathBuf,
        /// `kernel`, `initramfs` or `disk`.
        role: &'static str,
        /// The missing path.
        path: PathBuf,
    },
}

/// A template by name (a folder under the templates root) or by path (a folder, or its
/// `template.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRef {
    /// `TEMPLATES_ROOT/<name>`.
    Name(String),
    /// A template folder or its `template.json`.
    Path(PathBuf),
}

impl TemplateRef {
    /// A plain word is a name; anything with a `/`, or `.`/`..`, is a path.
    pub fn parse(s: &str) -> Self {
        if s.contains('/') || s == "." || s == ".." {
            Self::Path(PathBuf::from(s))
        } else {
            Self::Name(s.to_owned())
        }
    }

    /// The template folder this refers to.
    pub fn dir(&self, templates_root: &Path) -> PathBuf {
        match self {
            Self::Name(name) => templates_root.join(name),
            Self::Path(path) if path.file_name() == Some(TEMPLATE_FILE.as_ref()) => path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            Self::Path(path) => path.clone(),
        }
    }
}

impl Default for TemplateRef {
    fn default() -> Self {
        Self::Name(DEFAULT_TEMPLATE.to_owned())
    }
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

impl From<&str> for TemplateRef {
    fn from(s: &str) -> Self {
        Self::parse(s)
    }
}

impl From<PathBuf> for TemplateRef {
    fn from(path: PathBuf) -> Self {
        Self::Path(path)
    }
}

/// A loaded template with absolute paths to files that exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The template folder (absolute).
    pub dir: PathBuf,
    /// Its name (the folder name when the file has none).
    pub name: String,
    /// The kernel: an uncompressed `vmlinux` (PVH entry) for the microvm machine.
    pub kernel: PathBuf,
    /// The initramfs, if any.
    pub initramfs: Option<PathBuf>,
    /// A raw root disk, if any; booted through a copy-on-write overlay.
    pub disk: Option<PathBuf>,
    /// The kernel command line the builder chose.
    pub cmdline: String,
    /// The kernel release, for reports.
    pub kernel_version: Option<String>,
    /// The agent's version inside, for reports.
    pub agent_version: Option<String>,
    /// The size to boot when the caller names none.
    pub default_size: Size,
    /// The snapshot its VMs restore (a promoted template), absolute.
    pub snapshot: Option<PathBuf>,
    /// What it tells its agent (`Env`, `WorkingDir`, `User`, warm sessions), for
    /// reports and for a template promoted from one of its VMs.
    pub image_config: sandbox_protocol::ImageConfig,
}

impl Template {
    /// Loads the template in `dir`.
    pub fn load(dir: &Path) -> Result<Self, TemplateError> {
        let file = dir.join(TEMPLATE_FILE);
        if !file.is_file() {
            return Err(TemplateError::NotFound {
                dir: dir.to_owned(),
            });
        }
        let raw = TemplateManifest::load(dir).map_err(|error| match error {
            ManifestError::Io { path, error } => TemplateError::Read { path, error },
            ManifestError::Parse { path, error } => TemplateError::Parse { path, error },
        })?;
        let dir = dir.canonicalize().map_err(|error| TemplateError::Read {
            path: dir.to_owned(),
            error,
        })?;
        let existing = |role: &'static str, rel: &Path| {
            let path = dir.join(rel);
            if path.is_file() {
                Ok(path)
            } else {
                Err(TemplateError::MissingFile {
                    template: dir.clone(),
                    role,
                    path,
                })
            }
        };
        let kernel = existing("kernel", &raw.kernel)?;
        let initramfs = Some(existing("initramfs", &raw.initramfs)?);
        let disk = raw
            .disk
            .as_deref()
            .map(|p| existing("disk", p))
            .transpose()?;
        Ok(Self {
            name: raw.name,
            kernel,
            initramfs,
            disk,
            cmdline: raw.cmdline,
            kernel_version: Some(raw.kernel_version),
            agent_version: Some(raw.agent_version),
            default_size: raw.default_size,
            snapshot: raw.snapshot.map(|rel| dir.join(rel)),
            image_config: raw.image_config,
            dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn folder(json: &str, files: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sbx-template-{}-{}",
            std::process::id(),
            super::super::run_dir::VmId::generate()
        ));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(TEMPLATE_FILE), json).unwrap();
        for f in files {
            fs::write(dir.join(f), b"x").unwrap();
        }
        dir
    }

    fn manifest(kernel: &str, initramfs: &str, size: &str) -> String {
        format!(
            r#"{{"name":"t","kernel":"{kernel}","initramfs":"{initramfs}","disk":null,
                "cmdline":"","kernel_version":"k","agent_version":"0","default_size":"{size}",
                "created_at":"2025-01-01T00:00:00Z"}}"#
        )
    }

    #[test]
    fn loads_the_builder_format_with_paths_made_absolute() {
        let dir = folder(
            r#"{"name":"default","kernel":"vmlinux","initramfs":"initramfs.cpio",
                "disk":null,"cmdline":"console=ttyS0 quiet","kernel_version":"6.1.0-56-cloud-amd64",
                "agent_version":"0.1.0","default_size":"medium","created_at":"2025-01-01T00:00:00Z"}"#,
            &["vmlinux", "initramfs.cpio"],
        );
        let t = Template::load(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        assert_eq!(t.name, "default");
        assert_eq!(t.kernel, dir.join("vmlinux"));
        assert_eq!(t.initramfs, Some(dir.join("initramfs.cpio")));
        assert_eq!(t.disk, None);
        assert_eq!(t.cmdline, "console=ttyS0 quiet");
        assert_eq!(t.default_size, Size::MEDIUM);
        assert_eq!(t.agent_version.as_deref(), Some("0.1.0"));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let dir = folder(&manifest("vmlinux", "gone.cpio", "small"), &["vmlinux"]);
        let err = Template::load(&dir).unwrap_err();
        assert!(
            matches!(
                &err,
                TemplateError::MissingFile {
                    role: "initramfs",
                    ..
                }
            ),
            "{err}"
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_absent_folder_or_bad_size_is_reported() {
        let err = Template::load(Path::new("/nonexistent/sbx-template")).unwrap_err();
        assert!(matches!(err, TemplateError::NotFound { .. }));
        let dir = folder(&manifest("k", "i", "huge"), &["k", "i"]);
        let err = Template::load(&dir).unwrap_err();
        assert!(matches!(err, TemplateError::Parse { .. }), "{err}");
        assert!(
            crate::error_chain(&err).contains("Unknown size \"huge\""),
            "{}",
            crate::error_chain(&err)
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refs_tell_names_from_paths() {
        let root = Path::new("/t");
        assert_eq!(
            TemplateRef::parse("default").dir(root),
            root.join("default")
        );
        assert_eq!(TemplateRef::parse("./x").dir(root), PathBuf::from("./x"));
        assert_eq!(
            TemplateRef::parse("/a/b/template.json").dir(root),
            PathBuf::from("/a/b")
        );
    }
}
