//! The ids that MCP sessions held when they ended, so that a later session handed
//! one (a model that kept an id from an earlier conversation) says what became of
//! it, not "Unknown sandbox_id".
//!
//! One file, `mcp/ended-sessions` under the sandbox home, one id per line, appended
//! with `O_APPEND` (a line is one `write`, so sessions ending at once do not
//! interleave). Past [`MAX_FILE_BYTES`] it is renamed to `ended-sessions.old` (the
//! previous generation is dropped) and started afresh, so the record is bounded and
//! still remembers the most recent sessions. Failures only cost the better message:
//! they are logged, never a tool's error.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Size past which the record starts a new generation.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Longest id recorded or looked up (the data plane's bound on ids).
const MAX_ID_BYTES: usize = sandbox_vmm::client::connect::MAX_SANDBOX_ID_BYTES;

/// The record; `None` inside when there is no sandbox home to keep it in.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    file: Option<PathBuf>,
}

impl Ended {
    /// The record under `home` (the sandbox home), or none.
    pub fn new(home: Option<&Path>) -> Self {
        Self {
            file: home.map(|home| home.join("mcp").join("ended-sessions")),
        }
    }

    /// Records `ids` as held by a session that has ended.
    pub fn record(&self, ids: &[String]) {
        let Some(file) = &self.file else { return };
        let ids: Vec<&String> = ids.iter().filter(|id| is_id(id)).collect();
        if ids.is_empty() {
            return;
        }
        if let Err(error) = append(file, &ids) {
            tracing::warn!(file = %file.display(), %error, "cannot record the ended session's sandboxes");
        }
    }

    /// Whether `id` was held by a session that has ended.
    pub fn contains(&self, id: &str) -> bool {
        let Some(file) = &self.file else { return false };
        if !is_id(id) {
            return false;
        }
        [file.clone(), old(file)].iter().any(|path| {
            std::fs::read_to_string(path).is_ok_and(|text| text.lines().any(|line| line == id))
        })
    }
}

/// Ids are `[A-Za-z0-9._-]`, as the data plane's: nothing else can break a line.
fn is_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn old(file: &Path) -> PathBuf {
    file.with_extension("old")
}

fn append(file: &Path, ids: &[&String]) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::metadata(file).is_ok_and(|meta| meta.len() > MAX_FILE_BYTES) {
        std::fs::rename(file, old(file))?;
    }
    let mut text = String::new();
    for id in ids {
        text.push_str(id);
        text.push('\n');
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    out.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-ended-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn recorded_ids_are_found_and_others_are_not() {
        let dir = scratch("found");
        let ended = Ended::new(Some(&dir));
        assert!(!ended.contains("sbx-1"), "nothing recorded yet");
        ended.record(&["sbx-1".into(), "sbx-2".into(), "bad\nline".into()]);
        assert!(ended.contains("sbx-1") && ended.contains("sbx-2"));
        assert!(!ended.contains("sbx-3"));
        assert!(
            !ended.contains("bad"),
            "an id with a newline is never written"
        );
        assert!(!ended.contains(""));
        assert!(!Ended::new(None).contains("sbx-1"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_record_starts_a_new_generation_and_keeps_the_last() {
        let dir = scratch("rotate");
        let ended = Ended::new(Some(&dir));
        let many = |prefix: &str| -> Vec<String> {
            (0..30_000).map(|n| format!("{prefix}-{n:08}")).collect()
        };
        ended.record(&many("a"));
        ended.record(&["x1".into()]);
        assert!(ended.contains("a-00000001"), "the old generation is read");
        assert!(ended.contains("x1"));
        ended.record(&many("b"));
        ended.record(&["x2".into()]);
        assert!(
            !ended.contains("a-00000001"),
            "two generations are kept, not three"
        );
        assert!(ended.contains("x1") && ended.contains("b-00000001") && ended.contains("x2"));
        let file = dir.join("mcp/ended-sessions");
        assert!(std::fs::metadata(&file).unwrap().len() <= MAX_FILE_BYTES);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
