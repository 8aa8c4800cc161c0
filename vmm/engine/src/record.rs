//! The engine's record of a VM on disk: `sandbox.json` in the VM's run folder, next
//! to the launcher's `vm.json`.
//!
//! # One record per VM
//! The run folder is the one record of a VM that every front end reads: `vm.json`
//! (the launcher's) says what runs and how to reach it (pids, QEMU's start time as
//! the guard against pid reuse, agent socket, transport, hibernation), the egress
//! policy file says what it may reach, and `sandbox.json` (this module) adds what
//! only the engine knows: which node holds it and, once claimed, the sandbox's id,
//! token, template, size, deadline (wall clock) and lineage. Nothing is written in
//! both, so they cannot disagree: a wake by the CLI changes `vm.json`, and the
//! engine reads it there (see `crate::snapshot`).
//!
//! # Who reads it
//! - A node daemon at start re-adopts the claimed VMs its earlier life left running
//!   or hibernated (`crate::adopt`), and stops its unclaimed warm ones.
//! - `sandboxctl vm ls` shows which sandbox a VM is and who holds it.
//!
//! # Safety
//! The token inside makes the file secret: it is written mode 0600 (a temporary
//! file made with that mode, then renamed over the old one, so a reader never sees
//! half a record), and a file that is readable by others, belongs to another user or
//! does not parse is refused with a typed error, never trusted and never a panic.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_vmm::launcher::Size;
use serde::{Deserialize, Serialize};

use crate::sandbox::{Lineage, SandboxId};

/// The record's file name in a run folder.
pub const RECORD_FILE: &str = "sandbox.json";

/// The format written; a record of another version is refused.
pub const RECORD_VERSION: u32 = 1;

/// The largest record read: a record is well under 1 KiB, so anything bigger is not
/// one of ours.
const RECORD_MAX_BYTES: u64 = 64 * 1024;

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be opened or read.
    #[error("Cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// Others than its owner may read it (it holds a token), or another user owns it.
    #[error("{} has mode {mode:o} and owner {uid}: a sandbox record must be mode 0600 and this user's", path.display())]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        uid: u32,
    },
    /// It is larger than any record.
    #[error("{} is {bytes} bytes: not a sandbox record", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// It is not a record.
    #[error("{} is not a sandbox record", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: serde_json::Error,
    },
    /// A record of a format this engine does not know.
    #[error("{} is a version {found} record; this engine reads version {RECORD_VERSION}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it says.
        found: u32,
    },
    /// The file could not be written.
    #[error("Cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
}

/// Which kind of process holds a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerKind {
    /// A node daemon: its VMs outlive it, and its next start re-adopts them.
    Node,
    /// An engine inside a front end (`sandbox-mcp` without a daemon): its VMs end
    /// with it.
    Embedded,
}

impl OwnerKind {
    /// The name listings show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Embedded => "embedded",
        }
    }
}

/// The process that holds a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// Its kind.
    pub kind: OwnerKind,
    /// Its pid when it wrote the record (for people: a node's next life has another).
    pub pid: u32,
}

impl Owner {
    /// This process, as `kind`.
    pub fn this(kind: OwnerKind) -> Self {
        Self {
            kind,
            pid: std::process::id(),
        }
    }
}

/// What a sandbox descends from, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LineageRecord {
    /// Its template.
    Template,
    /// A fork of this sandbox.
    Fork {
        /// The parent's id.
        parent: String,
    },
    /// A checkpoint.
    Checkpoint {
        /// Its id.
        id: String,
        /// Its name.
        name: Option<String>,
    },
}

impl LineageRecord {
    /// The record of `lineage`; `None` for the attached agent (never recorded).
    pub fn of(lineage: &Lineage) -> Option<Self> {
        Some(match lineage {
            Lineage::Template => Self::Template,
            Lineage::Fork(parent) => Self::Fork {
                parent: parent.as_str().to_owned(),
            },
            Lineage::Checkpoint { id, name } => Self::Checkpoint {
                id: id.clone(),
                name: name.clone(),
            },
            Lineage::Attached => return None,
        })
    }

