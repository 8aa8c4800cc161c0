//! The JSON a registry serves, as far as a pull reads it: an image index (or
//! Docker manifest list) naming one manifest per platform, and an image manifest
//! naming a config and layers. Parsed here, not by the client, so that the bytes
//! hashed are the bytes read, and so that what is refused gets an error of its own.

use serde::Deserialize;

/// The platform a template runs on: the microVMs are x86-64 Linux.
pub const WANTED_OS: &str = "linux";
/// See [`WANTED_OS`].
pub const WANTED_ARCHITECTURE: &str = "amd64";

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
pub struct Descriptor {
    /// What it points at.
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    /// `sha256:HEX` (checked before use).
    pub digest: String,
    /// Its size in bytes; a blob of another size is refused.
    pub size: i64,
    /// In an index: whom the manifest is for.
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// An index entry's platform.
#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    /// `amd64`, `arm64`, …
    pub architecture: String,
    /// `linux`, `windows`, …
    pub os: String,
    /// `v8`, … (not matched on).
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    /// `os/architecture[/variant]`.
    pub fn name(&self) -> String {
        match &self.variant {
            Some(variant) => format!("{}/{}/{variant}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Raw {
    #[serde(rename = "schemaVersion", default)]
    schema_version: Option<i64>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

/// A parsed manifest document.
#[derive(Debug)]
pub enum Document {
    /// An index or manifest list.
    Index(Vec<Descriptor>),
    /// An image manifest.
    Image {
        /// The config blob.
        config: Descriptor,
        /// The layers, lowest first.
        layers: Vec<Descriptor>,
    },
}

/// Why a document was not usable.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// Not JSON of either shape.
    #[error("Malformed manifest")]
    Json(#[from] serde_json::Error),
    /// Docker's schema 1 (signed manifests from before 2017).
    #[error("Manifest schema {0} is not supported (only schema 2 and OCI)")]
    Schema(i64),
    /// Neither `manifests` nor `config` and `layers`.
    #[error("The document is neither an image index nor an image manifest")]
    Shape,
}

impl Document {
    /// Parses a manifest or index.
    pub fn parse(bytes: &[u8]) -> Result<Self, DocumentError> {
        let raw: Raw = serde_json::from_slice(bytes)?;
        match raw.schema_version {
            Some(2) | None => {}
            Some(other) => return Err(DocumentError::Schema(other)),
        }
        match raw {
            Raw {
                manifests: Some(manifests),
                ..
            } => Ok(Self::Index(manifests)),
            Raw {
                config: Some(config),
                layers: Some(layers),
                ..
            } => Ok(Self::Image { config, layers }),
            _ => Err(DocumentError::Shape),
        }
    }
}

/// The index entry for `linux/amd64`; else the platforms it offers (`unknown`
/// for entries without one, such as attestations).
pub fn pick_platform(manifests: &[Descriptor]) -> Result<&Descriptor, Vec<String>> {
    manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == WANTED_OS && p.architecture == WANTED_ARCHITECTURE)
        })
        .ok_or_else(|| {
            manifests
                .iter()
                .map(|m| m.platform.as_ref().map_or("unknown".into(), Platform::name))
                .collect()
        })
}

/// The platform an image config says its binaries are for.
#[derive(Debug, Default, Deserialize)]
pub struct ConfigPlatform {
    /// `amd64`, … (absent in some hand-made images: taken as fitting).
    #[serde(default)]
    pub architecture: Option<String>,
    /// `linux`, …
    #[serde(default)]
    pub os: Option<String>,
}

impl ConfigPlatform {
    /// True unless the config names another OS or architecture.
    pub fn fits(&self) -> bool {
        self.os.as_deref().is_none_or(|os| os == WANTED_OS)
            && self
                .architecture
                .as_deref()
                .is_none_or(|arch| arch == WANTED_ARCHITECTURE)
    }

    /// `os/architecture`, as far as known.
    pub fn name(&self) -> String {
        format!(
            "{}/{}",
            self.os.as_deref().unwrap_or("?"),
            self.architecture.as_deref().unwrap_or("?")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_resolves_to_linux_amd64_or_lists_what_it_has() {
        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
            {"mediaType":"m","digest":"sha256:a","size":1,"platform":{"architecture":"arm64","os":"linux","variant":"v8"}},
            {"mediaType":"m","digest":"sha256:b","size":1,"platform":{"architecture":"amd64","os":"linux"}},
            {"mediaType":"m","digest":"sha256:c","size":1}]}"#;
        let Document::Index(manifests) = Document::parse(index).unwrap() else {
            panic!("not an index");
        };
        assert_eq!(pick_platform(&manifests).unwrap().digest, "sha256:b");
        let others = &manifests[..1];
        assert_eq!(pick_platform(others).unwrap_err(), vec!["linux/arm64/v8"]);
        let none: Vec<Descriptor> = vec![manifests[2].clone()];
        assert_eq!(pick_platform(&none).unwrap_err(), vec!["unknown"]);
    }

    #[test]
    fn manifests_parse_and_other_shapes_are_refused() {
        let manifest =
            br#"{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:c","size":2},
            "layers":[{"mediaType":"l","digest":"sha256:l","size":3}]}"#;
        let Document::Image { config, layers } = Document::parse(manifest).unwrap() else {
            panic!("not a manifest");
        };
        assert_eq!((config.size, layers.len()), (2, 1));
        assert!(matches!(
            Document::parse(br#"{"schemaVersion":1,"fsLayers":[]}"#),
            Err(DocumentError::Schema(1))
        ));
        assert!(matches!(
            Document::parse(br#"{"schemaVersion":2}"#),
            Err(DocumentError::Shape)
        ));
        assert!(matches!(
            Document::parse(b"<html>"),
            Err(DocumentError::Json(_))
        ));
    }

    #[test]
    fn a_config_for_another_platform_does_not_fit() {
        let parse = |json: &str| serde_json::from_str::<ConfigPlatform>(json).unwrap();
        assert!(parse(r#"{"architecture":"amd64","os":"linux"}"#).fits());
        assert!(parse(r#"{}"#).fits());
        assert!(!parse(r#"{"architecture":"arm64","os":"linux"}"#).fits());
        assert!(!parse(r#"{"architecture":"amd64","os":"windows"}"#).fits());
    }
}
