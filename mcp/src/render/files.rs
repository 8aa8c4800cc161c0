//! Results of the file tools: `read_file`, `write_file`, `list_dir`.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Serialize;

use super::Render;
use crate::output::{size, text_field};

/// `write_file`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WriteFileResult {
    /// The file.
    pub path: String,
    /// Its size once complete; while parts are still expected, the bytes received
    /// so far.
    pub bytes: u64,
    /// Whether the file is written (false while more parts are expected).
    pub complete: bool,
    /// While more parts are expected: the offset the next part starts at.
    pub next_offset: Option<u64>,
    /// Its permission bits in octal, once complete.
    pub mode: Option<String>,
}

impl Render for WriteFileResult {
    fn render(&self) -> String {
        match self.next_offset {
            Some(next) => format!(
                "received {} bytes of {} so far; send the next part with offset {next} \
                 (more: true, or false for the last part); the file is written when the \
                 last part arrives",
                self.bytes, self.path
            ),
            None => format!(
                "wrote {} bytes to {} (mode {})",
                self.bytes,
                self.path,
                self.mode.as_deref().unwrap_or("unchanged")
            ),
        }
    }
}

/// `read_file`
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct ReadFileResult {
    /// The file.
    pub path: String,
    /// The bytes read, as `encoding` says: text (invalid UTF-8 replaced with U+FFFD)
    /// or base64; for an image, its bytes in base64 (the result's image content too).
    pub content: String,
    /// "utf-8", "base64", or "image" (base64, also returned as image content).
    pub encoding: String,
    /// Offset of the first byte read.
    pub offset: u64,
    /// Bytes read.
    pub bytes: u64,
    /// The file's size.
    pub size: u64,
    /// Set when the file goes on past what was read: the offset to read next.
    pub next_offset: Option<u64>,
    /// Whether invalid UTF-8 was replaced (read it with encoding "base64" for its
    /// exact bytes).
    pub lossy: bool,
    /// Whether the bytes were not text (not UTF-8, or NUL bytes), so content is
    /// their base64 although no encoding was asked for.
    pub binary: bool,
    /// The image type ("image/png", "image/jpeg", "image/gif", "image/webp") when
    /// the file starts like one.
    pub mime_type: Option<String>,
}

impl Render for ReadFileResult {
    fn render(&self) -> String {
        let whole = self.offset == 0 && self.next_offset.is_none();
        let mut head = String::new();
        if !whole {
            let _ = write!(
                head,
                "{}: bytes {}..{} of {}",
                self.path,
                self.offset,
                self.offset + self.bytes,
                self.size
            );
            if let Some(next) = self.next_offset {
                let _ = write!(head, "; next_offset: {next}");
            }
        }
        if self.encoding == "image" {
            return format!(
                "{}: {} image, {}",
                self.path,
                self.mime_type.as_deref().unwrap_or("an"),
                size(self.size)
            );
        }
        if self.encoding == "base64" {
            if head.is_empty() {
                let _ = write!(head, "{}: {} bytes", self.path, self.bytes);
            }
            if self.binary {
                head.push_str(
                    " of binary content (not UTF-8 text), so in base64; pass encoding \
                     \"utf-8\" to read it as text with U+FFFD for what is not",
                );
            } else {
                head.push_str(" (base64)");
            }
            let _ = write!(head, "\n{}", text_field("content", &self.content, true));
            return head;
        }
        if self.lossy {
            if head.is_empty() {
                let _ = write!(head, "{} ({} bytes)", self.path, self.bytes);
            }
            head.push_str(
                "; not valid UTF-8 (replaced with U+FFFD): read it with encoding \"base64\" \
                 for its exact bytes",
            );
        }
        let content = text_field("content", &self.content, true);
        if head.is_empty() {
            content
        } else {
            format!("{head}\n{content}")
        }
    }
}

/// One directory entry.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DirEntryRow {
    /// The name (invalid UTF-8 replaced).
    pub name: String,
    /// file, dir, symlink or other.
    pub kind: String,
    /// Size in bytes (of the link itself for symlinks).
    pub size: u64,
}

/// `list_dir`
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListDirResult {
    /// The directory.
    pub path: String,
    /// Its entries, sorted by name (one level, symlinks not followed).
    pub entries: Vec<DirEntryRow>,
}

impl Render for ListDirResult {
    fn render(&self) -> String {
        if self.entries.is_empty() {
            return format!("{} is empty", self.path);
        }
        let mut out = String::new();
        for entry in &self.entries {
            let name = match entry.kind.as_str() {
                "dir" => format!("{}/", entry.name),
                _ => entry.name.clone(),
            };
            let _ = writeln!(out, "{}\t{}\t{}", entry.kind, entry.size, name);
        }
        out.pop();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_text_file_renders_as_itself() {
        let read = ReadFileResult {
            path: "/a".into(),
            content: "hi\n".into(),
            encoding: "utf-8".into(),
            bytes: 3,
            size: 3,
            ..ReadFileResult::default()
        };
        assert_eq!(read.render(), "hi\n");
        let part = ReadFileResult {
            offset: 1,
            next_offset: Some(2),
            content: "i".into(),
            bytes: 1,
            ..read
        };
        assert_eq!(part.render(), "/a: bytes 1..2 of 3; next_offset: 2\ni");
    }

    #[test]
    fn binary_content_read_by_default_says_why_it_is_base64() {
        let read = ReadFileResult {
            path: "/bin.dat".into(),
            content: "AAEC".into(),
            encoding: "base64".into(),
            bytes: 3,
            size: 3,
            binary: true,
            ..ReadFileResult::default()
        };
        let text = read.render();
        assert!(
            text.starts_with("/bin.dat: 3 bytes of binary content"),
            "{text}"
        );
        assert!(text.ends_with("\nAAEC"), "{text}");
    }

    #[test]
    fn a_part_of_an_upload_says_where_the_next_one_starts() {
        let part = WriteFileResult {
            path: "/big".into(),
            bytes: 4096,
            complete: false,
            next_offset: Some(4096),
            mode: None,
        };
        assert!(part.render().contains("offset 4096"), "{}", part.render());
    }
}
