//! The guest's network identity: its hostname and a working loopback.
//!
//! The sandbox has no network device by default, but plenty of programs talk to
//! `127.0.0.1` (test servers, language servers, databases), and `lo` starts down.
//! Bringing it up makes the kernel assign `127.0.0.1/8` and `::1` itself.

use std::os::fd::AsFd;

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use nix::unistd::sethostname;

use super::InitError;
use crate::sys;

/// The loopback interface.
pub const LOOPBACK: &str = "lo";

/// Sets the kernel hostname.
pub fn set_hostname(name: &str) -> Result<(), InitError> {
    sethostname(name).map_err(|error| InitError::Hostname {
        name: name.to_owned(),
        error: error.into(),
    })
}

/// Brings the loopback interface up.
pub fn loopback_up() -> Result<(), InitError> {
    let error = |error: std::io::Error| InitError::LinkUp {
        interface: LOOPBACK,
        error,
    };
    // Any socket will do as a handle for interface ioctls.
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|errno| error(errno.into()))?;
    let flags = sys::interface_flags(sock.as_fd(), LOOPBACK).map_err(error)?;
    let up = flags | libc_flag(libc::IFF_UP) | libc_flag(libc::IFF_RUNNING);
    if up != flags {
        sys::set_interface_flags(sock.as_fd(), LOOPBACK, up).map_err(error)?;
    }
    Ok(())
}

/// `IFF_*` constants are `c_int` in libc but the ioctl field is a `c_short`; every
/// flag this module uses fits.
fn libc_flag(flag: libc::c_int) -> libc::c_short {
    libc::c_short::try_from(flag).unwrap_or(0)
}
