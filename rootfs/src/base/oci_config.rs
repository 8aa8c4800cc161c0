//! An image's run config: the part of its config JSON (the `docker save` member
//! `manifest.json` names under `Config`, or the OCI manifest's `config` blob) that
//! says how its processes start. The template keeps `Env`, `WorkingDir` and `User`
//! as the agent's defaults ([`ImageConfig`]); `Cmd`, `Entrypoint` and the rest mean
//! nothing to a sandbox, whose processes are whatever each request runs.

use serde::Deserialize;
use tracing::warn;

use sandbox_protocol::ImageConfig;

/// The image config document, as far as it is read here.
#[derive(Debug, Default, Deserialize)]
pub struct OciImageConfig {
    /// The run config; absent in some minimal images.
    #[serde(default)]
    config: Option<OciRunConfig>,
}

/// `config` of an image config (the same fields in Docker's and the OCI format).
/// Docker writes `null` for an unset list, so each field is optional.
#[derive(Debug, Default, Deserialize)]
struct OciRunConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
}

impl OciImageConfig {
    /// The agent's defaults this config asks for. `NAME=value` entries become
    /// variables (an entry without `=` is skipped with a warning); an empty
    /// `WorkingDir` or `User` means none, as in Docker.
    pub fn into_image_config(self) -> ImageConfig {
        let run = self.config.unwrap_or_default();
        let env = run
            .env
            .unwrap_or_default()
            .into_iter()
            .filter_map(|entry| match entry.split_once('=') {
                Some((key, value)) if !key.is_empty() => Some((key.to_owned(), value.to_owned())),
                _ => {
                    warn!(entry, "image Env entry without NAME= skipped");
                    None
                }
            })
            .collect();
        let non_empty = |text: Option<String>| text.filter(|t| !t.is_empty());
        ImageConfig {
            env,
            cwd: non_empty(run.working_dir),
            user: non_empty(run.user),
            sessions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> ImageConfig {
        serde_json::from_str::<OciImageConfig>(json)
            .unwrap()
            .into_image_config()
    }

    #[test]
    fn env_working_dir_and_user_are_kept_and_the_rest_ignored() {
        let config = parse(
            r#"{"architecture":"amd64","os":"linux",
                "config":{"Env":["PATH=/usr/local/bin:/usr/bin","GREETING=a=b","EMPTY="],
                          "WorkingDir":"/app","User":"1000:1000",
                          "Cmd":["python3"],"Entrypoint":null,"Labels":{"x":"y"}},
                "rootfs":{"type":"layers","diff_ids":[]},"history":[]}"#,
        );
        assert_eq!(
            config.env,
            vec![
                ("PATH".to_owned(), "/usr/local/bin:/usr/bin".to_owned()),
                ("GREETING".to_owned(), "a=b".to_owned()),
                ("EMPTY".to_owned(), String::new()),
            ]
        );
        assert_eq!(config.cwd.as_deref(), Some("/app"));
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert!(config.sessions.is_empty());
    }

    #[test]
    fn unset_null_and_empty_fields_mean_no_default() {
        for json in [
            r#"{}"#,
            r#"{"config":null}"#,
            r#"{"config":{"Env":null,"WorkingDir":"","User":""}}"#,
        ] {
            assert_eq!(parse(json), ImageConfig::default(), "{json}");
        }
        // An entry without `=` is dropped, the others kept.
        let config = parse(r#"{"config":{"Env":["JUNK","=x","A=1"]}}"#);
        assert_eq!(config.env, vec![("A".to_owned(), "1".to_owned())]);
    }
}
