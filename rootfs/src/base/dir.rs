//! A base from a folder on the host, copied as is.

use std::path::Path;

use tracing::info;

use super::BaseError;
use crate::tree::copy_tree;

/// Copies `source`'s contents into `staging`.
pub fn install(source: &Path, staging: &Path) -> Result<(), BaseError> {
    if !source.is_dir() {
        return Err(BaseError::MissingDir {
            path: source.to_owned(),
        });
    }
    info!(source = %source.display(), "copying the base folder");
    copy_tree(source, staging)?;
    Ok(())
}