    /// The lineage it records.
    pub fn lineage(&self) -> Lineage {
        match self {
            Self::Template => Lineage::Template,
            Self::Fork { parent } => Lineage::Fork(SandboxId::new(parent.clone())),
            Self::Checkpoint { id, name } => Lineage::Checkpoint {
                id: id.clone(),
                name: name.clone(),
            },
        }
    }
}

/// A claimed VM's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRecord {
    /// The sandbox id (`sbx-<VM id>`).
    pub id: String,
    /// The per-sandbox token its claim returned.
    pub token: String,
    /// The template it runs.
    pub template: String,
    /// vCPUs and memory.
    pub size: Size,
    /// When it was claimed, in milliseconds since the Unix epoch.
    pub claimed_at_unix_ms: u64,
    /// When it is destroyed, in milliseconds since the Unix epoch (wall clock: a
    /// node's next life keeps it).
    pub deadline_unix_ms: u64,
    /// Whether the claim came from the warm pool.
    pub warm: bool,
    /// What it descends from.
    pub lineage: LineageRecord,
}

impl ClaimRecord {
    /// Its deadline as a time.
    pub fn deadline(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.deadline_unix_ms)
    }

    /// When it was claimed.
    pub fn claimed_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.claimed_at_unix_ms)
    }
}

/// `sandbox.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// Who holds the VM.
    pub owner: Owner,
    /// Its sandbox once claimed; `None` for a warm VM of the pool.
    pub claim: Option<ClaimRecord>,
}

impl SandboxRecord {
    /// A record of an unclaimed VM held by `owner`.
    pub fn unclaimed(owner: Owner) -> Self {
        Self {
            version: RECORD_VERSION,
            owner,
            claim: None,
        }
    }
}

