//! `sandbox.*` parameters from the kernel command line.
//!
//! The kernel keeps dotted parameters (`sandbox.port=1024`) for modules and passes
//! neither them to init's argv nor to its environment, so PID 1 reads them from
//! `/proc/cmdline`. Parsing never fails: a bad value is reported as a
//! [`CmdlineWarning`] and its default is kept, because PID 1 must come up anyway.
//!
//! | parameter | meaning | default |
//! | --- | --- | --- |
//! | `sandbox.port` | vsock port the agent listens on | 1024 |
//! | `sandbox.token` | token clients must present in their hello | none |
//! | `sandbox.hostname` | the guest's hostname | `sandbox` |
//! | `sandbox.root` | block device holding the real root (stage one), e.g. `/dev/vda` | none |
//! | `sandbox.log` | `tracing` filter for the agent's console log | `info` |
//! | `sandbox.ready_port` | host vsock port for the ready message; `0` disables it | 1025 |
//! | `sandbox.allow_cid` | a peer CID accepted besides the host's (2) | none |
//! | `sandbox.serial` | serve the link on the virtio-serial port of this name instead of vsock (no ready message either: the link's `Attached` is the readiness) | none |

use std::fmt;
use std::path::PathBuf;

use sandbox_protocol::limits::{AGENT_VSOCK_PORT, READY_VSOCK_PORT};

/// Where the kernel exposes its command line.
pub const PROC_CMDLINE_PATH: &str = "/proc/cmdline";

/// Prefix of the parameters this module owns.
const PREFIX: &str = "sandbox.";

/// Hostnames longer than this are refused (`HOST_NAME_MAX`).
pub(crate) const HOSTNAME_MAX_BYTES: usize = 64;

/// The agent's boot configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct BootParams {
    /// vsock port to listen on.
    pub port: u32,
    /// Token clients must present, if any.
    pub token: Option<String>,
    /// Hostname to set.
    pub hostname: String,
    /// Block device to switch into (stage one), if any.
    pub root: Option<PathBuf>,
    /// `tracing` filter directive for the console log.
    pub log: String,
    /// Host vsock port for the ready message; `None` when disabled.
    pub ready_port: Option<u32>,
    /// Peer CID accepted besides the host's.
    pub allow_cid: Option<u32>,
    /// The virtio-serial port to serve the link on, instead of vsock.
    pub serial: Option<String>,
    /// What was wrong with the command line (unknown keys, bad values).
    pub warnings: Vec<CmdlineWarning>,
}

impl Default for BootParams {
    fn default() -> Self {
        Self {
            port: AGENT_VSOCK_PORT,
            token: None,
            hostname: "sandbox".to_owned(),
            root: None,
            log: "info".to_owned(),
            ready_port: Some(READY_VSOCK_PORT),
            allow_cid: None,
            serial: None,
            warnings: Vec::new(),
        }
    }
}

// The token is a secret: keep it out of logs.
impl fmt::Debug for BootParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootParams")
            .field("port", &self.port)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("hostname", &self.hostname)
            .field("root", &self.root)
            .field("log", &self.log)
            .field("ready_port", &self.ready_port)
            .field("allow_cid", &self.allow_cid)
            .field("serial", &self.serial)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// Something on the command line that was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineWarning {
    /// A `sandbox.*` key this agent does not know.
    #[error("Unknown kernel parameter sandbox.{key}")]
    UnknownKey {
        /// The key without the `sandbox.` prefix.
        key: String,
    },
    /// A known key with a value that does not parse; the default was kept.
    #[error("Invalid value {value:?} for sandbox.{key}: {reason}")]
    InvalidValue {
        /// The key without the `sandbox.` prefix.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl BootParams {
    /// Reads and parses [`PROC_CMDLINE_PATH`]; `/proc` must be mounted.
    pub fn from_proc() -> std::io::Result<Self> {
        let cmdline = std::fs::read_to_string(PROC_CMDLINE_PATH)?;
        Ok(Self::from_cmdline(&cmdline))
    }

    /// Parses a kernel command line. Later occurrences of a key win, as in the kernel.
    pub fn from_cmdline(cmdline: &str) -> Self {
        let mut params = Self::default();
        for word in split_words(cmdline) {
            if word == "--" {
                // Everything after `--` belongs to init's argv, not to the kernel.
                break;
            }
            let Some(rest) = word.strip_prefix(PREFIX) else {
                continue;
            };
            let (key, value) = match rest.split_once('=') {
                Some((key, value)) => (key, value),
                None => (rest, ""),
            };
            params.apply(key, value);
        }
        params
    }

    fn apply(&mut self, key: &str, value: &str) {
        let invalid = |reason| CmdlineWarning::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let result = match key {
            "port" => match parse_port(value) {
                Some(0) | None => Err(invalid("expected a port number from 1 to 4294967294")),
                Some(port) => {
                    self.port = port;
                    Ok(())
                }
            },
            "token" => {
                self.token = (!value.is_empty()).then(|| value.to_owned());
                Ok(())
            }
            "hostname" => {
                if is_valid_hostname(value) {
                    self.hostname = value.to_owned();
                    Ok(())
                } else {
                    Err(invalid("expected 1 to 64 letters, digits, '-' or '.'"))
                }
            }
            "root" => {
                if value.is_empty() {
                    self.root = None;
                    Ok(())
                } else if value.starts_with("/dev/") {
                    self.root = Some(PathBuf::from(value));
                    Ok(())
                } else {
                    Err(invalid("expected a device path under /dev/"))
                }
            }
            "log" => {
                if value.is_empty() {
                    Err(invalid("expected a log filter such as info or debug"))
                } else {
                    self.log = value.to_owned();
                    Ok(())
                }
            }
            "ready_port" => match parse_port(value) {
                Some(0) => {
                    self.ready_port = None;
                    Ok(())
                }
                Some(port) => {
                    self.ready_port = Some(port);
                    Ok(())
                }
                None => Err(invalid("expected a port number, or 0 to disable")),
            },
            "allow_cid" => match value.parse::<u32>() {
                Ok(cid) if cid > 2 && cid != u32::MAX => {
                    self.allow_cid = Some(cid);
                    Ok(())
                }
                _ => Err(invalid("expected a guest or peer CID above 2")),
            },
            "serial" => {
                if is_valid_port_name(value) {
                    self.serial = Some(value.to_owned());
                    Ok(())
                } else {
                    Err(invalid(
                        "expected a port name of letters, digits, '-', '_' or '.'",
                    ))
                }
            }
            _ => Err(CmdlineWarning::UnknownKey {
                key: key.to_owned(),
            }),
        };
        if let Err(warning) = result {
            self.warnings.push(warning);
        }
    }
}

