//! The file tools' work: `read_file` in parts of any file, as text, base64 or an
//! image; `write_file` of any bytes, whole or in parts ([`crate::upload`]).
//!
//! # Reading
//! A read first `stat`s the path (following symlinks here, as the read does), so a
//! directory or a device is refused with the right next step, and the size is known:
//! a negative offset counts from the end, and the result says whether the file goes
//! on (`next_offset`). A whole file of at most 1 MiB comes in one `read_file`
//! request; any other range comes through the streamed `get`
//! ([`sandbox_vmm::Client::get_range`]), which is cancelled once the range is in.
//! Text reads end on a character boundary, so paging never splits a character.
//!
//! # Writing
//! Content arrives as text or base64 and goes through the streamed `put`, so its
//! size is bounded by the 16 MiB message only, and by nothing once sent in parts.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use rmcp::model::CallToolResult;
use sandbox_protocol::limits::READ_FILE_CAP_BYTES;
use sandbox_protocol::{FileKind, FileStat};
use sandbox_vmm::Client;

use crate::error::{Op, ToolError};
use crate::output::{size, whole_chars};
use crate::params::{parse_mode, Encoding, ReadFileParams, WriteFileParams};
use crate::render::{success, success_with_image, ReadFileResult, WriteFileResult};
use crate::upload::{FilePart, Outcome, Uploads};

/// What `read_file` returns without `max_bytes`: a source file of a thousand lines.
pub const READ_DEFAULT_MAX_BYTES: u64 = 64 * 1024;

/// The most one `read_file` returns; base64 makes it 5.3 MiB in the reply.
pub const READ_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// The largest image returned as image content: its base64 stays under the 5 MB
/// that model APIs take per image.
pub const IMAGE_MAX_BYTES: u64 = 3 * 1024 * 1024;

/// Symlinks followed when resolving a path to read, as the kernel's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;

/// Reads what `params` asks of a file in `sandbox_id`.
pub async fn read(
    client: &Client,
    sandbox_id: &str,
    params: ReadFileParams,
) -> Result<CallToolResult, ToolError> {
    let path = params.path.as_str();
    let max = match params.max_bytes {
        None => READ_DEFAULT_MAX_BYTES,
        Some(0) => {
            return Err(ToolError::new(
                "max_bytes must be at least 1; omit it for 64 KiB.",
            ))
        }
        Some(max) if max > READ_MAX_BYTES => {
            return Err(ToolError::new(format!(
                "max_bytes may be at most {READ_MAX_BYTES} ({}); got {max}. Read a larger file \
                 in parts: pass the returned next_offset as offset.",
                size(READ_MAX_BYTES)
            )))
        }
        Some(max) => max,
    };
    let stat = resolve(client, sandbox_id, path).await?;
    let file_size = stat.size;
    let start = match params.offset {
        None => 0,
        Some(offset) if offset < 0 => file_size.saturating_sub(offset.unsigned_abs()),
        Some(offset) => offset.unsigned_abs(),
    };
    if start > file_size {
        return Err(ToolError::new(format!(
            "offset {start} is past the end of {path}, which has {file_size} bytes. Pass an \
             offset below that, or a negative one to read from the end (-4096 reads the \
             last 4 KiB)."
        )));
    }
    let defaults = params.offset.is_none() && params.max_bytes.is_none();
    let auto_image = defaults && params.encoding.is_none() && params.as_image.is_none();
    let want = max.min(file_size - start);
    let mut data = fetch(client, sandbox_id, path, start, want, file_size).await?;
    let mime_type = if start == 0 { image_type(&data) } else { None };
    let as_image = match (params.as_image, mime_type) {
        (Some(true), None) => {
            return Err(ToolError::new(format!(
                "{path} is not a PNG, JPEG, GIF or WebP image (by its first bytes); read it \
                 without as_image."
            )))
        }
        (Some(true), Some(_)) => true,
        (None, Some(_)) => auto_image,
        (_, _) => false,
    };
    if as_image {
        if file_size > IMAGE_MAX_BYTES {
            return Err(ToolError::new(format!(
                "{path} is a {} image of {}, over the {} an image result carries. Make a \
                 smaller copy in the sandbox (exec, e.g. with ImageMagick or Python's PIL) \
                 and read that, or read its bytes with as_image: false and encoding: \
                 \"base64\" in parts.",
                mime_type.unwrap_or("an"),
                size(file_size),
                size(IMAGE_MAX_BYTES)
            )));
        }
        if (data.len() as u64) < file_size {
            data = fetch(client, sandbox_id, path, 0, file_size, file_size).await?;
        }
        let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
        // The image's bytes are in the structured part too: a client that hands the
        // model only structuredContent (Claude Code) would get nothing otherwise.
        let result = ReadFileResult {
            path: params.path,
            content: encoded.clone(),
            encoding: "image".to_owned(),
            offset: 0,
            bytes: data.len() as u64,
            size: file_size,
            next_offset: None,
            lossy: false,
            binary: false,
            mime_type: mime_type.map(str::to_owned),
        };
        return Ok(success_with_image(
            &result,
            encoded,
            mime_type.unwrap_or("image/png"),
        ));
    }
    let more = start + (data.len() as u64) < file_size;
    // Bytes that are not text come as base64 unless text was asked for: as text they
    // would arrive as U+FFFD, three bytes each, and be lost.
    let binary = params.encoding.is_none() && is_binary(&data, more);
    let encoding = match params.encoding {
        Some(encoding) => encoding,
        None if binary => Encoding::Base64,
        None => Encoding::Utf8,
    };
    let (content, lossy) = match encoding {
        Encoding::Base64 => (
            base64::engine::general_purpose::STANDARD.encode(&data),
            false,
        ),
        Encoding::Utf8 => {
            // A part that ends inside a character ends before it instead; the next
            // part starts with it.
            if more {
                let end = whole_chars(&data);
                if end > 0 {
                    data.truncate(end);
                }
            }
            let text = String::from_utf8_lossy(&data);
            let lossy = matches!(text, std::borrow::Cow::Owned(_));
            (text.into_owned(), lossy)
        }
    };
    let end = start + data.len() as u64;
    Ok(success(&ReadFileResult {
        path: params.path,
        content,
        encoding: match encoding {
            Encoding::Utf8 => "utf-8",
            Encoding::Base64 => "base64",
        }
        .to_owned(),
        offset: start,
        bytes: data.len() as u64,
        size: file_size,
        next_offset: (end < file_size).then_some(end),
        lossy,
        binary,
        mime_type: mime_type.map(str::to_owned),
    }))
}

