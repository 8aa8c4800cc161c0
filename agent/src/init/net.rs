//! The guest's network identity: its hostname and a working loopback.
//!
//! The sandbox has no network device by default, but plenty of programs talk to
//! `127.0.0.1` (test servers, language servers, databases), and `lo` starts down.
//! Bringing it up makes the kernel assign `127.0.0.1/8` and `::1` itself.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use nix::unistd::sethostname;

use super::InitError;

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
    let error = |error: nix::Error| InitError::LinkUp {
        interface: LOOPBACK,
        error: error.into(),
    };
    // Any socket will do as a handle for interface ioctls.
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(error)?;
    let flags = interface_flags(&sock, LOOPBACK).map_err(error)?;
    let up = flags | libc_flag(libc::IFF_UP) | libc_flag(libc::IFF_RUNNING);
    if up != flags {
        set_interface_flags(&sock, LOOPBACK, up).map_err(error)?;
    }
    Ok(())
}

/// `IFF_*` constants are `c_int` in libc but the ioctl field is a `c_short`; every
/// flag this module uses fits.
fn libc_flag(flag: libc::c_int) -> libc::c_short {
    libc::c_short::try_from(flag).unwrap_or(0)
}

nix::ioctl_read_bad!(siocgifflags, libc::SIOCGIFFLAGS, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifflags, libc::SIOCSIFFLAGS, libc::ifreq);

/// An `ifreq` naming `interface` with the given flags. Names longer than
/// `IFNAMSIZ - 1` bytes are cut, which never happens for the constants used here.
fn ifreq(interface: &str, flags: libc::c_short) -> libc::ifreq {
    let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (slot, byte) in name
        .iter_mut()
        .zip(interface.bytes().take(libc::IFNAMSIZ - 1))
    {
        *slot = byte as libc::c_char;
    }
    libc::ifreq {
        ifr_name: name,
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_flags: flags },
    }
}

fn interface_flags(sock: &OwnedFd, interface: &str) -> nix::Result<libc::c_short> {
    let mut req = ifreq(interface, 0);
    // SAFETY: `sock` is an open socket; SIOCGIFFLAGS reads the NUL-terminated name
    // from `req` and writes only `ifr_ifru.ifru_flags`, and `req` is a live, properly
    // sized `ifreq` for the whole call.
    unsafe { siocgifflags(sock.as_raw_fd(), &mut req) }?;
    // SAFETY: the kernel filled `ifru_flags` above; every bit pattern of a c_short is
    // valid, so reading this union field is sound.
    Ok(unsafe { req.ifr_ifru.ifru_flags })
}

fn set_interface_flags(sock: &OwnedFd, interface: &str, flags: libc::c_short) -> nix::Result<()> {
    let req = ifreq(interface, flags);
    // SAFETY: `sock` is an open socket; SIOCSIFFLAGS only reads the name and flags
    // from `req`, which outlives the call.
    unsafe { siocsifflags(sock.as_raw_fd(), &req) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_name_is_nul_terminated() {
        let req = ifreq("a-very-long-interface-name", 0);
        assert_eq!(req.ifr_name[libc::IFNAMSIZ - 1], 0);
        assert_eq!(req.ifr_name[0], b'a' as libc::c_char);
    }

    #[test]
    fn loopback_flags_are_readable_unprivileged() {
        let sock = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        // Reading flags needs no privilege; every Linux network namespace has `lo`.
        assert!(interface_flags(&sock, LOOPBACK).is_ok());
    }
}