/// Milliseconds since the Unix epoch of `time` (0 before it).
pub fn unix_ms(time: SystemTime) -> u64 {
    let ms = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Writes `record` as `dir/sandbox.json`, mode 0600, replacing the old one
/// atomically.
pub fn write(dir: &Path, record: &SandboxRecord) -> Result<(), RecordError> {
    let path = dir.join(RECORD_FILE);
    let temp = dir.join(format!(".{RECORD_FILE}.tmp"));
    let failed = |error| RecordError::Write {
        path: path.clone(),
        error,
    };
    let json = serde_json::to_vec_pretty(record).map_err(|e| failed(io::Error::other(e)))?;
    // A leftover of a writer killed midway would make create_new fail.
    let _ = fs::remove_file(&temp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(failed)?;
    file.write_all(&json).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    fs::rename(&temp, &path).map_err(failed)
}

/// Reads `dir/sandbox.json`: `Ok(None)` when there is none (a VM no engine holds,
/// such as one `sandboxctl vm start` made).
pub fn read(dir: &Path) -> Result<Option<SandboxRecord>, RecordError> {
    let path = dir.join(RECORD_FILE);
    let read_failed = |error| RecordError::Read {
        path: path.clone(),
        error,
    };
    // O_NOFOLLOW: a link planted in place of the record is refused, not followed.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_failed(error)),
    };
    let meta = file.metadata().map_err(read_failed)?;
    let mode = meta.mode() & 0o777;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if mode & 0o077 != 0 || meta.uid() != euid || !meta.is_file() {
        return Err(RecordError::Mode {
            path,
            mode,
            uid: meta.uid(),
        });
    }
    if meta.len() > RECORD_MAX_BYTES {
        return Err(RecordError::TooLarge {
            path,
            bytes: meta.len(),
        });
    }
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(file, RECORD_MAX_BYTES), &mut bytes)
        .map_err(read_failed)?;
    // The version first, so a newer format is named as such, not as garbage.
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let versioned: Versioned =
        serde_json::from_slice(&bytes).map_err(|error| RecordError::Parse {
            path: path.clone(),
            error,
        })?;
    if versioned.version != RECORD_VERSION {
        return Err(RecordError::Version {
            path,
            found: versioned.version,
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|error| RecordError::Parse { path, error })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sbx-record-{tag}-{}-{}",
            std::process::id(),
            sandbox_vmm::launcher::VmId::generate()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn claimed() -> SandboxRecord {
        SandboxRecord {
            version: RECORD_VERSION,
            owner: Owner::this(OwnerKind::Node),
            claim: Some(ClaimRecord {
                id: "sbx-0123456789ab".into(),
                token: "ab".repeat(32),
                template: "python".into(),
                size: Size::SMALL,
                claimed_at_unix_ms: 1_700_000_000_000,
                deadline_unix_ms: 1_700_003_600_000,
                warm: true,
                lineage: LineageRecord::Checkpoint {
                    id: "c1".into(),
                    name: Some("base".into()),
                },
            }),
        }
    }

    #[test]
    fn a_record_round_trips_with_mode_0600_and_no_temporary_left() {
        let dir = scratch("round");
        for record in [
            claimed(),
            SandboxRecord::unclaimed(Owner::this(OwnerKind::Embedded)),
        ] {
            write(&dir, &record).unwrap();
            assert_eq!(read(&dir).unwrap(), Some(record));
            let mode = fs::metadata(dir.join(RECORD_FILE)).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(RECORD_FILE)]);
        let lineage = LineageRecord::of(&Lineage::Fork(SandboxId::new("sbx-p"))).unwrap();
        assert_eq!(lineage.lineage(), Lineage::Fork(SandboxId::new("sbx-p")));
        assert_eq!(LineageRecord::of(&Lineage::Attached), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_record_is_none_and_a_stale_temporary_is_replaced() {
        let dir = scratch("missing");
        assert_eq!(read(&dir).unwrap(), None);
        fs::write(dir.join(format!(".{RECORD_FILE}.tmp")), b"half a reco").unwrap();
        write(&dir, &claimed()).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(claimed()));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_record_is_a_typed_error() {
        let dir = scratch("corrupt");
        let path = dir.join(RECORD_FILE);
        let put = |bytes: &[u8]| {
            fs::write(&path, bytes).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        };
        for bad in [
            &b"{\"version\": 1, \"owner\": "[..],
            b"\x00\xff not json",
            b"[]",
            br#"{"version":1,"owner":{"kind":"node","pid":1},"claim":null,"extra":1}"#,
            br#"{"version":1,"owner":{"kind":"martian","pid":1},"claim":null}"#,
        ] {
            put(bad);
            let error = read(&dir).unwrap_err();
            assert!(matches!(error, RecordError::Parse { .. }), "{error:?}");
        }
        put(br#"{"version":2,"whatever":true}"#);
        assert!(matches!(
            read(&dir).unwrap_err(),
            RecordError::Version { found: 2, .. }
        ));
        put(&vec![b' '; usize::try_from(RECORD_MAX_BYTES + 1).unwrap()]);
        assert!(matches!(
            read(&dir).unwrap_err(),
            RecordError::TooLarge { .. }
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_others_can_read_or_a_link_is_refused() {
        let dir = scratch("mode");
        write(&dir, &claimed()).unwrap();
        let path = dir.join(RECORD_FILE);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let error = read(&dir).unwrap_err();
        assert!(
            matches!(error, RecordError::Mode { mode: 0o644, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("0600"), "{error}");
        // A link planted in its place (to a secret elsewhere, say) is not followed.
        let elsewhere = dir.join("elsewhere");
        fs::rename(&path, &elsewhere).unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(matches!(read(&dir).unwrap_err(), RecordError::Read { .. }));
        fs::remove_dir_all(&dir).unwrap();
    }
}
