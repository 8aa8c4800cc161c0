//! The template's defaults ([`ImageConfig`]), read once at start from the image.

use std::path::Path;

use sandbox_protocol::ImageConfig;

/// Reads the image's config at `path`. A missing file means every default; a file
/// that cannot be read or parsed is logged and ignored, since the agent must start
/// whatever the image holds.
pub fn load(path: &Path) -> ImageConfig {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(config) => config,
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "image config ignored: not valid");
                ImageConfig::default()
            }
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => ImageConfig::default(),
        Err(error) => {
            tracing::error!(path = %path.display(), %error, "image config ignored: unreadable");
            ImageConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_broken_file_means_defaults() {
        let dir = std::env::temp_dir().join(format!("image-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(load(&dir.join("missing.json")), ImageConfig::default());
        let broken = dir.join("broken.json");
        std::fs::write(&broken, b"{ not json").unwrap();
        assert_eq!(load(&broken), ImageConfig::default());
        let good = dir.join("good.json");
        std::fs::write(
            &good,
            br#"{"env":[["A","1"]],"cwd":"/app","sessions":[{"name":"default","language":"python","setup":"import json"}]}"#,
        )
        .unwrap();
        let config = load(&good);
        assert_eq!(config.env, vec![("A".to_owned(), "1".to_owned())]);
        assert_eq!(config.cwd.as_deref(), Some("/app"));
        assert_eq!(config.sessions.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
