//! Requests about the whole machine rather than one process or file (see
//! [`sandbox_protocol::machine`]): `resumed` after a snapshot restore or a fork,
//! `reidentify` after a fork, and `shutdown`. (`info` is [`Agent::info`], since it
//! reports the agent's own state.)
//!
//! `resumed` changes what every process in the guest sees (the wall clock, the
//! kernel's random pool, `/etc/machine-id`), so only an agent that is the guest's
//! init does it; a development agent on a Unix socket refuses. `reidentify` follows
//! the same rule for the hostname, but replaces the agent's token for any agent: the
//! token concerns the agent alone. `shutdown` only records the power action: the
//! server stops after the reply is sent, and init powers off (see
//! [`crate::init::power_off`]). The blocking part of `resumed` and `reidentify` runs
//! on a thread kept for it ([`worker`]), which a restored child finds ready.

pub mod worker;

use std::path::Path;

use sandbox_protocol::limits::MAX_TOKEN_BYTES;
use sandbox_protocol::{
    AgentInfo, ErrorKind, ReidentifyRequest, ResumedRequest, ShutdownRequest, WireError,
};

use crate::agent::Agent;
use crate::files::atomic::AtomicFile;
use crate::files::FileError;
use crate::init::cmdline::{is_valid_hostname, HOSTNAME_MAX_BYTES};
use crate::init::PowerAction;
use crate::sys;

/// Where systemd and friends read the machine's identity.
const MACHINE_ID_PATH: &str = "/etc/machine-id";

/// Where programs (and the next boot of a disk) read the machine's hostname.
const HOSTNAME_PATH: &str = "/etc/hostname";

/// How much of a refused hostname an error message shows.
const SHOWN_NAME_CHARS: usize = 80;

