//! The per-VM run folder and its bookkeeping.
//!
//! Each VM owns `RUN_ROOT/<id>/` holding everything it makes: the vhost-user socket,
//! the hybrid vsock socket and its `_PORT` listeners, the console, QEMU and daemon
//! logs, the disk overlay, a `lock` file, `vm.json` (a [`VmRecord`]: pids, agent
//! address, creation time) and `token` (the agent's token, readable by the owner
//! only). The folder is mode 0700 and is removed when the VM stops.
//!
//! Liveness without a daemon of our own:
//! - The owning process holds an exclusive `flock` on `lock` for as long as it owns the
//!   VM, so another process can tell "someone is still booting or running this" from
//!   "its owner died" with one non-blocking `flock`.
//! - A detached VM has no owner; it is alive while its QEMU is. Pids are checked
//!   against `/proc/<pid>/cmdline` (QEMU's `-name` carries the VM id, the daemon's
//!   arguments carry the run folder), so a recycled pid is never taken for our QEMU.
//! - [`sweep`] removes folders whose owner is gone and whose QEMU is dead (the leftovers
//!   of a caller killed by `SIGKILL`, whose children died by their death signal).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::accel::Accel;
use super::size::Size;
use super::sys::{self, PidFd};
use super::{READY_PORT, VM_ID_HEX_CHARS};

/// The record file in every run folder.
pub const RECORD_FILE: &str = "vm.json";
/// The agent's token, apart from `vm.json` so that listing VMs never shows it.
pub const TOKEN_FILE: &str = "token";
pub(crate) const LOCK_FILE: &str = "lock";
/// `sun_path` holds 108 bytes including the terminating NUL.
const UNIX_SOCKET_PATH_MAX_BYTES: usize = 107;
/// A folder without a record and without an owner younger than this is still being
/// created by someone.
const UNRECORDED_GRACE: Duration = Duration::from_secs(60);

