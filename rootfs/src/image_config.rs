//! What a template tells its agent ([`ImageConfig`]): the image's `Env`,
//! `WorkingDir` and `User` (from an image base's config, see
//! [`crate::base::oci_config`]) and the interpreter sessions to start at boot
//! (`--warm-session`). The builder writes it into the guest at
//! [`IMAGE_CONFIG_PATH`], where the agent reads it as PID 1, and records it in
//! `template.json`.
//!
//! The file is written for every template, an empty config too, so the guest's copy
//! always matches the manifest (a `dir:` base copied from another template brings
//! that template's file, which is replaced).
//!
//! A `WorkingDir` the image lacks is created (mode 0755, owned by the builder, root
//! in CI), as Docker creates one when a container starts, so that processes start
//! there rather than falling back to the home folder.

use std::fs;
use std::path::Path;

use sandbox_protocol::eval::is_valid_session_name;
use sandbox_protocol::image::IMAGE_CONFIG_PATH;
use sandbox_protocol::{ImageConfig, Language, WarmSession};
use tracing::{info, warn};

use crate::tree::{guest_path, make_dir, write_file, TreeError};

/// Writing the image's config failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageConfigError {
    /// Two `--warm-session`s share a name.
    #[error("Session {name:?} is warmed twice")]
    DuplicateSession {
        /// The name.
        name: String,
    },
    /// The config could not be encoded.
    #[error("Cannot encode the image config")]
    Encode(#[source] serde_json::Error),
    /// A file operation failed.
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// Parses `--warm-session NAME:LANGUAGE[:SETUP_CODE]`: the setup code is everything
/// after the second `:` (colons in it are kept).
pub fn parse_warm_session(text: &str) -> Result<WarmSession, String> {
    let mut parts = text.splitn(3, ':');
    let (Some(name), Some(language)) = (parts.next(), parts.next()) else {
        return Err(format!(
            "{text:?}: expected NAME:LANGUAGE[:SETUP_CODE], e.g. default:python:import json"
        ));
    };
    if !is_valid_session_name(name) {
        return Err(format!(
            "{name:?} is not a session name: 1 to 64 letters, digits, '-', '_', '.'"
        ));
    }
    let language = Language::parse(language)
        .ok_or_else(|| format!("unknown language {language:?}: expected python or sh"))?;
    Ok(WarmSession {
        name: name.to_owned(),
        language,
        setup: parts.next().unwrap_or_default().to_owned(),
    })
}

/// Refuses a session name given twice (checked before the build's slow steps).
pub fn check_sessions(sessions: &[WarmSession]) -> Result<(), ImageConfigError> {
    for (i, session) in sessions.iter().enumerate() {
        if sessions[..i].iter().any(|s| s.name == session.name) {
            return Err(ImageConfigError::DuplicateSession {
                name: session.name.clone(),
            });
        }
    }
    Ok(())
}

/// Writes `config` into the guest tree at `root` and creates its working directory
/// when missing.
pub fn install(root: &Path, config: &ImageConfig) -> Result<(), ImageConfigError> {
    if let Some(dir) = &config.cwd {
        ensure_working_dir(root, dir)?;
    }
    let path = guest_path(root, IMAGE_CONFIG_PATH)?;
    if fs::symlink_metadata(&path).is_ok() {
        warn!(
            path = IMAGE_CONFIG_PATH,
            "the base's image config is replaced"
        );
    }
    let mut json = serde_json::to_vec_pretty(config).map_err(ImageConfigError::Encode)?;
    json.push(b'\n');
    write_file(&path, &json, 0o644)?;
    info!(
        variables = config.env.len(),
        cwd = config.cwd.as_deref().unwrap_or("-"),
        user = config.user.as_deref().unwrap_or("-"),
        sessions = config.sessions.len(),
        "image config written"
    );
    Ok(())
}

/// Creates `dir` (an absolute guest path) unless something is there. What cannot be
/// created is left to the agent, which falls back to the home folder with a warning.
fn ensure_working_dir(root: &Path, dir: &str) -> Result<(), ImageConfigError> {
    if !dir.starts_with('/') {
        warn!(
            dir,
            "the image's WorkingDir is not absolute; the agent will ignore it"
        );
        return Ok(());
    }
    let path = match guest_path(root, dir) {
        Ok(path) => path,
        Err(error) => {
            warn!(dir, %error, "the image's WorkingDir cannot be created here");
            return Ok(());
        }
    };
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() || meta.file_type().is_symlink() => {}
        Ok(_) => warn!(dir, "the image's WorkingDir is not a directory"),
        Err(_) => {
            info!(dir, "creating the image's WorkingDir");
            make_dir(&path, 0o755)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_sessions_parse_with_colons_in_the_setup_code() {
        let session = parse_warm_session("default:python:import json, os, sys").unwrap();
        assert_eq!(session.name, "default");
        assert_eq!(session.language, Language::Python);
        assert_eq!(session.setup, "import json, os, sys");
        let session = parse_warm_session("calc:py:f = lambda x: {'a': x}").unwrap();
        assert_eq!(session.setup, "f = lambda x: {'a': x}");
        let session = parse_warm_session("shell:sh").unwrap();
        assert_eq!(
            (session.language, session.setup.as_str()),
            (Language::Shell, "")
        );
        for bad in ["python", "default:", ":python", "a b:python", "x:ruby:1"] {
            assert!(parse_warm_session(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_session_name_is_warmed_once() {
        let one = parse_warm_session("default:python").unwrap();
        let other = parse_warm_session("other:python").unwrap();
        check_sessions(&[one.clone(), other]).unwrap();
        let error = check_sessions(&[one.clone(), one]).unwrap_err();
        assert!(matches!(error, ImageConfigError::DuplicateSession { .. }));
    }

    #[test]
    fn the_config_is_written_where_the_agent_reads_it_and_the_working_dir_made() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("srv")).unwrap();
        std::fs::write(root.path().join("srv/file"), b"x").unwrap();
        let config = ImageConfig {
            env: vec![("A".into(), "1".into())],
            cwd: Some("/srv/app/data".into()),
            user: Some("1000:1000".into()),
            sessions: vec![parse_warm_session("default:python:import json").unwrap()],
        };
        install(root.path(), &config).unwrap();
        let written = std::fs::read(root.path().join("etc/sandbox/image.json")).unwrap();
        assert_eq!(
            serde_json::from_slice::<ImageConfig>(&written).unwrap(),
            config
        );
        assert!(root.path().join("srv/app/data").is_dir());

        // A WorkingDir that is a file, or lies below a symlink, is left alone.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        for dir in ["/srv/file", "/link/app", "relative"] {
            let config = ImageConfig {
                cwd: Some(dir.into()),
                ..ImageConfig::default()
            };
            install(root.path(), &config).unwrap();
        }
        assert!(root.path().join("srv/file").is_file());
        assert!(
            !outside.path().join("app").exists(),
            "created through a symlink"
        );
    }
}
