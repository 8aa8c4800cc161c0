//! Guest-wide requests: `resumed` (after a snapshot restore or a fork) and `shutdown`.

use std::path::Path;

use sandbox_protocol::{ResumedRequest, WireError};

use crate::files::atomic::AtomicFile;
use crate::files::FileError;
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
