//! The egress log: one JSON line per connection, written by the VM's relay into its
//! run folder and read by front ends (`sandboxctl vm egress-log`, MCP).
//!
//! A refusal is written when it happens; an allowed connection when it ends, with
//! the bytes each way. The guest decides how many connections it tries, so each file
//! is bounded: past [`LOG_ROTATE_BYTES`] it becomes `FILE.1` (replacing the previous
//! one) and a new file starts.
//!
//! Allowed connections (every destination the guest reached) and the rest (denied,
//! failed, refused by the proxy) go to two files, `egress.log` and
//! `egress.log.refused`, each rotated on its own: a guest that floods refusals (11 MB
//! of `ProxyRefused` notes in 7 s did) rotates only its refusals away, never the
//! record of where it connected. [`read_log`] merges both.

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
        let path = match record.verdict {
            Verdict::Allowed => self.path.clone(),
            Verdict::Denied | Verdict::Failed | Verdict::Refused => refusals(&self.path),
        };
        if std::fs::metadata(&path).is_ok_and(|m| m.len() >= LOG_ROTATE_BYTES) {
            std::fs::rename(&path, rotated(&path))?;
        }
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        // One write per line: concurrent connections never interleave within a line.
        file.write_all(&line)
    }
}

fn rotated(path: &Path) -> PathBuf {
    suffixed(path, ".1")
}

/// Where everything but allowed connections goes.
fn refusals(path: &Path) -> PathBuf {
    suffixed(path, ".refused")
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The last `limit` records of the log at `path` and its refusals (each rotated file
/// first), oldest first by time. A missing log is empty; a line that does not parse is
/// skipped (a record half written when the relay was killed).
pub fn read_log(path: &Path, limit: usize) -> std::io::Result<Vec<EgressRecord>> {
    let mut records = Vec::new();
    let refused = refusals(path);
    for file in [rotated(&refused), refused, rotated(path), path.to_owned()] {
        match std::fs::read_to_string(&file) {
            Ok(text) => records.extend(text.lines().filter_map(|l| serde_json::from_str(l).ok())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    // Stable: records of one time keep their order within a file.
    records.sort_by_key(|record: &EgressRecord| record.time_unix_ms);
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
            verdict: Verdict::Allowed,
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

    /// Regression (issue 22, item 6): 11 MB of proxy refusals rotated `egress.log`
    /// and `.1` away, and every allowed record with them. Refusals rotate apart now.
    #[test]
    fn a_flood_of_refusals_never_pushes_allowed_records_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.log");
        let log = EgressLog::new(path.clone());
        log.write(&record(443));
        let refusal = EgressRecord {
            time_unix_ms: 2,
            host: String::new(),
            port: 0,
            verdict: Verdict::Refused,
            reason: Some("x".repeat(1024)),
            ..record(0)
        };
        let flood = 3 * LOG_ROTATE_BYTES / 1024;
        for _ in 0..flood {
            log.write(&refusal);
        }
        let all = read_log(&path, usize::MAX).unwrap();
        assert_eq!(
            all.first(),
            Some(&record(443)),
            "the allowed record was lost"
        );
        assert!(all.len() > 1 && all.len() < 1 + usize::try_from(flood).unwrap());
        assert_eq!(read_log(&path, 1).unwrap(), [refusal]);
    }
}
