//! Network interface flags through `SIOCGIFFLAGS`/`SIOCSIFFLAGS`, which `nix` only
//! offers as raw ioctl macros. Any socket serves as the handle.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

nix::ioctl_read_bad!(siocgifflags, libc::SIOCGIFFLAGS, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifflags, libc::SIOCSIFFLAGS, libc::ifreq);

/// The `IFF_*` flags of `interface`.
pub fn interface_flags(sock: BorrowedFd<'_>, interface: &str) -> io::Result<libc::c_short> {
    let mut req = ifreq(interface, 0);
    // SAFETY: `sock` is an open socket; SIOCGIFFLAGS reads the NUL-terminated name
    // from `req` and writes only `ifr_ifru.ifru_flags`, and `req` is a live, properly
    // sized `ifreq` for the whole call.
    unsafe { siocgifflags(sock.as_raw_fd(), &mut req) }?;
    // SAFETY: the kernel filled `ifru_flags` above; every bit pattern of a c_short is
    // valid, so reading this union field is sound.
    Ok(unsafe { req.ifr_ifru.ifru_flags })
}

/// Replaces the `IFF_*` flags of `interface` (needs `CAP_NET_ADMIN`).
pub fn set_interface_flags(
    sock: BorrowedFd<'_>,
    interface: &str,
    flags: libc::c_short,
) -> io::Result<()> {
    let req = ifreq(interface, flags);
    // SAFETY: `sock` is an open socket; SIOCSIFFLAGS only reads the name and flags
    // from `req`, which outlives the call.
    unsafe { siocsifflags(sock.as_raw_fd(), &req) }?;
    Ok(())
}

/// An `ifreq` naming `interface` with the given flags. Names longer than
/// `IFNAMSIZ - 1` bytes are cut, which never happens for the names the agent uses.
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsFd;

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
        assert!(interface_flags(sock.as_fd(), "lo").is_ok());
    }
}