/// Why a run folder could not be made, read or removed.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// The folder (or its root) could not be created.
    #[error("Cannot create run folder {path}")]
    Create {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// Socket paths inside the folder would exceed the Unix socket limit.
    #[error("Run folder {path} is too deep: socket paths must stay under {max} bytes; choose a shorter run root")]
    PathTooLong {
        /// The folder.
        path: PathBuf,
        /// The limit.
        max: usize,
    },
    /// The lock file could not be created or locked.
    #[error("Cannot lock run folder {path}")]
    Lock {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// `vm.json` could not be written.
    #[error("Cannot write {path}")]
    WriteRecord {
        /// The record file.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// The run root could not be listed.
    #[error("Cannot list run folders in {path}")]
    List {
        /// The run root.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
}

/// A VM's id: 12 lowercase hex characters when generated; any `[A-Za-z0-9_-]{1,64}`
/// when parsed, so it is always one safe path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VmId(String);

impl VmId {
    /// A fresh random id.
    pub fn generate() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS once per thread and then perturbed per
        // instance; mixing in the time and pid keeps ids unique across processes.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        hasher.write_u32(std::process::id());
        let hex = format!("{:016x}", hasher.finish());
        Self(hex[..VM_ID_HEX_CHARS].to_owned())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for VmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for VmId {
    type Err = InvalidVmId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidVmId(s.to_owned()))
        }
    }
}

impl TryFrom<String> for VmId {
    type Error = InvalidVmId;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<VmId> for String {
    fn from(id: VmId) -> Self {
        id.0
    }
}

/// A string that is not a valid [`VmId`].
#[derive(Debug, thiserror::Error)]
#[error("Invalid VM id {0:?}: use 1 to 64 of [A-Za-z0-9_-]")]
pub struct InvalidVmId(pub String);

/// What `vm.json` says about a VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    /// The VM's id (also the folder name).
    pub id: VmId,
    /// The process that started the VM.
    pub owner_pid: u32,
    /// True when the VM was started to outlive its owner.
    pub detached: bool,
    /// QEMU's pid, once started.
    pub qemu_pid: Option<u32>,
    /// `vhost-device-vsock`'s pid, once started.
    pub daemon_pid: Option<u32>,
    /// Where to reach the agent (`hvsock://PATH:PORT`).
    pub agent_url: String,
    /// The template's name.
    pub template: String,
    /// The accelerator in use.
    pub accel: Accel,
    /// vCPUs and memory.
    pub size: Size,
    /// When the folder was created, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// How the agent is reached (records from before transports existed: vsock).
    #[serde(default = "vsock")]
    pub transport: super::AgentTransport,
    /// The checkpoint this VM was restored from and still maps (its RAM image and
    /// disk): such a checkpoint is not deleted while the VM lives.
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// Set while the VM is hibernated: the folder (inside the run folder) holding its
    /// image. No QEMU runs; the next `--vm ID` or `vm wake` restores it.
    #[serde(default)]
    pub hibernation: Option<String>,
    /// The snapshot this VM was started from (a checkpoint, a template's ready or
    /// promoted snapshot), if it was not booted.
    #[serde(default)]
    pub restored_from: Option<String>,
    /// When QEMU started, in clock ticks after the host's boot (`/proc/PID/stat`
    /// field 22): with the VM id in its arguments, what tells this VM's QEMU from a
    /// process that took over its pid (see [`is_vm_qemu`]). `None` in records from
    /// before it was kept.
    #[serde(default)]
    pub qemu_started_ticks: Option<u64>,
}

fn vsock() -> super::AgentTransport {
    super::AgentTransport::Vsock
}

/// A run folder owned by this process: locked while alive, removed on drop unless
/// [`RunDir::keep`] hands it to a detached VM.
#[derive(Debug)]
pub(crate) struct RunDir {
    id: VmId,
    path: PathBuf,
    /// Holds the `flock` that tells other processes an owner is alive.
    lock: Option<File>,
    keep: bool,
}

impl RunDir {
    /// Creates `root/<fresh id>/`, locked by this process.
    pub(crate) fn create(root: &Path) -> Result<Self, RunDirError> {
        let root = prepared_root(root)?;
        loop {
            let id = VmId::generate();
            let path = room_for_sockets(root.join(id.as_str()))?;
            match Self::make(path, id)? {
                Some(dir) => return Ok(dir),
                None => continue,
            }
        }
    }

    /// Creates `root/<id>/` for a VM that keeps the id it had elsewhere (one moved
    /// here from another host), locked by this process; refused when it exists.
    pub(crate) fn create_named(root: &Path, id: &VmId) -> Result<Self, RunDirError> {
        let path = room_for_sockets(prepared_root(root)?.join(id.as_str()))?;
        Self::make(path.clone(), id.clone())?.ok_or_else(|| RunDirError::Create {
            path,
            error: io::Error::new(io::ErrorKind::AlreadyExists, "a VM with this id is here"),
        })
    }

    /// Makes and locks the folder `path`; `None` when it exists.
    fn make(path: PathBuf, id: VmId) -> Result<Option<Self>, RunDirError> {
        // 0700: the sockets inside reach the agent, the token file proves it.
        match fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
            Err(error) => return Err(RunDirError::Create { path, error }),
        }
        let lock = lock_file(&path).and_then(|file| {
            if sys::try_lock_exclusive(&file)? {
                Ok(file)
            } else {
                Err(io::Error::new(io::ErrorKind::WouldBlock, "already locked"))
            }
        });
        let lock = match lock {
            Ok(lock) => lock,
            Err(error) => {
                let _ = fs::remove_dir_all(&path);
                return Err(RunDirError::Lock { path, error });
            }
        };
        Ok(Some(Self {
            id,
            path,
            lock: Some(lock),
            keep: false,
        }))
    }

    /// Takes over the existing folder of VM `id` (to wake it), locked by this
    /// process. It is never removed by this handle: what it holds (a hibernation
    /// image) must survive a failed wake.
    pub(crate) fn adopt(root: &Path, id: &VmId) -> Result<Self, RunDirError> {
        Self::try_adopt(root, id)?.ok_or_else(|| RunDirError::Lock {
            path: root.join(id.as_str()),
            error: io::Error::new(io::ErrorKind::WouldBlock, "another process holds this VM"),
        })
    }

    /// [`RunDir::adopt`] without the error when someone else holds the folder's lock
    /// (another process's wake of the same VM, an owner, a sweep looking at it):
    /// `Ok(None)`, so the caller can wait and look again.
    pub(crate) fn try_adopt(root: &Path, id: &VmId) -> Result<Option<Self>, RunDirError> {
        let path = root.join(id.as_str());
        let locked = existing_lock_file(&path)
            .and_then(|file| Ok(sys::try_lock_exclusive(&file)?.then_some(file)));
        let lock = locked.map_err(|error| RunDirError::Lock {
            path: path.clone(),
            error,
        })?;
        Ok(lock.map(|lock| Self {
            id: id.clone(),
            path,
            lock: Some(lock),
            keep: true,
        }))
    }

    pub(crate) fn id(&self) -> &VmId {
        &self.id
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A file inside the folder.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes the agent's token, readable by the owner only.
    pub(crate) fn write_token(&self, token: &str) -> Result<(), RunDirError> {
        write_token_file(&self.path, token)
    }

    /// Writes `value` as `name` in the folder (atomically, like the record).
    pub(crate) fn write_json<T: Serialize>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), RunDirError> {
        let path = self.file(name);
        let failed = |error| RunDirError::WriteRecord {
            path: path.clone(),
            error,
        };
        let text = serde_json::to_vec_pretty(value).map_err(|e| failed(io::Error::other(e)))?;
        let temp = self.file(&format!(".{name}.tmp"));
        fs::write(&temp, text).map_err(failed)?;
        fs::rename(&temp, &path).map_err(failed)
    }

    pub(crate) fn write_record(&self, record: &VmRecord) -> Result<(), RunDirError> {
        write_record_file(&self.path, record)
    }
    /// Leaves the folder in place and releases the lock: a detached VM lives on and
    /// its liveness is now its QEMU's.
    pub(crate) fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.lock = None;
        self.path.clone()
    }

    /// The opposite of keeping: the folder goes when this handle is dropped (a woken
    /// VM that this process owns: the folder was adopted, kept only until the wake
    /// succeeded).
    pub(crate) fn remove_on_drop(&mut self) {
        self.keep = false;
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(error) = remove_run_folder(&self.path) {
            if error.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), %error, "cannot remove run folder");
            }
        }
    }
}

