//! Requests about the whole machine rather than one process or file (see
//! [`sandbox_protocol::machine`]): `resumed` after a snapshot restore or a fork, and
//! `shutdown`. (`info` is [`Agent::info`], since it reports the agent's own state.)
//!
//! `resumed` changes what every process in the guest sees (the wall clock, the
//! kernel's random pool, `/etc/machine-id`), so only an agent that is the guest's
//! init does it; a development agent on a Unix socket refuses. `shutdown` only
//! records the power action: the server stops after the reply is sent, and init
//! powers off (see [`crate::init::power_off`]).

use std::path::Path;

use sandbox_protocol::{AgentInfo, ErrorKind, ResumedRequest, ShutdownRequest, WireError};

use crate::agent::Agent;
use crate::files::atomic::AtomicFile;
use crate::files::FileError;
use crate::init::PowerAction;
use crate::sys;

/// Where systemd and friends read the machine's identity.
const MACHINE_ID_PATH: &str = "/etc/machine-id";

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
            Self::MachineId(error) => {
                let inner = error.to_wire();
                WireError {
                    kind: inner.kind,
                    message: format!("{self}: {}", inner.message),
                    errno: inner.errno,
                }
            }
        }
    }
}

/// Handles `resumed`: as init, [`resume`]s on the blocking pool, counts one more
/// generation and answers with the agent's info.
pub async fn resumed(agent: &Agent, request: ResumedRequest) -> Result<AgentInfo, WireError> {
    if !agent.is_init {
        return Err(WireError::new(
            ErrorKind::PermissionDenied,
            "resumed sets the clock, the random pool and /etc/machine-id of the whole machine, \
             so only an agent running as the guest's init does it",
        ));
    }
    match tokio::task::spawn_blocking(move || resume(&request)).await {
        Ok(Ok(())) => {
            agent.bump_generation();
            Ok(agent.info())
        }
        Ok(Err(error)) => Err(error.to_wire()),
        Err(join) => Err(WireError::new(ErrorKind::Internal, join.to_string())),
    }
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
    sys::add_entropy_and_reseed(&request.entropy).map_err(ResumeError::Entropy)?;
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
