//! Telling the host that the agent listens.
//!
//! Once the server is bound, the agent connects to the host (CID 2) on the ready port
//! (`sandbox.ready_port`, default [`READY_VSOCK_PORT`]) and writes one frame holding a
//! [`Ready`], then closes. The host waits for that connection instead of polling the
//! agent's port during boot. The host may not be listening yet (or at all, outside a
//! launcher), so a few attempts are made over about two seconds; failing is logged,
//! never fatal.
//!
//! [`READY_VSOCK_PORT`]: sandbox_protocol::limits::READY_VSOCK_PORT

use std::io;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use sandbox_protocol::frame::encode;
use sandbox_protocol::limits::{HOST_CID, MAX_FRAME_BYTES};
use sandbox_protocol::{Ready, MAGIC, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio_vsock::{VsockAddr, VsockStream};
use tracing::{debug, info, warn};

/// Connection attempts before giving up.
const ATTEMPTS: u32 = 5;

/// Pause between attempts.
const RETRY_DELAY: Duration = Duration::from_millis(400);

/// Deadline for one attempt (connect and write).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// A ready message for this agent, with the guest's current uptime.
pub fn ready_message(boot_id: String) -> Ready {
    Ready {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        boot_id,
        uptime_ms: uptime_ms(),
    }
}

/// Milliseconds since the kernel booted (`CLOCK_BOOTTIME`); 0 if the clock is unreadable.
pub fn uptime_ms() -> u64 {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .ok()
        .and_then(|ts| {
            let secs = u64::try_from(ts.tv_sec()).ok()?;
            let nanos = u64::try_from(ts.tv_nsec()).ok()?;
            secs.checked_mul(1000)?.checked_add(nanos / 1_000_000)
        })
        .unwrap_or(0)
}

/// Sends `ready` to the host's vsock `port`, retrying a few times. Never fails: the
/// outcome is logged.
pub async fn notify_host(port: u32, ready: &Ready) {
    let frame = match encode(ready, MAX_FRAME_BYTES) {
        Ok(frame) => frame,
        Err(error) => {
            warn!(%error, "ready message not encodable");
            return;
        }
    };
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, send_once(port, &frame)).await {
            Ok(Ok(())) => {
                info!(
                    port,
                    attempt,
                    uptime_ms = ready.uptime_ms,
                    "readiness reported to the host"
                );
                return;
            }
            Ok(Err(error)) => debug!(port, attempt, %error, "ready connection failed"),
            Err(_) => debug!(port, attempt, "ready connection timed out"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(RETRY_DELAY).await;
        }
    }
    warn!(
        port,
        attempts = ATTEMPTS,
        "could not report readiness to the host"
    );
}

async fn send_once(port: u32, frame: &[u8]) -> io::Result<()> {
    let mut stream = VsockStream::connect(VsockAddr::new(HOST_CID, port)).await?;
    stream.write_all(frame).await?;
    stream.flush().await?;
    AsyncWriteExt::shutdown(&mut stream).await
}