/// `root`, made if missing, as an absolute path.
fn prepared_root(root: &Path) -> Result<PathBuf, RunDirError> {
    let failed = |error| RunDirError::Create {
        path: root.to_owned(),
        error,
    };
    fs::create_dir_all(root).map_err(failed)?;
    root.canonicalize().map_err(failed)
}

/// `path` when its longest socket path fits the Unix limit.
fn room_for_sockets(path: PathBuf) -> Result<PathBuf, RunDirError> {
    let longest = socket_path(&path, &format!("vm.vsock_{READY_PORT}"));
    if longest.as_os_str().len() > UNIX_SOCKET_PATH_MAX_BYTES {
        return Err(RunDirError::PathTooLong {
            path,
            max: UNIX_SOCKET_PATH_MAX_BYTES,
        });
    }
    Ok(path)
}

fn lock_file(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))
}

/// The lock file of a folder someone else made, never creating it: a sweep or a
/// wake that created it would put it back into a folder its owner is removing,
/// which then outlives the VM (`remove_dir_all` fails with "directory not empty").
fn existing_lock_file(dir: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).open(dir.join(LOCK_FILE))
}

fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// What a run folder looks like from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmStatus {
    /// QEMU is running.
    Running,
    /// Its owner holds it but QEMU is not running (booting, or being torn down).
    Busy,
    /// Nobody owns it and its QEMU is gone: [`sweep`] removes it.
    Stale,
    /// Hibernated: no QEMU, its image kept in the folder until it is woken or stopped
    /// (for a VM that is not detached, only while the process that owns it lives).
    Hibernated,
}

/// One run folder as seen by [`list`].
#[derive(Debug, Clone)]
pub struct RunDirEntry {
    /// The folder name, normally the VM id.
    pub name: String,
    /// The folder.
    pub path: PathBuf,
    /// Its `vm.json`, if readable.
    pub record: Option<VmRecord>,
    /// Whether it is alive.
    pub status: VmStatus,
}

/// Bytes of randomness in an agent token (printed as twice as many hex digits).
const TOKEN_BYTES: usize = 16;

/// A fresh agent token from the kernel's CSPRNG: 128 bits as hex.
pub fn generate_token() -> io::Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    random_bytes(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Fills `buf` from the kernel's CSPRNG (tokens, nonces, a restored guest's entropy).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    use std::io::Read;
    File::open("/dev/urandom")?.read_exact(buf)
}

impl RunDirEntry {
    /// The token the VM's agent requires, if the folder has one.
    pub fn token(&self) -> Option<String> {
        read_token(&self.path)
    }
}

