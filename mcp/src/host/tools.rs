//! The host file tools of the default profile (`copy_from_host`, `copy_to_host`,
//! `list_host_dir`): a router on [`SandboxServer`] offered only when the operator
//! allowed host directories (`--host-dir`); their descriptions then name them. Host
//! paths go through [`super::fs`]; sandbox files through the agent client's streamed
//! `put` and `get`.

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::handler::server::common::Extension;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use sandbox_protocol::FileKind;
use sandbox_vmm::client::ClientError;
use sandbox_vmm::{error_chain, Client};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::time::Instant;

use super::fs::{base_name, into_dir};
use super::{HostDirs, HostError};
use crate::error::{Op, ToolError};
use crate::output::size;
use crate::progress::Progress;
use crate::render::{success, Render};
use crate::tools::{absolute, SandboxServer};
use sandbox_engine::util::millis;

/// The tools of this router, whose descriptions get the allowed directories.
pub(crate) const HOST_TOOLS: [&str; 3] = ["copy_from_host", "copy_to_host", "list_host_dir"];

/// Most entries `list_host_dir` returns.
pub const LIST_HOST_MAX_ENTRIES: usize = 1000;

/// `copy_from_host`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyFromHostParams {
    /// The sandbox to copy into.
    pub sandbox_id: String,
    /// The host file: an absolute path under an allowed host directory.
    pub host_path: String,
    /// Where in the sandbox: an absolute file path (its parent must exist), or an
    /// existing directory to copy into under the host file's name.
    pub path: String,
    /// Copy a host directory and everything under it (links and special files
    /// are left out). Default false.
    #[serde(default)]
    pub recursive: bool,
}

/// `copy_to_host`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyToHostParams {
    /// The sandbox to copy from.
    pub sandbox_id: String,
    /// The sandbox file: an absolute path to a regular file.
    pub path: String,
    /// Where on the host: an absolute file path under an allowed host directory (its
    /// parent must exist), or an existing directory there to copy into under the
    /// sandbox file's name.
    pub host_path: String,
    /// Replace a file that exists there (default false: an existing file is an
    /// error). Not for a tree, whose top must not exist yet.
    #[serde(default)]
    pub overwrite: bool,
    /// Copy a sandbox directory and everything under it (links and special files
    /// are left out). Default false.
    #[serde(default)]
    pub recursive: bool,
}

/// `list_host_dir`
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListHostDirParams {
    /// An absolute host directory under an allowed one; omit it for the allowed
    /// directories themselves.
    #[serde(default)]
    pub host_path: Option<String>,
}

/// `copy_from_host`, `copy_to_host`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CopyResult {
    /// The sandbox.
    pub sandbox_id: String,
    /// The host file.
    pub host_path: String,
    /// The sandbox file.
    pub path: String,
    /// Bytes copied.
    pub bytes: u64,
    /// The copy's permission bits in octal (null for a tree).
    pub mode: Option<String>,
    /// For a tree: regular files copied.
    pub files: Option<u64>,
    /// For a tree: directories made.
    pub dirs: Option<u64>,
    /// For a tree: entries left out (symbolic links, FIFOs, devices, sockets).
    pub skipped: Option<u64>,
    /// How long the copy took, in milliseconds.
    pub ms: u64,
    /// "to_sandbox" or "to_host".
    pub direction: String,
}

impl Render for CopyResult {
    fn render(&self) -> String {
        let (from, to) = if self.direction == "to_host" {
            (
                format!("sandbox {}:{}", self.sandbox_id, self.path),
                format!("host {}", self.host_path),
            )
        } else {
            (
                format!("host {}", self.host_path),
                format!("sandbox {}:{}", self.sandbox_id, self.path),
            )
        };
        match (&self.mode, self.files) {
            (Some(mode), _) => format!(
                "copied {} ({} bytes) from {from} to {to} (mode {mode}) in {} ms",
                size(self.bytes),
                self.bytes,
                self.ms
            ),
            (None, files) => format!(
                "copied a tree from {from} to {to}: {} files ({}), {} directories, {} left \
                 out (links, special files) in {} ms",
                files.unwrap_or(0),
                size(self.bytes),
                self.dirs.unwrap_or(0),
                self.skipped.unwrap_or(0),
                self.ms
            ),
        }
    }
}

