//! The guest-wide commands: `resume` (after a restore or a fork: clock, entropy,
//! identity) and `shutdown` (power off or reboot). They act on the whole machine, not
//! on a file or a process.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use sandbox_vmm::client::Client;

use crate::output;

/// Bytes of fresh entropy `resume` hands the guest: 512 bits, what the kernel's
/// random pool needs to be fully seeded.
const RESUME_ENTROPY_BYTES: usize = 64;

/// Tells the guest it was restored: our clock, fresh entropy, and with
/// `new_identity` a new machine id; prints the guest's new generation.
pub(crate) async fn resume(client: &Client, new_identity: bool) -> anyhow::Result<u8> {
    let mut entropy = vec![0u8; RESUME_ENTROPY_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut entropy))
        .context("Cannot read entropy from /dev/urandom")?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the clock is before 1970")?;
    let wall_clock_ns = u64::try_from(now.as_nanos()).context("the clock is past 2554")?;
    let info = client
        .resumed(wall_clock_ns, entropy, new_identity)
        .await
        .context("resume failed")?;
    output::print(&format!("generation {}\n", info.generation))?;
    Ok(0)
}

/// Powers the guest off (or reboots it) after its processes are stopped.
pub(crate) async fn shutdown(client: &Client, reboot: bool) -> anyhow::Result<u8> {
    client.shutdown(reboot).await.context("shutdown failed")?;
    Ok(0)
}