/// Writes `dir/vm.json`, replacing it atomically.
pub(crate) fn write_record_file(dir: &Path, record: &VmRecord) -> Result<(), RunDirError> {
    let path = dir.join(RECORD_FILE);
    let tmp = dir.join(".vm.json.tmp");
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::from);
    json.and_then(|json| fs::write(&tmp, json))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|error| RunDirError::WriteRecord { path, error })
}

/// Writes `dir/token` (mode 0600), replacing it atomically.
pub(crate) fn write_token_file(dir: &Path, token: &str) -> Result<(), RunDirError> {
    let path = dir.join(TOKEN_FILE);
    let temp = dir.join(".token.tmp");
    let write = || -> io::Result<()> {
        use std::io::Write;
        let _ = fs::remove_file(&temp);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(token.as_bytes())?;
        fs::rename(&temp, &path)
    };
    write().map_err(|error| RunDirError::WriteRecord {
        path: path.clone(),
        error,
    })
}

/// Reads `dir/token`, if present.
pub fn read_token(dir: &Path) -> Option<String> {
    let token = fs::read_to_string(dir.join(TOKEN_FILE)).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// Reads every run folder under `root` (none when `root` does not exist).
pub fn list(root: &Path) -> Result<Vec<RunDirEntry>, RunDirError> {
    let mut entries: Vec<RunDirEntry> = read_root(root)?
        .into_iter()
        .map(|path| inspect(&path).0)
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Removes stale run folders (owner gone, QEMU dead), first killing a leftover daemon.
/// Returns the names of the folders removed.
pub fn sweep(root: &Path) -> Result<Vec<String>, RunDirError> {
    let mut removed = Vec::new();
    for path in read_root(root)? {
        // The lock stays held until the folder is gone, so two sweepers never race.
        let (entry, _lock) = inspect(&path);
        if entry.status != VmStatus::Stale {
            continue;
        }
        if let Some(pid) = entry.record.as_ref().and_then(|r| r.daemon_pid) {
            kill_if_ours(pid, &entry.path.to_string_lossy());
        }
        match remove_run_folder(&entry.path) {
            Ok(()) => {
                tracing::info!(name = %entry.name, "removed stale run folder");
                removed.push(entry.name);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %entry.path.display(), %error, "cannot remove stale run folder");
            }
        }
    }
    Ok(removed)
}

/// The link in a run folder to the VM's RAM file, which lives on a tmpfs outside it.
pub const RAM_LINK: &str = "ram";

/// Removes a run folder and the RAM file its [`RAM_LINK`] points at (a tmpfs file
/// that would otherwise hold the VM's memory forever).
pub fn remove_run_folder(path: &Path) -> io::Result<()> {
    if let Ok(ram) = fs::read_link(path.join(RAM_LINK)) {
        match fs::remove_file(&ram) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %ram.display(), %error, "cannot remove the VM's RAM file")
            }
        }
    }
    // A file written into the folder while it is removed (a helper's last log line)
    // makes the removal fail with "directory not empty": look again, a few times.
    let mut attempts = 0;
    loop {
        match fs::remove_dir_all(path) {
            Err(error) if error.raw_os_error() == Some(libc::ENOTEMPTY) && attempts < 3 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn read_root(root: &Path) -> Result<Vec<PathBuf>, RunDirError> {
    let dir = match fs::read_dir(root) {
        Ok(dir) => dir,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(RunDirError::List {
                path: root.to_owned(),
                error,
            })
        }
    };
    Ok(dir
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect())
}

/// Looks at one folder; returns the lock when this call acquired it (no live owner).
fn inspect(path: &Path) -> (RunDirEntry, Option<File>) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let record = read_record(path);
    // No lock file: a folder being made or being removed, whose owner is alive.
    let lock = existing_lock_file(path)
        .ok()
        .filter(|file| sys::try_lock_exclusive(file).unwrap_or(false));
    let owner_alive = lock.is_none();
    let qemu_alive = record.as_ref().is_some_and(is_vm_qemu);
    let young = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < UNRECORDED_GRACE);
    let hibernated = record.as_ref().is_some_and(|r| r.hibernation.is_some());
    // An owned VM's image waits for its owner, which holds no lock while the VM
    // sleeps: once that process is gone, the image is as dead as the owner's running
    // VMs (their QEMUs die with it). A detached VM's image waits for anyone's wake.
    let orphaned = record
        .as_ref()
        .is_some_and(|r| !r.detached && !process_alive(r.owner_pid));
    let status = if qemu_alive {
        VmStatus::Running
    } else if owner_alive || (record.is_none() && young) {
        VmStatus::Busy
    } else if hibernated && !orphaned {
        VmStatus::Hibernated
    } else {
        VmStatus::Stale
    };
    let entry = RunDirEntry {
        name,
        path: path.to_owned(),
        record,
        status,
    };
    (entry, lock)
}