/// A vsock port: any `u32` except `u32::MAX` (`VMADDR_PORT_ANY`).
fn parse_port(value: &str) -> Option<u32> {
    value.parse::<u32>().ok().filter(|port| *port != u32::MAX)
}

/// Whether `name` may be the guest's hostname: 1 to [`HOSTNAME_MAX_BYTES`] ASCII
/// letters, digits, `-` and `.` (also what `reidentify` accepts).
pub(crate) fn is_valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= HOSTNAME_MAX_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// Splits like the kernel does: on whitespace, with double quotes grouping words
/// (`key="a b"` is one word `key=a b`; the quotes are dropped).
fn split_words(cmdline: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in cmdline.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// A virtio-serial port name as QEMU's `virtserialport,name=` takes it.
fn is_valid_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_nothing_is_given() {
        let params = BootParams::from_cmdline("console=ttyS0 quiet panic=-1\n");
        assert_eq!(params, BootParams::default());
        assert_eq!(params.port, 1024);
        assert_eq!(params.ready_port, Some(1025));
        assert_eq!(params.hostname, "sandbox");
        assert_eq!(params.log, "info");
    }

    #[test]
    fn every_known_key_is_parsed() {
        let params = BootParams::from_cmdline(
            "console=ttyS0 sandbox.port=5000 sandbox.token=s3cret sandbox.hostname=box-1 \
             sandbox.root=/dev/vda sandbox.log=debug,sandbox_agent=trace sandbox.ready_port=7 \
             sandbox.allow_cid=9 sandbox.serial=sandbox.agent",
        );
        assert_eq!(params.port, 5000);
        assert_eq!(params.token.as_deref(), Some("s3cret"));
        assert_eq!(params.hostname, "box-1");
        assert_eq!(params.root, Some(PathBuf::from("/dev/vda")));
        assert_eq!(params.log, "debug,sandbox_agent=trace");
        assert_eq!(params.ready_port, Some(7));
        assert_eq!(params.allow_cid, Some(9));
        assert_eq!(params.serial.as_deref(), Some("sandbox.agent"));
        assert!(params.warnings.is_empty());
    }

    #[test]
    fn ready_port_zero_disables_readiness() {
        let params = BootParams::from_cmdline("sandbox.ready_port=0");
        assert_eq!(params.ready_port, None);
    }

    #[test]
    fn bad_values_keep_defaults_and_warn() {
        let params = BootParams::from_cmdline(
            "sandbox.port=abc sandbox.hostname=bad_name! sandbox.root=vda sandbox.allow_cid=2 \
             sandbox.serial=../x",
        );
        assert_eq!(params.port, 1024);
        assert_eq!(params.hostname, "sandbox");
        assert_eq!(params.root, None);
        assert_eq!(params.allow_cid, None);
        assert_eq!(params.serial, None);
        assert_eq!(params.warnings.len(), 5);
        assert!(params
            .warnings
            .iter()
            .all(|w| matches!(w, CmdlineWarning::InvalidValue { .. })));
    }

    #[test]
    fn unknown_sandbox_keys_warn_and_others_are_ignored() {
        let params = BootParams::from_cmdline("foo.bar=1 sandbox.colour=blue sandbox.flag");
        assert_eq!(
            params.warnings,
            vec![
                CmdlineWarning::UnknownKey {
                    key: "colour".into()
                },
                CmdlineWarning::UnknownKey { key: "flag".into() },
            ]
        );
    }

    #[test]
    fn quotes_group_words_and_later_keys_win() {
        let params =
            BootParams::from_cmdline("sandbox.log=\"info,a=debug\" sandbox.port=1 sandbox.port=2");
        assert_eq!(params.log, "info,a=debug");
        assert_eq!(params.port, 2);
    }

    #[test]
    fn words_after_double_dash_belong_to_init() {
        let params = BootParams::from_cmdline("sandbox.port=3 -- sandbox.port=4");
        assert_eq!(params.port, 3);
    }

    #[test]
    fn debug_output_hides_the_token() {
        let params = BootParams::from_cmdline("sandbox.token=hunter2");
        assert!(!format!("{params:?}").contains("hunter2"));
    }
}
