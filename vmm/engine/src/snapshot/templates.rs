//! Deleting a promoted template (`DELETE /v1/templates` on a node): what promote made,
//! never a built template, the default or one a live sandbox was claimed from.

use sandbox_vmm::launcher::TemplateRef;

use crate::error::DeleteTemplateError;
use crate::node::Node;

/// A promoted template, deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateDeleted {
    /// Its name.
    pub name: String,
    /// What its files took on disk.
    pub freed_bytes: u64,
}

impl Node {
    /// Deletes the promoted template `name`. Refused while a sandbox of it lives: its
    /// disk overlay may back onto the template's disk, and a later hibernate or
    /// promote of it reads the template's files.
    pub fn delete_template(&self, name: &str) -> Result<TemplateDeleted, DeleteTemplateError> {
        let host = self.snapshots().ok_or(DeleteTemplateError::NotLaunch)?;
        let name = name.trim();
        if self.default_template() == Some(&TemplateRef::Name(name.to_owned())) {
            return Err(DeleteTemplateError::Default(name.to_owned()));
        }
        let users: Vec<String> = self
            .registry()
            .list()
            .into_iter()
            .filter(|sandbox| sandbox.template == name)
            .map(|sandbox| sandbox.id.to_string())
            .collect();
        if !users.is_empty() {
            return Err(DeleteTemplateError::InUse {
                name: name.to_owned(),
                sandboxes: users,
            });
        }
        let freed_bytes = host
            .launcher()
            .delete_promoted(name)
            .map_err(DeleteTemplateError::Snapshot)?;
        tracing::info!(template = name, freed_bytes, "promoted template deleted");
        Ok(TemplateDeleted {
            name: name.to_owned(),
            freed_bytes,
        })
    }
}