/// Reads `dir/vm.json`, if present and well-formed.
pub fn read_record(dir: &Path) -> Option<VmRecord> {
    let bytes = fs::read(dir.join(RECORD_FILE)).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "unreadable vm record");
            None
        }
    }
}

/// The `-name` QEMU gets: how a pid is recognised as this VM's QEMU.
pub(crate) fn qemu_name(id: &VmId) -> String {
    format!("sandbox-{id}")
}

/// True when the record's QEMU runs: its pid is alive, its arguments carry the VM's
/// `-name`, and (when recorded) it started when the record says. A process that took
/// over the pid after QEMU ended fails the last two.
pub fn is_vm_qemu(record: &VmRecord) -> bool {
    let Some(pid) = record.qemu_pid else {
        return false;
    };
    if !process_mentions(pid, &qemu_name(&record.id)) {
        return false;
    }
    match record.qemu_started_ticks {
        Some(ticks) => process_start_ticks(pid) == Some(ticks),
        None => true,
    }
}

/// When `pid` started, in clock ticks after boot (`/proc/PID/stat` field 22).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')':
    // fields are counted after its last ')'. Field 3 is the first after it.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// True when a process `pid` exists (a recycled pid reads as alive: an image then
/// waits longer, it is never removed early).
pub(crate) fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// True when `pid` is alive and one of its arguments contains `needle`.
pub(crate) fn process_mentions(pid: u32, needle: &str) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = needle.as_bytes();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.windows(needle.len()).any(|w| w == needle))
}

