//! Where templates and caches live.
//!
//! `SANDBOX_HOME` (default `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox`)
//! holds `templates/<name>/`, `cache/` and `run/`. This is the one rule: the builder,
//! the launcher, `sandboxctl` and the MCP server all resolve the home through
//! [`SandboxHome::from_vars`] and name its folders through its methods.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The template name used when none is given.
pub const DEFAULT_TEMPLATE: &str = "default";

/// The home folder could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// None of `SANDBOX_HOME`, `XDG_DATA_HOME` and `HOME` is set to an absolute path.
    #[error(
        "Cannot find a data folder: set SANDBOX_HOME, XDG_DATA_HOME or HOME to an absolute path"
    )]
    NoHome,
}

/// The root of everything this project stores on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHome {
    root: PathBuf,
}

impl SandboxHome {
    /// A home at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Resolves the home from `SANDBOX_HOME`, `XDG_DATA_HOME` and `HOME`.
    pub fn from_env() -> Result<Self, PathsError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`SandboxHome::from_env`] over any variable lookup; empty values count as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self, PathsError> {
        let set = |name: &str| var(name).filter(|value| !value.is_empty());
        Self::resolve(set("SANDBOX_HOME"), set("XDG_DATA_HOME"), set("HOME"))
    }

    /// The resolution rule, apart from the environment. Relative values are ignored,
    /// as the XDG specification asks.
    pub fn resolve(
        sandbox_home: Option<OsString>,
        xdg_data_home: Option<OsString>,
        home: Option<OsString>,
    ) -> Result<Self, PathsError> {
        let absolute =
            |value: Option<OsString>| value.map(PathBuf::from).filter(|path| path.is_absolute());
        if let Some(root) = absolute(sandbox_home) {
            return Ok(Self::new(root));
        }
        if let Some(data) = absolute(xdg_data_home) {
            return Ok(Self::new(data.join("sandbox")));
        }
        match absolute(home) {
            Some(home) => Ok(Self::new(home.join(".local/share/sandbox"))),
            None => Err(PathsError::NoHome),
        }
    }

    /// The home folder itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where templates live, one folder each.
    pub fn templates(&self) -> PathBuf {
        self.root.join("templates")
    }

    /// The folder of template `name`.
    pub fn template(&self, name: &str) -> PathBuf {
        self.templates().join(name)
    }

    /// Downloads and other reusable intermediate files.
    pub fn cache(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// The default root of per-VM run folders.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(value: &str) -> Option<OsString> {
        Some(OsString::from(value))
    }

    #[test]
    fn sandbox_home_wins() {
        let home = SandboxHome::resolve(os("/sb"), os("/xdg"), os("/home/u")).unwrap();
        assert_eq!(
            home.template("default"),
            PathBuf::from("/sb/templates/default")
        );
    }

    #[test]
    fn xdg_data_home_then_home() {
        let home = SandboxHome::resolve(None, os("/xdg"), os("/home/u")).unwrap();
        assert_eq!(home.root(), Path::new("/xdg/sandbox"));
        let home = SandboxHome::resolve(None, os("relative"), os("/home/u")).unwrap();
        assert_eq!(home.root(), Path::new("/home/u/.local/share/sandbox"));
        assert_eq!(
            home.cache(),
            PathBuf::from("/home/u/.local/share/sandbox/cache")
        );
    }

    #[test]
    fn no_home_is_an_error() {
        assert!(SandboxHome::resolve(None, None, None).is_err());
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let vars = |name: &str| match name {
            "SANDBOX_HOME" => os(""),
            "HOME" => os("/home/u"),
            _ => None,
        };
        let home = SandboxHome::from_vars(vars).unwrap();
        assert_eq!(home.root(), Path::new("/home/u/.local/share/sandbox"));
        assert_eq!(home.run(), Path::new("/home/u/.local/share/sandbox/run"));
    }
}