/// Whether `data` is not text: it holds a NUL byte or is not UTF-8 (a character cut
/// off at its end is fine when the file goes on, `more`).
fn is_binary(data: &[u8], more: bool) -> bool {
    let text = if more {
        &data[..whole_chars(data)]
    } else {
        data
    };
    text.contains(&0) || std::str::from_utf8(text).is_err()
}

/// `len` bytes of `path` from `start`: one request for a small whole file, else the
/// streamed `get`.
async fn fetch(
    client: &Client,
    sandbox_id: &str,
    path: &str,
    start: u64,
    len: u64,
    file_size: u64,
) -> Result<Vec<u8>, ToolError> {
    let failed = |error| ToolError::agent(Op::Read, sandbox_id, &error);
    if start == 0 && len == file_size && file_size <= READ_FILE_CAP_BYTES {
        return client.read_file(path).await.map_err(failed);
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    client.get_range(path, start, len).await.map_err(failed)
}

/// What `path` names once symlinks are followed: a regular file, or an error that
/// says what to use instead.
async fn resolve(client: &Client, sandbox_id: &str, path: &str) -> Result<FileStat, ToolError> {
    let mut current = PathBuf::from(path);
    for _ in 0..MAX_SYMLINKS {
        let stat = client
            .stat(&current)
            .await
            .map_err(|error| ToolError::agent(Op::Read, sandbox_id, &error))?;
        match stat.kind {
            FileKind::File => return Ok(stat),
            FileKind::Dir => {
                return Err(ToolError::new(format!(
                    "{path} is a directory: list it with list_dir, and read_file one of the \
                     files in it."
                )))
            }
            FileKind::Other => {
                return Err(ToolError::new(format!(
                    "{path} is a device, FIFO or socket, which read_file does not read: \
                     read from it with exec (e.g. head -c 4096 {path})."
                )))
            }
            FileKind::Symlink => {
                let target = stat.symlink_target.unwrap_or_default();
                let target = Path::new(std::ffi::OsStr::from_bytes(&target));
                let parent = current.parent().unwrap_or(Path::new("/"));
                current = normalize(&parent.join(target));
            }
        }
    }
    Err(ToolError::new(format!(
        "{path} goes through more than {MAX_SYMLINKS} symlinks (a loop?): check it with \
         list_dir."
    )))
}

/// `path` with `.` and `..` resolved lexically (a symlink's target joined to its
/// directory).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The image type `data` starts like.
pub fn image_type(data: &[u8]) -> Option<&'static str> {
    match data {
        [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n', ..] => Some("image/png"),
        [0xff, 0xd8, 0xff, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', b'7' | b'9', b'a', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

/// Writes what `params` carries: the whole file, or a part of one.
pub async fn write(
    uploads: &Uploads,
    client: &Client,
    sandbox_id: &str,
    params: WriteFileParams,
) -> Result<WriteFileResult, ToolError> {
    let mode = match params.mode.as_deref() {
        None => None,
        Some(text) => Some(parse_mode(text).ok_or_else(|| {
            ToolError::new(format!(
                "mode {text:?} is not octal permission bits; pass something like \"644\" \
                 or \"755\", or omit it."
            ))
        })?),
    };
    let data = match params.encoding {
        Encoding::Utf8 => params.content.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(params.content.trim())
            .map_err(|error| {
                ToolError::new(format!(
                    "content is not valid base64 ({error}); send standard base64 with \
                     padding (RFC 4648), or text with encoding \"utf-8\"."
                ))
            })?,
    };
    let path = params.path;
    if params.offset == 0 && !params.more {
        let (bytes, mode) = client
            .put(&path, mode, data.as_slice())
            .await
            .map_err(|error| ToolError::agent(Op::Write, sandbox_id, &error))?;
        return Ok(done(path, bytes, mode));
    }
    if params.offset == 0 {
        // A part is not written until the last one: a path that cannot be written is
        // refused now, not after every part was sent.
        check_writable(client, sandbox_id, &path).await?;
    }
    let part = FilePart {
        sandbox: sandbox_id,
        path: &path,
        mode,
        offset: params.offset,
        data,
        more: params.more,
    };
    let outcome = uploads
        .part(client, part)
        .await
        .map_err(|error| ToolError::upload(sandbox_id, &error))?;
    Ok(match outcome {
        Outcome::Open { received } => WriteFileResult {
            path,
            bytes: received,
            complete: false,
            next_offset: Some(received),
            mode: None,
        },
        Outcome::Done { bytes, mode } => done(path, bytes, mode),
    })
}

fn done(path: String, bytes: u64, mode: u32) -> WriteFileResult {
    WriteFileResult {
        path,
        bytes,
        complete: true,
        next_offset: None,
        mode: Some(format!("{mode:o}")),
    }
}

/// Refuses a path whose parent is not a directory or that is a directory itself.
async fn check_writable(client: &Client, sandbox_id: &str, path: &str) -> Result<(), ToolError> {
    let parent = Path::new(path).parent().unwrap_or(Path::new("/"));
    match client.stat(parent).await {
        Ok(stat) if stat.kind == FileKind::Dir || stat.kind == FileKind::Symlink => {}
        Ok(_) => {
            return Err(ToolError::new(format!(
                "{} is not a directory, so {path} cannot be written. Check the path with \
                 list_dir.",
                parent.display()
            )))
        }
        Err(error) => return Err(ToolError::agent(Op::Write, sandbox_id, &error)),
    }
    match client.stat(path).await {
        Ok(stat) if stat.kind == FileKind::Dir => Err(ToolError::new(format!(
            "{path} is a directory: write_file writes a file, so name one inside it (like \
             {}/NAME).",
            path.trim_end_matches('/')
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_known_by_their_first_bytes() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\n\0\0"), Some("image/png"));
        assert_eq!(image_type(b"\xff\xd8\xff\xe0"), Some("image/jpeg"));
        assert_eq!(image_type(b"GIF89a.."), Some("image/gif"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(image_type(b"hello"), None);
        assert_eq!(image_type(b""), None);
    }

    #[test]
    fn binary_content_is_told_from_text() {
        assert!(!is_binary(b"plain text\n", false));
        assert!(!is_binary("caf\u{e9}".as_bytes(), false));
        assert!(is_binary(b"a\0b", false), "a NUL byte");
        assert!(is_binary(b"\xff\xfe\x00\x01", false), "not UTF-8");
        // A read that ends inside a character is text when the file goes on.
        let cut = &"caf\u{e9}".as_bytes()[..4];
        assert!(!is_binary(cut, true));
        assert!(is_binary(cut, false));
    }

    #[test]
    fn symlink_targets_resolve_lexically() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
        assert_eq!(normalize(Path::new("/../x")), Path::new("/x"));
    }
}
