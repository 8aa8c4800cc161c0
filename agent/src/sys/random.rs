//! Randomness: bytes from the kernel's generator, ids built from them, and feeding
//! and reseeding the kernel's pool after a snapshot restore.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{SystemTime, UNIX_EPOCH};

/// Fills `buf` from the kernel's generator with `getrandom(2)` and `flags`; an error
/// unless every byte was filled.
fn getrandom(buf: &mut [u8], flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: getrandom writes at most `buf.len()` bytes into the live buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), flags) };
    match usize::try_from(n) {
        Ok(n) if n == buf.len() => Ok(()),
        Ok(_) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        Err(_) => Err(io::Error::last_os_error()),
    }
}

/// Fills `buf` with secure random bytes, waiting for the kernel's generator to be
/// seeded if it is not yet (after a restore the pool has just been reseeded, so the
/// wait is short).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    getrandom(buf, 0)
}

/// `len` random bytes as hex, for ids and temp names: from the kernel's generator
/// without waiting for it to be seeded (`GRND_INSECURE`: uniqueness, not secrecy, is
/// needed). Should that fail, the kernel's per-boot id, the wall clock and a
/// process-wide counter still make every value distinct.
pub fn random_hex(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    if getrandom(&mut bytes, libc::GRND_INSECURE).is_err() {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let boot_id =
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mixed = format!("{boot_id}{nanos}{count}{}", std::process::id());
        // FNV-1a over the mix, spread across the requested length.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, byte) in bytes.iter_mut().enumerate() {
            for b in mixed.bytes().chain(i.to_le_bytes()) {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            *byte = hash.to_le_bytes()[i % 8];
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `RNDADDENTROPY` from `<linux/random.h>`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG` from `<linux/random.h>`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Credits `entropy` to the kernel's pool and forces the CRNG to reseed from it, so
/// two VMs restored from one snapshot stop producing the same random numbers.
pub fn add_entropy_and_reseed(entropy: &[u8]) -> io::Result<()> {
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    if !entropy.is_empty() {
        // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
        let len = i32::try_from(entropy.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut info: Vec<u8> = Vec::with_capacity(8 + entropy.len());
        info.extend_from_slice(&len.saturating_mul(8).to_ne_bytes());
        info.extend_from_slice(&len.to_ne_bytes());
        info.extend_from_slice(entropy);
        // SAFETY: `info` is a complete rand_pool_info with `buf_size` bytes of payload,
        // alive for the call; the kernel only reads it.
        if unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids_have_the_length_asked_for_and_differ() {
        let (a, b) = (random_hex(16), random_hex(16));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn random_bytes_fill_the_whole_buffer() {
        let mut buf = [0u8; 64];
        random_bytes(&mut buf).unwrap();
        assert!(buf.iter().any(|&b| b != 0));
    }
}
