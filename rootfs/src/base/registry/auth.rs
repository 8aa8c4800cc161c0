//! Which credentials a pull presents, in docker's order: an explicit
//! `--registry-auth USER:PASS` (or its environment variable, read by the command
//! line), else the registry's entry in docker's `config.json`, else none. Anonymous
//! pulls still answer token challenges: the client asks the realm a `WWW-Authenticate`
//! names for a pull token without credentials, as docker does for public images.
//!
//! Only `auths` entries are read (`auth`, base64 of `USER:PASS`, or `username` and
//! `password`). Credential helpers (`credsStore`, `credHelpers`) are programs this
//! builder does not run; a config naming one is warned about and the explicit flag
//! is the way to pass those credentials.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;
use tracing::{info, warn};

/// A user name and password.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// The user name.
    pub user: String,
    /// The password (never printed).
    pub password: String,
}

impl fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuth")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl std::str::FromStr for BasicAuth {
    type Err = String;

    /// `USER:PASS`; the password is everything after the first `:`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            Some((user, password)) if !user.is_empty() => Ok(Self {
                user: user.to_owned(),
                password: password.to_owned(),
            }),
            _ => Err("expected USER:PASSWORD".into()),
        }
    }
}

/// Reading docker's config failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The file exists but cannot be read.
    #[error("Cannot read {}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// The file is not docker's config format.
    #[error("Malformed docker config {}", path.display())]
    Parse {
        /// The config file.
        path: PathBuf,
        /// Why.
        #[source]
        error: serde_json::Error,
    },
    /// An `auth` entry is not base64 of `USER:PASS`.
    #[error("The auth entry for {registry} in {} is not base64 of USER:PASSWORD", path.display())]
    Entry {
        /// The config file.
        path: PathBuf,
        /// The entry's key.
        registry: String,
    },
}

/// Where credentials come from.
#[derive(Debug, Clone, Default)]
pub struct AuthSource {
    /// `--registry-auth` (or its environment variable): wins over the config.
    pub explicit: Option<BasicAuth>,
    /// Docker's `config.json` (`$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`); a missing file means no entries.
    pub docker_config: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuth>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: HashMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Docker Hub's names: config files key it by its v1 URL.
const DOCKER_HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// The host part of a config key (`https://index.docker.io/v1/` → `index.docker.io`).
fn key_host(key: &str) -> &str {
    let rest = key.split_once("://").map_or(key, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

fn same_registry(a: &str, b: &str) -> bool {
    a == b || (DOCKER_HUB.contains(&a) && DOCKER_HUB.contains(&b))
}

impl AuthSource {
    /// The credentials for `registry` (as the reference writes it).
    pub fn resolve(&self, registry: &str) -> Result<RegistryAuth, AuthError> {
        if let Some(basic) = &self.explicit {
            info!(registry, user = %basic.user, "credentials from --registry-auth");
            return Ok(RegistryAuth::Basic(
                basic.user.clone(),
                basic.password.clone(),
            ));
        }
        let Some(path) = &self.docker_config else {
            return Ok(RegistryAuth::Anonymous);
        };
        match from_docker_config(path, registry)? {
            Some(basic) => {
                info!(registry, user = %basic.user, config = %path.display(), "credentials from docker's config");
                Ok(RegistryAuth::Basic(basic.user, basic.password))
            }
            None => Ok(RegistryAuth::Anonymous),
        }
    }
}

/// The `auths` entry for `registry` in the config at `path`, if any.
fn from_docker_config(path: &Path, registry: &str) -> Result<Option<BasicAuth>, AuthError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(AuthError::Read {
                path: path.to_owned(),
                error,
            })
        }
    };
    let config: DockerConfig = serde_json::from_slice(&text).map_err(|error| AuthError::Parse {
        path: path.to_owned(),
        error,
    })?;
    let entry = config
        .auths
        .iter()
        .find(|(key, _)| same_registry(key_host(key), registry));
    let Some((key, entry)) = entry else {
        if config.creds_store.is_some()
            || config
                .cred_helpers
                .keys()
                .any(|key| same_registry(key_host(key), registry))
        {
            warn!(registry, config = %path.display(),
                "docker's config names a credential helper, which is not run; pass --registry-auth");
        }
        return Ok(None);
    };
    let bad_entry = || AuthError::Entry {
        path: path.to_owned(),
        registry: key.clone(),
    };
    if let Some(encoded) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| bad_entry())?;
        let text = String::from_utf8(decoded).map_err(|_| bad_entry())?;
        return text.parse().map(Some).map_err(|_| bad_entry());
    }
    match (&entry.username, &entry.password) {
        (Some(user), Some(password)) if !user.is_empty() => Ok(Some(BasicAuth {
            user: user.clone(),
            password: password.clone(),
        })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), json).unwrap();
        file
    }

    fn basic(auth: RegistryAuth) -> Option<(String, String)> {
        match auth {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        }
    }

    #[test]
    fn docker_config_entries_are_found_by_host() {
        // "alice:s3cr:et" and "bob:pw".
        let file = config(
            r#"{"auths":{
                "https://index.docker.io/v1/":{"auth":"YWxpY2U6czNjcjpldA=="},
                "127.0.0.1:5000":{"username":"bob","password":"pw"}}}"#,
        );
        let source = AuthSource {
            explicit: None,
            docker_config: Some(file.path().to_owned()),
        };
        assert_eq!(
            basic(source.resolve("docker.io").unwrap()),
            Some(("alice".into(), "s3cr:et".into()))
        );
        assert_eq!(
            basic(source.resolve("127.0.0.1:5000").unwrap()),
            Some(("bob".into(), "pw".into()))
        );
        assert_eq!(basic(source.resolve("ghcr.io").unwrap()), None);
        // The explicit flag wins.
        let source = AuthSource {
            explicit: Some("carol:x".parse().unwrap()),
            ..source
        };
        assert_eq!(
            basic(source.resolve("docker.io").unwrap()),
            Some(("carol".into(), "x".into()))
        );
    }

    #[test]
    fn a_missing_config_is_anonymous_and_a_broken_one_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let source = AuthSource {
            explicit: None,
            docker_config: Some(dir.path().join("config.json")),
        };
        assert!(matches!(
            source.resolve("docker.io").unwrap(),
            RegistryAuth::Anonymous
        ));
        for (json, kind) in [
            ("{not json", "parse"),
            (r#"{"auths":{"h":{"auth":"!!!"}}}"#, "entry"),
            (r#"{"auths":{"h":{"auth":"bm9jb2xvbg=="}}}"#, "entry"),
        ] {
            let file = config(json);
            let source = AuthSource {
                explicit: None,
                docker_config: Some(file.path().to_owned()),
            };
            let error = source.resolve("h").unwrap_err();
            match kind {
                "parse" => assert!(matches!(error, AuthError::Parse { .. }), "{json}"),
                _ => assert!(matches!(error, AuthError::Entry { .. }), "{json}"),
            }
        }
    }

    #[test]
    fn registry_auth_flags_parse_and_hide_the_password() {
        let auth: BasicAuth = "u:p:q".parse().unwrap();
        assert_eq!((auth.user.as_str(), auth.password.as_str()), ("u", "p:q"));
        assert!(!format!("{auth:?}").contains("p:q"));
        assert!(":p".parse::<BasicAuth>().is_err());
        assert!("nocolon".parse::<BasicAuth>().is_err());
    }
}
