//! Directory trees for `copy_from_host` and `copy_to_host` with `recursive: true`:
//! the tree is listed first (on the host through descriptors that never follow a
//! link, see [`super::fs`]; in the sandbox through `list_dir`), then each directory
//! is made and each regular file copied as a single copy would be, its host side
//! resolved beneath the allowed directory again. Links and special files are left
//! out and counted. A failed copy stops there: what was copied stays, whole files
//! only.

use std::collections::VecDeque;

use sandbox_protocol::FileKind;
use sandbox_vmm::client::ClientError;
use sandbox_vmm::Client;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::fs::{base_name, into_dir, TreeEntry};
use super::tools::{on_host, CopyFromHostParams, CopyResult, CopyToHostParams, Direction};
use super::HostError;
use crate::backend::Handle;
use crate::error::{Op, ToolError};
use crate::render::success;
use crate::tools::SandboxServer;
use rmcp::model::CallToolResult;
use sandbox_engine::util::millis;

/// Most entries (files and directories) one tree copy takes.
pub const TREE_MAX_ENTRIES: usize = 10_000;

impl SandboxServer {
    /// `copy_from_host` with `recursive: true`.
    pub(super) async fn copy_tree_from_host(
        &self,
        sandbox: &Handle,
        params: CopyFromHostParams,
        started: Instant,
    ) -> Result<CallToolResult, ToolError> {
        let top = params.host_path.clone();
        let tree = on_host(&self.host, move |host| host.walk(&top, TREE_MAX_ENTRIES))
            .await
            .map_err(|error| self.host_error(&error, Direction::ToSandbox))?;
        let client = sandbox.client(Op::CopyIn).await?;
        let id = sandbox.id();
        let target = match client.stat(&params.path).await {
            Ok(stat) if stat.kind == FileKind::Dir => {
                into_dir(&params.path, base_name(&params.host_path).unwrap_or("tree"))
            }
            _ => params.path.clone(),
        };
        let guest = |error: ClientError| ToolError::agent(Op::CopyIn, id, &error);
        client.mkdir(&target, true, None).await.map_err(guest)?;
        let (mut files, mut dirs, mut bytes) = (0u64, 1u64, 0u64);
        for TreeEntry { rel, dir } in tree.entries {
            let path = format!("{target}/{rel}");
            if dir {
                client.mkdir(&path, true, None).await.map_err(guest)?;
                dirs += 1;
                continue;
            }
            let host_path = format!("{}/{rel}", params.host_path.trim_end_matches('/'));
            let source = on_host(&self.host, move |host| host.open_source(&host_path))
                .await
                .map_err(|error| self.host_error(&error, Direction::ToSandbox))?;
            let reader = tokio::fs::File::from_std(source.file).take(source.size);
            let (sent, _) = client
                .put(&path, Some(source.mode), reader)
                .await
                .map_err(guest)?;
            files += 1;
            bytes += sent;
        }
        Ok(success(&CopyResult {
            sandbox_id: id.to_owned(),
            host_path: params.host_path,
            path: target,
            bytes,
            mode: None,
            files: Some(files),
            dirs: Some(dirs),
            skipped: Some(tree.skipped),
            ms: millis(started.elapsed()),
            direction: "to_sandbox".to_owned(),
        }))
    }

