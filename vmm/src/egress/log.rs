//! The egress log: one JSON line per connection, written by the VM's relay into its
//! run folder and read by front ends (`sandboxctl vm egress-log`, MCP).
//!
//! A refusal is written when it happens; an allowed connection when it ends, with
//! the bytes each way. The guest decides how many connections it tries, so the file
//! is bounded: past [`LOG_ROTATE_BYTES`] it becomes `egress.log.1` (replacing the
//! previous one) and a new file starts.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Size at which the log rotates; with one old file kept, the most it takes on disk
/// is twice this.
pub const LOG_ROTATE_BYTES: u64 = 4 * 1024 * 1024;

/// How a connection attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Allowed and connected (the record is written when it closes).
    Allowed,
    /// The allowlist refused the name, the port or every address it resolved to.
    Denied,
    /// Allowed, but it could not be resolved or connected.
    Failed,
    /// The in-guest proxy refused the request itself (not HTTP, not a proxy request).
    Refused,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    /// When the attempt started (ms since the Unix epoch).
    pub time_unix_ms: u64,
    /// The destination as the program named it (empty for `refused`).
    pub host: String,
    /// Its port (0 for `refused`).
    pub port: u16,
    /// The address dialled, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// What happened.
    pub verdict: Verdict,
    /// Why, for anything but `allowed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the guest to the destination.
    pub bytes_out: u64,
    /// Bytes from the destination to the guest.
    pub bytes_in: u64,
    /// How long the connection lasted (or the attempt took).
    pub duration_ms: u64,
}

/// The writer (in the relay).
#[derive(Debug)]
pub struct EgressLog {
    path: PathBuf,
}

impl EgressLog {
    /// Appends to `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Appends `record`; a failure is logged (the connection goes on either way).
    pub fn write(&self, record: &EgressRecord) {
        if let Err(error) = self.append(record) {
            tracing::warn!(path = %self.path.display(), %error, "cannot write the egress log");
        }
    }

    fn append(&self, record: &EgressRecord) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= LOG_ROTATE_BYTES) {
            std::fs::rename(&self.path, rotated(&self.path))?;
        }
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)?;
        // One write per line: concurrent connections never interleave within a line.
        file.write_all(&line)
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The last `limit` records of the log at `path` (the rotated file first), oldest
/// first. A missing log is empty; a line that does not parse is skipped (a record
/// half written when the relay was killed).
pub fn read_log(path: &Path, limit: usize) -> std::io::Result<Vec<EgressRecord>> {
    let mut records = Vec::new();
    for file in [rotated(path), path.to_owned()] {
        match std::fs::read_to_string(&file) {
            Ok(text) => records.extend(text.lines().filter_map(|l| serde_json::from_str(l).ok())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    let skip = records.len().saturating_sub(limit);
    Ok(records.split_off(skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(port: u16) -> EgressRecord {
        EgressRecord {
            time_unix_ms: 1,
            host: "a.io".into(),
            port,
            address: None,
            verdict: Verdict::Denied,
            reason: Some("not in the allowlist".into()),
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn records_are_appended_read_back_and_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.log");
        assert!(read_log(&path, 10).unwrap().is_empty());
        let log = EgressLog::new(path.clone());
        log.write(&record(1));
        log.write(&record(2));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"half")
            .unwrap();
        let got = read_log(&path, 10).unwrap();
        assert_eq!(got, [record(1), record(2)]);
        assert_eq!(read_log(&path, 1).unwrap(), [record(2)]);
        // Past the size, the file rotates (to `.1`, read first: here it holds no
        // record, only the padding) and a new one starts.
        std::fs::write(
            &path,
            vec![b'\n'; usize::try_from(LOG_ROTATE_BYTES).unwrap()],
        )
        .unwrap();
        log.write(&record(3));
        assert!(std::fs::metadata(&path).unwrap().len() < 1000);
        assert_eq!(read_log(&path, 10).unwrap(), [record(3)]);
    }
}