/// Sends `SIGKILL` to `pid` if it is still the process we started (its arguments
/// mention `needle`). Checked through a pidfd, so the signal cannot reach a process
/// that took over the pid after the check.
pub(crate) fn kill_if_ours(pid: u32, needle: &str) -> bool {
    let Ok(pidfd) = PidFd::open(pid) else {
        return false;
    };
    if !process_mentions(pid, needle) {
        return false;
    }
    pidfd.send_signal(nix::sys::signal::Signal::SIGKILL).is_ok()
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_unix_ms() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sbx-rundir-{tag}-{}-{}",
            std::process::id(),
            VmId::generate()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn record(id: &VmId, qemu_pid: Option<u32>) -> VmRecord {
        VmRecord {
            id: id.clone(),
            owner_pid: std::process::id(),
            detached: false,
            qemu_pid,
            daemon_pid: None,
            agent_url: "hvsock:///x/vm.vsock:1024".into(),
            template: "default".into(),
            accel: Accel::Tcg,
            size: Size::SMALL,
            created_at_unix_ms: now_unix_ms(),
            transport: crate::launcher::AgentTransport::Vsock,
            checkpoint: None,
            hibernation: None,
            restored_from: None,
            qemu_started_ticks: None,
        }
    }

    /// Stand-in for the QEMU of VM `id`: a process whose arguments carry its qemu
    /// name. A shell blocked in its `read` builtin, so killing it leaves no
    /// grandchild behind.
    fn fake_qemu(id: &VmId) -> std::process::Child {
        let fake = std::process::Command::new("sh")
            .args(["-c", "read x", &qemu_name(id)])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Regression: `spawn` can return before the kernel has set up the new argv
        // (the vfork parent resumes mid-exec), so wait until it shows.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !process_mentions(fake.id(), &qemu_name(id)) {
            assert!(std::time::Instant::now() < deadline, "argv never showed");
            std::thread::sleep(Duration::from_millis(5));
        }
        fake
    }

    #[test]
    fn start_ticks_tell_a_live_process_from_a_recycled_pid() {
        let own = process_start_ticks(std::process::id()).expect("own start time");
        assert_eq!(process_start_ticks(std::process::id()), Some(own));
        assert_eq!(process_start_ticks(dead_pid()), None);
        // A record naming a live process with the VM's name but another start time
        // (a pid taken over) is not that VM's QEMU.
        let id = VmId::generate();
        let mut fake = fake_qemu(&id);
        let mut rec = record(&id, Some(fake.id()));
        rec.qemu_started_ticks = process_start_ticks(fake.id());
        assert!(is_vm_qemu(&rec));
        rec.qemu_started_ticks = rec.qemu_started_ticks.map(|t| t + 1);
        assert!(!is_vm_qemu(&rec), "another start time is another process");
        fake.kill().unwrap();
        fake.wait().unwrap();
    }

    #[test]
    fn generated_ids_are_distinct_and_parse_back() {
        let a = VmId::generate();
        let b = VmId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), VM_ID_HEX_CHARS);
        assert_eq!(a.as_str().parse::<VmId>().unwrap(), a);
    }

    #[test]
    fn ids_that_could_escape_the_run_root_are_refused() {
        for bad in ["", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(bad.parse::<VmId>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_live_owner_keeps_its_folder_and_drop_removes_it() {
        let root = scratch("owned");
        let dir = RunDir::create(&root).unwrap();
        dir.write_record(&record(dir.id(), None)).unwrap();
        let listed = list(&root).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].status, VmStatus::Busy);
        assert_eq!(listed[0].record.as_ref().unwrap().id, *dir.id());
        assert!(sweep(&root).unwrap().is_empty());
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sweep_removes_a_folder_whose_owner_and_qemu_are_gone() {
        let root = scratch("stale");
        let dir = RunDir::create(&root).unwrap();
        // A pid that is certainly not a QEMU named after this VM: our own.
        dir.write_record(&record(dir.id(), Some(std::process::id())))
            .unwrap();
        let path = dir.keep();
        assert_eq!(list(&root).unwrap()[0].status, VmStatus::Stale);
        assert_eq!(sweep(&root).unwrap().len(), 1);
        assert!(!path.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_detached_vm_with_a_live_qemu_is_running() {
        let root = scratch("detached");
        let dir = RunDir::create(&root).unwrap();
        let id = dir.id().clone();
        let mut fake = fake_qemu(&id);
        dir.write_record(&record(&id, Some(fake.id()))).unwrap();
        let path = dir.keep();
        assert_eq!(list(&root).unwrap()[0].status, VmStatus::Running);
        assert!(sweep(&root).unwrap().is_empty());
        fake.kill().unwrap();
        fake.wait().unwrap();
        assert_eq!(sweep(&root).unwrap(), vec![id.to_string()]);
        assert!(!path.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_owned_hibernated_vm_is_kept_while_its_owner_lives_and_swept_after() {
        let root = scratch("sleeping");
        let dir = RunDir::create(&root).unwrap();
        let id = dir.id().clone();
        let mut sleeping = record(&id, None);
        sleeping.hibernation = Some("hibernation-x".into());
        dir.write_record(&sleeping).unwrap();
        let path = dir.keep();
        assert_eq!(list(&root).unwrap()[0].status, VmStatus::Hibernated);
        assert!(
            sweep(&root).unwrap().is_empty(),
            "its owner (this test) lives"
        );
        // A detached VM's image outlives whoever started it.
        let mut detached = sleeping.clone();
        detached.detached = true;
        detached.owner_pid = dead_pid();
        write_record_file(&path, &detached).unwrap();
        assert!(sweep(&root).unwrap().is_empty());
        // An owned one goes with its owner, as its QEMU would have.
        sleeping.owner_pid = dead_pid();
        write_record_file(&path, &sleeping).unwrap();
        assert_eq!(list(&root).unwrap()[0].status, VmStatus::Stale);
        assert_eq!(sweep(&root).unwrap(), vec![id.to_string()]);
        fs::remove_dir_all(&root).unwrap();
    }

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn a_fresh_folder_without_record_is_left_alone() {
        let root = scratch("fresh");
        fs::create_dir(root.join("abc")).unwrap();
        assert_eq!(list(&root).unwrap()[0].status, VmStatus::Busy);
        assert!(sweep(&root).unwrap().is_empty());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_run_root_too_deep_for_socket_paths_is_refused() {
        let root = scratch("deep");
        let deep = root.join("d".repeat(100));
        let err = RunDir::create(&deep).unwrap_err();
        assert!(matches!(err, RunDirError::PathTooLong { .. }), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }
}
