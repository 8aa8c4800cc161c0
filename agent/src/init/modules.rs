//! Kernel modules the image builder chose, loaded in the order it wrote them.
//!
//! The list lives at [`MODULE_LIST_PATH`]: one absolute `.ko` path per line, in
//! dependency order (the builder resolves `modules.dep`); blank lines and `#`
//! comments are skipped. A module that is loaded already (`EEXIST`) counts as loaded;
//! a missing list means the kernel needs no modules.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::kmod::{finit_module, ModuleInitFlags};
use tracing::{debug, info, warn};

use super::InitError;

/// Where the image builder writes the module list.
pub const MODULE_LIST_PATH: &str = "/etc/sandbox/modules";

/// What [`load_listed`] did.
#[derive(Debug, Default)]
pub struct ModulesReport {
    /// Modules this call loaded.
    pub loaded: Vec<PathBuf>,
    /// Modules the kernel had already.
    pub present: Vec<PathBuf>,
    /// Modules that failed to load; the rest were still tried.
    pub failed: Vec<InitError>,
}

/// Loads every module in [`MODULE_LIST_PATH`].
pub fn load_listed() -> ModulesReport {
    load_from(Path::new(MODULE_LIST_PATH))
}

/// Loads every module listed in `list`.
pub fn load_from(list: &Path) -> ModulesReport {
    let mut report = ModulesReport::default();
    let text = match fs::read_to_string(list) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            debug!(list = %list.display(), "no module list");
            return report;
        }
        Err(error) => {
            report.failed.push(InitError::ReadModuleList {
                path: list.to_owned(),
                error,
            });
            return report;
        }
    };
    for path in parse_list(&text) {
        match load_one(&path) {
            Ok(true) => {
                debug!(module = %path.display(), "module loaded");
                report.loaded.push(path);
            }
            Ok(false) => report.present.push(path),
            Err(error) => {
                warn!(%error, "module not loaded");
                report.failed.push(error);
            }
        }
    }
    info!(
        loaded = report.loaded.len(),
        present = report.present.len(),
        failed = report.failed.len(),
        "kernel modules"
    );
    report
}

/// The module paths in a list file, in order.
pub fn parse_list(text: &str) -> Vec<PathBuf> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(PathBuf::from)
        .collect()
}

/// Loads one module; `Ok(false)` when it is loaded already.
fn load_one(path: &Path) -> Result<bool, InitError> {
    let file = File::open(path).map_err(|error| InitError::LoadModule {
        path: path.to_owned(),
        error,
    })?;
    match finit_module(&file, c"", ModuleInitFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => Ok(false),
        Err(errno) => Err(InitError::LoadModule {
            path: path.to_owned(),
            error: errno.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_skips_blanks_and_comments() {
        let text = "# load order\n/lib/modules/a.ko\n\n  /lib/modules/b.ko  \n#/c.ko\n";
        assert_eq!(
            parse_list(text),
            vec![
                PathBuf::from("/lib/modules/a.ko"),
                PathBuf::from("/lib/modules/b.ko")
            ]
        );
    }

    #[test]
    fn missing_list_is_not_an_error() {
        let report = load_from(Path::new("/nonexistent/sandbox/modules"));
        assert!(report.loaded.is_empty() && report.failed.is_empty());
    }
}