/// Why a `resumed` request failed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// Setting `CLOCK_REALTIME` failed.
    #[error("Cannot set the wall clock")]
    SetClock(#[source] std::io::Error),
    /// Feeding or reseeding the kernel's random pool failed.
    #[error("Cannot add entropy and reseed")]
    Entropy(#[source] std::io::Error),
    /// Writing a new machine id failed.
    #[error("Cannot write a new machine id")]
    MachineId(#[source] FileError),
}

impl ResumeError {
    /// The error as the client sees it.
    pub fn to_wire(&self) -> WireError {
        match self {
            Self::SetClock(error) | Self::Entropy(error) => WireError::from_io(self, error),
            Self::MachineId(error) => file_error_under(self, error),
        }
    }
}

/// Handles `resumed`: as init, [`resume`]s on the blocking pool, reseeds the
/// interpreter sessions from the freshly reseeded kernel pool (see
/// [`crate::session::warm`]), counts one more generation and answers with the
/// agent's info.
pub async fn resumed(agent: &Agent, request: ResumedRequest) -> Result<AgentInfo, WireError> {
    if !agent.is_init {
        return Err(WireError::new(
            ErrorKind::PermissionDenied,
            "resumed sets the clock, the random pool and /etc/machine-id of the whole machine, \
             so only an agent running as the guest's init does it",
        ));
    }
    // A clock without entropy only sets the clock again (the host resends the time
    // until one arrives fast): the random state was renewed by the first.
    let clock_only = request.sets_clock_only();
    match on_machine_thread(agent, move || resume(&request)).await? {
        Ok(()) if clock_only => Ok(agent.info()),
        Ok(()) => {
            crate::session::warm::reseed_all(&agent.sessions).await;
            agent.bump_generation();
            Ok(agent.info())
        }
        Err(error) => Err(error.to_wire()),
    }
}

/// Runs `work` on the agent's machine thread. Without one (it could not be started
/// at boot) the work is done in place: it is a few system calls and a small write.
async fn on_machine_thread<T: Send + 'static>(
    agent: &Agent,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WireError> {
    match &agent.machine {
        Some(worker) => worker.run(work).await,
        None => Ok(work()),
    }
}

/// A file error as the client sees it, under `what` failed (its kind and errno kept).
fn file_error_under(what: &dyn std::fmt::Display, error: &FileError) -> WireError {
    let inner = error.to_wire();
    WireError {
        kind: inner.kind,
        message: format!("{what}: {}", inner.message),
        errno: inner.errno,
    }
}

/// Why a `reidentify` request failed. The checks come first, so a refused request
/// changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReidentifyError {
    /// An empty token would admit anyone who sends an empty one.
    #[error("The new token is empty")]
    EmptyToken,
    /// A token that no `Hello` could carry would lock every client out.
    #[error("The new token has {len} bytes; at most {MAX_TOKEN_BYTES} fit in a Hello")]
    TokenTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Not a name the kernel and programs accept.
    #[error(
        "Invalid hostname {shown:?}: use 1 to {HOSTNAME_MAX_BYTES} ASCII letters, digits, \
         '-' and '.'"
    )]
    InvalidHostname {
        /// The name, cut to a readable length.
        shown: String,
    },
    /// The hostname belongs to the whole machine.
    #[error(
        "reidentify sets the hostname of the whole machine, so only an agent running as \
         the guest's init does it (a token alone may be changed by any agent)"
    )]
    NotInit,
    /// `sethostname` failed.
    #[error("Cannot set hostname {name:?}")]
    SetHostname {
        /// The requested name.
        name: String,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// Writing `/etc/hostname` failed (the kernel's hostname is already set).
    #[error("Cannot write {HOSTNAME_PATH}")]
    HostnameFile(#[source] FileError),
}

impl ReidentifyError {
    /// The error as the client sees it.
    pub fn to_wire(&self) -> WireError {
        match self {
            Self::EmptyToken | Self::InvalidHostname { .. } => {
                WireError::new(ErrorKind::BadRequest, self.to_string())
            }
            Self::TokenTooLong { .. } => WireError::new(ErrorKind::TooLarge, self.to_string()),
            Self::NotInit => WireError::new(ErrorKind::PermissionDenied, self.to_string()),
            Self::SetHostname { error, .. } => WireError::from_io(self, error),
            Self::HostnameFile(error) => file_error_under(self, error),
        }
    }
}

/// Handles `reidentify`: checks the whole request, then (as init) sets the hostname
/// on the blocking pool, then replaces the token. A refused request changes nothing;
/// one that fails writing `/etc/hostname` has set the kernel's hostname but kept the
/// old token, and may simply be sent again. Connections already served stay served
/// under the old token, the one that sent this included.
pub async fn reidentify(agent: &Agent, request: ReidentifyRequest) -> Result<(), WireError> {
    let ReidentifyRequest { hostname, token } = request;
    check_reidentify(agent.is_init, hostname.as_deref(), token.as_deref())
        .map_err(|error| error.to_wire())?;
    if let Some(name) = hostname {
        let job = {
            let name = name.clone();
            move || set_hostname(&name, Path::new(HOSTNAME_PATH))
        };
        match on_machine_thread(agent, job).await? {
            Ok(()) => tracing::info!(hostname = %name, "reidentify: hostname set"),
            Err(error) => return Err(error.to_wire()),
        }
    }
    if let Some(token) = token {
        agent.replace_token(token);
        tracing::info!("reidentify: token replaced; new connections need the new one");
    }
    Ok(())
}

/// Everything about a `reidentify` that can be refused before anything changes.
fn check_reidentify(
    is_init: bool,
    hostname: Option<&str>,
    token: Option<&str>,
) -> Result<(), ReidentifyError> {
    match token {
        Some("") => return Err(ReidentifyError::EmptyToken),
        Some(token) if token.len() > MAX_TOKEN_BYTES => {
            return Err(ReidentifyError::TokenTooLong { len: token.len() })
        }
        _ => {}
    }
    if let Some(name) = hostname {
        if !is_valid_hostname(name) {
            return Err(ReidentifyError::InvalidHostname {
                shown: name.chars().take(SHOWN_NAME_CHARS).collect(),
            });
        }
        if !is_init {
            return Err(ReidentifyError::NotInit);
        }
    }
    Ok(())
}

/// Sets the kernel's hostname to `name` (already checked), then replaces `file`
/// with it atomically. Blocking.
fn set_hostname(name: &str, file: &Path) -> Result<(), ReidentifyError> {
    nix::unistd::sethostname(name).map_err(|errno| ReidentifyError::SetHostname {
        name: name.to_owned(),
        error: errno.into(),
    })?;
    write_hostname_file(name, file).map_err(ReidentifyError::HostnameFile)
}

/// Writes `name` and a newline to `path`, atomically.
fn write_hostname_file(name: &str, path: &Path) -> Result<(), FileError> {
    let mut file = AtomicFile::create(path, Some(0o644))?;
    file.write(name.as_bytes())?;
    file.write(b"\n")?;
    file.commit().map(drop)
}

/// Handles `shutdown`: asks the server to stop and the guest to power off (or
/// reboot). The caller replies at once; the power action happens after.
pub fn shutdown(agent: &Agent, request: ShutdownRequest) {
    agent.request_shutdown(if request.reboot {
        PowerAction::Reboot
    } else {
        PowerAction::PowerOff
    });
}

/// Sets the clock, reseeds the kernel's generator, and (for a fork) writes a new
/// machine id. Blocking; the caller bumps the generation on success.
pub fn resume(request: &ResumedRequest) -> Result<(), ResumeError> {
    if request.wall_clock_ns > 0 {
        sys::set_wall_clock(request.wall_clock_ns).map_err(ResumeError::SetClock)?;
    }
    if !request.sets_clock_only() {
        sys::add_entropy_and_reseed(&request.entropy).map_err(ResumeError::Entropy)?;
    }
    if request.new_identity {
        write_machine_id(Path::new(MACHINE_ID_PATH)).map_err(ResumeError::MachineId)?;
    }
    Ok(())
}

/// Writes 128 fresh random bits as 32 hex digits and a newline, atomically.
fn write_machine_id(path: &Path) -> Result<(), FileError> {
    let mut id = [0u8; 16];
    sys::random_bytes(&mut id).map_err(|error| FileError::io("generate", path, error))?;
    let mut text: String = id.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    let mut file = AtomicFile::create(path, Some(0o444))?;
    file.write(text.as_bytes())?;
    file.commit().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_init_resumes_the_machine() {
        let agent = Agent::new(std::time::Duration::from_secs(1), None, false);
        let request = ResumedRequest {
            wall_clock_ns: 0,
            entropy: vec![],
            new_identity: false,
        };
        let error = resumed(&agent, request).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::PermissionDenied);
        assert_eq!(agent.info().generation, 0);
    }

    #[test]
    fn shutdown_records_the_power_action() {
        let agent = Agent::new(std::time::Duration::from_secs(1), None, false);
        shutdown(&agent, ShutdownRequest { reboot: true });
        assert_eq!(agent.requested_shutdown(), Some(PowerAction::Reboot));
    }

    fn reidentify_request(hostname: Option<&str>, token: Option<&str>) -> ReidentifyRequest {
        ReidentifyRequest {
            hostname: hostname.map(str::to_owned),
            token: token.map(str::to_owned),
        }
    }

    #[tokio::test]
    async fn reidentify_replaces_the_token_of_any_agent() {
        let agent = Agent::new(std::time::Duration::from_secs(1), Some("old".into()), false);
        reidentify(&agent, reidentify_request(None, Some("new")))
            .await
            .unwrap();
        assert!(agent.admits(Some("new")));
        assert!(!agent.admits(Some("old")));
    }

    #[tokio::test]
    async fn an_empty_or_overlong_token_is_refused_and_the_old_one_kept() {
        let agent = Agent::new(std::time::Duration::from_secs(1), Some("old".into()), false);
        let long = "t".repeat(MAX_TOKEN_BYTES + 1);
        for (token, kind) in [("", ErrorKind::BadRequest), (&long, ErrorKind::TooLarge)] {
            let error = reidentify(&agent, reidentify_request(None, Some(token)))
                .await
                .unwrap_err();
            assert_eq!(error.kind, kind, "{error}");
        }
        assert!(agent.admits(Some("old")));
        // The longest accepted token is accepted.
        let longest = "t".repeat(MAX_TOKEN_BYTES);
        reidentify(&agent, reidentify_request(None, Some(&longest)))
            .await
            .unwrap();
        assert!(agent.admits(Some(&longest)));
    }

    #[tokio::test]
    async fn a_bad_hostname_is_refused_and_nothing_changes() {
        // Checked before the init rule, so even an agent that is not init says why.
        let agent = Agent::new(std::time::Duration::from_secs(1), Some("old".into()), false);
        let long = "a".repeat(HOSTNAME_MAX_BYTES + 1);
        for name in ["", "bad_name!", "white space", "é", long.as_str()] {
            let error = reidentify(&agent, reidentify_request(Some(name), Some("new")))
                .await
                .unwrap_err();
            assert_eq!(error.kind, ErrorKind::BadRequest, "{name:?}: {error}");
        }
        // The token of a refused request is not applied either.
        assert!(agent.admits(Some("old")));
        assert!(!agent.admits(Some("new")));
    }

    #[test]
    fn a_refused_hostname_is_shown_cut_to_a_readable_length() {
        let error = check_reidentify(true, Some(&"_".repeat(100_000)), None).unwrap_err();
        assert!(error.to_string().len() < 300, "{error}");
    }

    #[tokio::test]
    async fn only_init_changes_the_hostname() {
        let agent = Agent::new(std::time::Duration::from_secs(1), Some("old".into()), false);
        let error = reidentify(&agent, reidentify_request(Some("box-2"), Some("new")))
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::PermissionDenied, "{error}");
        assert!(
            agent.admits(Some("old")),
            "the token changed with a refused hostname"
        );
    }

    #[test]
    fn an_init_agent_may_change_both() {
        assert!(check_reidentify(true, Some("box-2"), Some("new")).is_ok());
        assert!(check_reidentify(true, None, None).is_ok());
        assert!(check_reidentify(false, None, Some("new")).is_ok());
    }

    #[test]
    fn the_hostname_file_holds_the_name_and_a_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostname");
        std::fs::write(&path, "sandbox\n").unwrap();
        write_hostname_file("box-2", &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "box-2\n");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn machine_ids_are_32_hex_digits_and_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("machine-id");
        write_machine_id(&path).unwrap();
        let first = std::fs::read_to_string(&path).unwrap();
        write_machine_id(&path).unwrap();
        let second = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.len(), 33);
        assert!(first.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(first, second);
    }
}