    /// `copy_to_host` with `recursive: true`, for the sandbox directory
    /// `params.path`.
    pub(super) async fn copy_tree_to_host(
        &self,
        sandbox: &Handle,
        client: &Client,
        params: CopyToHostParams,
        started: Instant,
    ) -> Result<CallToolResult, ToolError> {
        let id = sandbox.id();
        let max = self.host.max_bytes();
        let (entries, skipped, total) = guest_tree(client, &params.path)
            .await
            .map_err(|error| ToolError::agent(Op::CopyOut, id, &error))?
            .map_err(|error| self.host_error(&error, Direction::ToHost))?;
        if total > max {
            return Err(
                self.host_error(&HostError::TooLarge { size: total, max }, Direction::ToHost)
            );
        }
        // Into an existing directory under the sandbox directory's name, else as
        // host_path itself; either way a new directory.
        let name = base_name(&params.path).unwrap_or("tree").to_owned();
        let (requested, top_name) = (params.host_path.clone(), name.clone());
        let top = on_host(&self.host, move |host| {
            let top = if host.is_dir(&requested) {
                into_dir(&requested, &top_name)
            } else {
                requested
            };
            host.mkdir(&top).map(|()| top)
        })
        .await
        .map_err(|error| self.host_error(&error, Direction::ToHost))?;
        let (mut files, mut dirs, mut bytes) = (0u64, 1u64, 0u64);
        for TreeEntry { rel, dir } in entries {
            let host_path = format!("{top}/{rel}");
            if dir {
                on_host(&self.host, move |host| host.mkdir(&host_path))
                    .await
                    .map_err(|error| self.host_error(&error, Direction::ToHost))?;
                dirs += 1;
                continue;
            }
            let file_name = base_name(&rel).unwrap_or("file").to_owned();
            let source = format!("{}/{rel}", params.path.trim_end_matches('/'));
            let (_, got, _) = self
                .receive(client, id, &source, (&host_path, &file_name, false), bytes)
                .await
                .map_err(|error| {
                    ToolError::new(format!(
                        "{} The {files} files copied before it are in {top}.",
                        error.message
                    ))
                })?;
            files += 1;
            bytes += got;
        }
        Ok(success(&CopyResult {
            sandbox_id: id.to_owned(),
            host_path: top,
            path: params.path,
            bytes,
            mode: None,
            files: Some(files),
            dirs: Some(dirs),
            skipped: Some(skipped),
            ms: millis(started.elapsed()),
            direction: "to_host".to_owned(),
        }))
    }
}

/// The sandbox tree under the directory `top`, parents before children: its
/// directories and regular files, how many entries were left out (links, special
/// files), and the files' total size. An inner error for a tree over
/// [`TREE_MAX_ENTRIES`].
async fn guest_tree(
    client: &Client,
    top: &str,
) -> Result<Result<(Vec<TreeEntry>, u64, u64), HostError>, ClientError> {
    let (mut entries, mut skipped, mut total) = (Vec::new(), 0u64, 0u64);
    let mut queue = VecDeque::from([String::new()]);
    while let Some(prefix) = queue.pop_front() {
        let dir = if prefix.is_empty() {
            top.to_owned()
        } else {
            format!("{}/{prefix}", top.trim_end_matches('/'))
        };
        for entry in client.list_dir(&dir).await? {
            // The names come from the guest, which the sandbox's code may control:
            // only plain names become host paths.
            let Ok(name) = String::from_utf8(entry.name) else {
                skipped += 1;
                continue;
            };
            if !plain_name(&name) {
                skipped += 1;
                continue;
            }
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let is_dir = match entry.kind {
                FileKind::Dir => true,
                FileKind::File => false,
                FileKind::Symlink | FileKind::Other => {
                    skipped += 1;
                    continue;
                }
            };
            if entries.len() == TREE_MAX_ENTRIES {
                return Ok(Err(HostError::TooManyEntries {
                    path: top.to_owned(),
                    max: TREE_MAX_ENTRIES,
                }));
            }
            if is_dir {
                queue.push_back(rel.clone());
            } else {
                total += entry.size;
            }
            entries.push(TreeEntry { rel, dir: is_dir });
        }
    }
    Ok(Ok((entries, skipped, total)))
}

/// A name that is one path component: not empty, `.` or `..`, no `/` or NUL.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest that lists `../../x` must not make the copy write beside the tree.
    #[test]
    fn only_plain_names_from_the_guest_become_host_paths() {
        assert!(plain_name("report.csv") && plain_name("..hidden") && plain_name("a b"));
        for bad in ["", ".", "..", "../x", "a/b", "nul\0"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }
}