/// One entry of `list_host_dir`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HostEntryRow {
    /// Its name (a full path when listing the allowed directories).
    pub name: String,
    /// "file", "dir", "symlink" or "other".
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
}

/// `list_host_dir`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListHostDirResult {
    /// The directory listed; null for the allowed directories.
    pub host_path: Option<String>,
    /// Its entries, sorted by name.
    pub entries: Vec<HostEntryRow>,
    /// Whether there were more entries than returned.
    pub truncated: bool,
}

impl Render for ListHostDirResult {
    fn render(&self) -> String {
        let mut out = match &self.host_path {
            Some(path) => format!("{path}:\n"),
            None => "allowed host directories:\n".to_owned(),
        };
        for entry in &self.entries {
            let _ = match entry.kind.as_str() {
                "dir" => writeln!(out, "{}/", entry.name),
                "file" => writeln!(out, "{} ({})", entry.name, size(entry.size)),
                kind => writeln!(out, "{} ({kind})", entry.name),
            };
        }
        if self.entries.is_empty() {
            out.push_str("(empty)\n");
        }
        if self.truncated {
            let _ = writeln!(out, "(first {LIST_HOST_MAX_ENTRIES} entries only)");
        }
        out
    }
}

#[tool_router(router = host_router, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        title = "Copy a file from the host",
        description = "Copy a regular file from the host into a sandbox, streamed (any \
        size). host_path: absolute, under a host directory the operator allowed (listed \
        below; list_host_dir shows what they hold); links leading out of them are refused. \
        path: the absolute sandbox path, or an existing sandbox directory to copy into under \
        the file's name; the file appears whole when the copy ends, with the host file's \
        permission bits. recursive: true copies a directory and all under it (links and \
        special files left out), into path or, when path is an existing directory, under \
        it.",
        output_schema = schema_for_output::<CopyResult>(),
        annotations(
            title = "Copy a file from the host",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn copy_from_host(
        &self,
        Parameters(params): Parameters<CopyFromHostParams>,
        Extension(progress): Extension<Progress>,
    ) -> Result<CallToolResult, ToolError> {
        let started = Instant::now();
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        absolute(&params.path)?;
        if params.recursive {
            return self.copy_tree_from_host(&sandbox, params, started).await;
        }
        let host_path = params.host_path.clone();
        let source = on_host(&self.host, move |host| host.open_source(&host_path))
            .await
            .map_err(|error| self.host_error(&error, Direction::ToSandbox))?;
        let client = sandbox.client(Op::CopyIn).await?;
        let target = match client.stat(&params.path).await {
            Ok(stat) if stat.kind == FileKind::Dir => {
                into_dir(&params.path, base_name(&source.path).unwrap_or("file"))
            }
            _ => params.path.clone(),
        };
        progress.set_status(format!(
            "copy_from_host: sending {} ({})",
            source.path,
            size(source.size)
        ));
        // The size it had when opened: a host file that keeps growing is not
        // followed forever.
        let reader = tokio::fs::File::from_std(source.file).take(source.size);
        let (bytes, mode) = client
            .put(&target, Some(source.mode), reader)
            .await
            .map_err(|error| match &error {
                ClientError::Local { .. } => ToolError::new(format!(
                    "Reading {} on the host failed: {}. Nothing was written in the sandbox.",
                    source.path,
                    error_chain(&error)
                )),
                _ => ToolError::agent(Op::CopyIn, sandbox.id(), &error),
            })?;
        Ok(success(&CopyResult {
            sandbox_id: sandbox.id().to_owned(),
            host_path: source.path,
            path: target,
            bytes,
            mode: Some(format!("{:o}", mode & 0o7777)),
            files: None,
            dirs: None,
            skipped: None,
            ms: millis(started.elapsed()),
            direction: "to_sandbox".to_owned(),
        }))
    }

    #[tool(
        title = "Copy a file to the host",
        description = "Copy a regular file from a sandbox to the host, streamed. path: the \
        absolute sandbox file. host_path: absolute, under a host directory the operator \
        allowed (listed below), naming the new file (its parent must exist) or an existing \
        directory to copy into under the sandbox file's name. The host file appears whole \
        when the copy ends, with the sandbox file's permission bits (never setuid); an \
        existing file is replaced only with overwrite: true, and only a regular file. Links \
        leading out of the allowed directories are refused, and so is a file over the \
        server's size limit per copy. recursive: true copies a sandbox directory and all \
        under it (links and special files left out) to a new host directory (or under an \
        existing one), within the same size limit in all.",
        output_schema = schema_for_output::<CopyResult>(),
        annotations(
            title = "Copy a file to the host",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn copy_to_host(
        &self,
        Parameters(params): Parameters<CopyToHostParams>,
        Extension(progress): Extension<Progress>,
    ) -> Result<CallToolResult, ToolError> {
        let started = Instant::now();
        let sandbox = self.backend.sandbox(&params.sandbox_id).await?;
        absolute(&params.path)?;
        let Some(name) = base_name(&params.path).map(str::to_owned) else {
            return Err(ToolError::new(format!(
                "path {:?} names no file; pass the absolute path of a sandbox file.",
                params.path
            )));
        };
        let max = self.host.max_bytes();
        let client = sandbox.client(Op::CopyOut).await?;
        let stat = client
            .stat(&params.path)
            .await
            .map_err(|error| ToolError::agent(Op::CopyOut, sandbox.id(), &error))?;
        if stat.kind == FileKind::Dir && params.recursive {
            return self
                .copy_tree_to_host(&sandbox, &client, params, started)
                .await;
        }
        if stat.kind == FileKind::Dir {
            return Err(ToolError::new(format!(
                "{} is a directory in sandbox {}: pass recursive: true to copy the tree, \
                 or pack it first with exec (tar -czf /tmp/dir.tgz -C {} .) and copy the \
                 archive.",
                params.path,
                sandbox.id(),
                params.path
            )));
        }
        if stat.kind == FileKind::File && stat.size > max {
            return Err(self.host_error(
                &HostError::TooLarge {
                    size: stat.size,
                    max,
                },
                Direction::ToHost,
            ));
        }
        progress.set_status(format!("copy_to_host: receiving {}", params.path));
        let (final_path, bytes, mode) = self
            .receive(
                &client,
                sandbox.id(),
                &params.path,
                (&params.host_path, &name, params.overwrite),
                0,
            )
            .await?;
        Ok(success(&CopyResult {
            sandbox_id: sandbox.id().to_owned(),
            host_path: final_path,
            path: params.path,
            bytes,
            mode: Some(format!("{mode:o}")),
            files: None,
            dirs: None,
            skipped: None,
            ms: millis(started.elapsed()),
            direction: "to_host".to_owned(),
        }))
    }

    #[tool(
        title = "List a host directory",
        description = "List one level of a host directory under the directories the \
        operator allowed for copy_from_host and copy_to_host: name, kind (file, dir, \
        symlink, other) and size, sorted by name, at most 1000 entries. Omit host_path for \
        the allowed directories themselves.",
        output_schema = schema_for_output::<ListHostDirResult>(),
        annotations(
            title = "List a host directory",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_host_dir(
        &self,
        Parameters(params): Parameters<ListHostDirParams>,
    ) -> Result<CallToolResult, ToolError> {
        let Some(host_path) = params.host_path else {
            let entries = self
                .host
                .allowed()
                .into_iter()
                .map(|name| HostEntryRow {
                    name,
                    kind: "dir".to_owned(),
                    size: 0,
                })
                .collect();
            return Ok(success(&ListHostDirResult {
                host_path: None,
                entries,
                truncated: false,
            }));
        };
        let path = host_path.clone();
        let (entries, truncated) = on_host(&self.host, move |host| {
            host.list(&path, LIST_HOST_MAX_ENTRIES)
        })
        .await
        .map_err(|error| self.host_error(&error, Direction::List))?;
        Ok(success(&ListHostDirResult {
            host_path: Some(host_path),
            entries: entries
                .into_iter()
                .map(|entry| HostEntryRow {
                    name: entry.name,
                    kind: entry.kind.to_owned(),
                    size: entry.size,
                })
                .collect(),
            truncated,
        }))
    }
}

/// Which tool a host error came from, for its hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    ToSandbox,
    ToHost,
    List,
}

impl SandboxServer {
    /// Streams the sandbox file `source` into a new host file (`host_path`, or
    /// `name` in it when it is a directory; replacing a regular file only with
    /// `overwrite`) and puts it in place. `before` bytes of this copy were written
    /// already: all together stay within `--host-max-bytes`. Returns the host
    /// path, the bytes and the mode it got. A failure leaves nothing of this file.
    pub(super) async fn receive(
        &self,
        client: &Client,
        sandbox_id: &str,
        source: &str,
        (host_path, name, overwrite): (&str, &str, bool),
        before: u64,
    ) -> Result<(String, u64, u32), ToolError> {
        let max = self.host.max_bytes();
        let (host_path, name) = (host_path.to_owned(), name.to_owned());
        let mut dest = on_host(&self.host, move |host| {
            host.create_destination(&host_path, &name, overwrite)
        })
        .await
        .map_err(|error| self.host_error(&error, Direction::ToHost))?;
        let Some(file) = dest.take_file() else {
            return Err(ToolError::new(
                "The host file was already used; copy again.",
            ));
        };
        let mut sink = Capped::new(tokio::fs::File::from_std(file), max.saturating_sub(before));
        // On an error `dest` is dropped on the way out: the partial file is removed.
        let (bytes, mode) = match client.get(source, &mut sink).await {
            Ok(done) => done,
            Err(_) if sink.exceeded => {
                let size = before + sink.written;
                return Err(self.host_error(&HostError::TooLarge { size, max }, Direction::ToHost));
            }
            Err(error @ ClientError::Local { .. }) => {
                return Err(ToolError::new(format!(
                    "Writing {} on the host failed: {}. Nothing was left there.",
                    dest.path,
                    error_chain(&error)
                )))
            }
            Err(error) => return Err(ToolError::agent(Op::CopyOut, sandbox_id, &error)),
        };
        let file = sink.inner.into_std().await;
        let final_path = dest.path.clone();
        let mode = tokio::task::spawn_blocking(move || dest.commit(file, mode))
            .await
            .map_err(|error| ToolError::new(format!("The copy's last step failed: {error}")))?
            .map_err(|error| self.host_error(&error, Direction::ToHost))?;
        Ok((final_path, bytes, mode))
    }

    /// A host error as a tool failure that says what to do next.
    pub(super) fn host_error(&self, error: &HostError, direction: Direction) -> ToolError {
        let allowed = self.host.allowed().join(", ");
        let hint = match (error, direction) {
            (HostError::Relative(_) | HostError::Outside(_), _) => format!(
                "Allowed host directories: {allowed}. Pass an absolute host_path under one of \
                 them (list_host_dir shows what they hold)."
            ),
            (HostError::Escapes(_), _) => format!(
                "Only what lies under the allowed host directories ({allowed}) can be used; \
                 links are followed only while they stay inside. list_host_dir shows what is \
                 there."
            ),
            (HostError::NotFound(_), Direction::ToHost) => {
                "Its parent directory must exist on the host: list_host_dir shows the \
                 directories there; copy into one of them."
                    .to_owned()
            }
            (HostError::NotFound(_), _) => {
                "list_host_dir on its directory shows what is there.".to_owned()
            }
            (HostError::IsDirectory(_), Direction::ToSandbox) => {
                "Pass recursive: true to copy the directory and all under it (list_host_dir \
                 shows what it holds)."
                    .to_owned()
            }
            (HostError::TooManyEntries { .. }, _) => {
                "Copy a smaller tree (list_host_dir shows its parts), or an archive of it."
                    .to_owned()
            }
            (HostError::IsDirectory(_), _) => {
                "Name a file in host_path, or a directory to copy into.".to_owned()
            }
            (HostError::NotRegular { .. }, Direction::ToHost) => {
                "copy_to_host never writes to or replaces anything but a regular file: pick \
                 another host_path."
                    .to_owned()
            }
            (HostError::NotRegular { .. }, _) => "Only regular files can be copied.".to_owned(),
            (HostError::NotDirectory(_), _) => {
                "list_host_dir lists directories; copy a file with copy_from_host.".to_owned()
            }
            (HostError::Exists(_), _) => {
                "Pass overwrite: true to replace it, or another host_path.".to_owned()
            }
            (HostError::TooLarge { .. }, _) => {
                "Split it in the sandbox with exec (split -b 1G FILE FILE.part.) and copy the \
                 parts, or compress it first."
                    .to_owned()
            }
            (HostError::BadName(_), _) => "Name the file in host_path.".to_owned(),
            (HostError::Dir { .. } | HostError::Unsupported | HostError::Io { .. }, _) => {
                String::new()
            }
        };
        let text = capitalize(&error_chain(error));
        if hint.is_empty() {
            ToolError::new(format!("{text}."))
        } else {
            ToolError::new(format!("{text}. {hint}"))
        }
    }
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Runs a blocking host file operation on tokio's blocking pool.
pub(super) async fn on_host<T: Send + 'static>(
    host: &Arc<HostDirs>,
    work: impl FnOnce(&HostDirs) -> Result<T, HostError> + Send + 'static,
) -> Result<T, HostError> {
    let host = host.clone();
    tokio::task::spawn_blocking(move || work(&host))
        .await
        .unwrap_or_else(|join| {
            Err(HostError::Io {
                op: "finish an operation on",
                path: join.to_string(),
                errno: nix::errno::Errno::EIO,
            })
        })
}

/// A writer that refuses to write more than `left` bytes in all (a sandbox's file
/// can grow while it is copied, or be sparse and look small in no way at all).
#[derive(Debug)]
struct Capped<W> {
    inner: W,
    left: u64,
    written: u64,
    exceeded: bool,
}

impl<W> Capped<W> {
    fn new(inner: W, max: u64) -> Self {
        Self {
            inner,
            left: max,
            written: 0,
            exceeded: false,
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            self.exceeded = true;
            self.written += buf.len() as u64;
            return Poll::Ready(Err(std::io::Error::other(
                "the file is over the limit of a copy to the host",
            )));
        }
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &poll {
            this.left -= *n as u64;
            this.written += *n as u64;
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn every_host_tool_has_a_title_annotations_a_schema_and_a_usable_description() {
        crate::tools::assert_tools_described(
            SandboxServer::host_router().list_all(),
            &["copy_from_host", "copy_to_host", "list_host_dir"],
            150,
        );
    }

    #[tokio::test]
    async fn the_capped_writer_stops_at_its_limit() {
        let mut sink = Capped::new(Vec::new(), 10);
        sink.write_all(b"0123456789").await.unwrap();
        assert!(!sink.exceeded);
        assert!(sink.write_all(b"x").await.is_err());
        assert!(sink.exceeded);
        assert_eq!(sink.inner, b"0123456789");
    }
}
