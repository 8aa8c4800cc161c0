//! The relay: one per snapshot-capable VM, on the host. It owns the VM's single
//! agent stream (QEMU's virtio-serial chardev, or an agent's `link+unix://` socket in
//! development) and serves any number of clients on a Unix socket in the VM's run
//! folder, each client one channel of the link (`sandbox_protocol::link`). A client
//! sees an ordinary `unix://` agent connection: its own `Hello`, its own requests,
//! and its disconnect cancels its execs.
//!
//! # A relay's life
//! 1. Connect to the agent stream (retrying while QEMU creates its socket).
//! 2. Send the session marker and `Attach` with a random nonce, again (after zero
//!    padding that completes any half frame a restored agent holds) with backoff
//!    until the agent answers `Attached` with that nonce. Everything read before it
//!    belongs to an older session and is skipped.
//! 3. Report the agent's `Ready` once ([`run`]'s `on_ready`), then accept clients;
//!    each gets a channel. A client that goes quiet stalls only its channel.
//! 4. Lost frame sync after attaching: every client is dropped and the relay attaches
//!    again. The agent stream ending (QEMU exited) ends the relay.
//!
//! With `net: egress` ([`RelayConfig::egress`]) the relay also answers the agent's
//! `Dial`s: it checks the allowlist, dials, carries the connection as the agent's
//! channel and logs it ([`crate::egress`]); without, every `Dial` is refused.
//!
//! The guest is hostile: whatever it sends is bounded by the link's frame cap and
//! each channel's window, and a frame that breaks either closes a channel or the
//! session, never the relay.

mod egress;
pub mod log;

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::link::egress::EGRESS_CHANNEL_BIT;
use sandbox_protocol::link::mux::{write_loop, Channels, LinkReader, Outbox};
use sandbox_protocol::link::{ChannelId, LinkFrame, LinkItem, ATTACH_PADDING_BYTES};
use sandbox_protocol::Ready;
use tokio::net::{UnixListener, UnixStream};

/// The first wait for `Attached` before trying again; it doubles up to
/// [`ATTACH_RETRY_MAX`]. A booting agent takes a second or two to answer.
pub const ATTACH_RETRY_FIRST: Duration = Duration::from_millis(500);

/// The longest wait between two `Attach` attempts.
pub const ATTACH_RETRY_MAX: Duration = Duration::from_secs(4);

/// How long a frame from the guest may stop arriving half-way before the relay gives
/// it up and attaches again. The agent writes each frame (at most 32 KiB) whole, so
/// its bytes arrive together; only a guest writing into the agent's port by itself
/// leaves a frame unfinished.
pub const FRAME_STALL: Duration = Duration::from_secs(5);

/// Where the relay connects and listens.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The agent stream: a Unix socket to connect to.
    pub agent: PathBuf,
    /// Where clients connect (created with mode 0600; a stale socket is replaced).
    pub listen: PathBuf,
    /// How long to retry connecting to `agent`.
    pub connect_timeout: Duration,
    /// `Some`: the VM has egress under this policy (`net: egress`); `None`: no route.
    pub egress: Option<crate::egress::EgressConfig>,
    /// `Some((socket, log))`: copy QEMU's console from `socket` into `log`, rotated
    /// at [`log::CONSOLE_LOG_MAX_BYTES`] (one old file kept).
    pub console: Option<(PathBuf, PathBuf)>,
}

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The agent stream could not be reached in time.
    #[error("Cannot connect to the agent stream at {}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The last error.
        #[source]
        error: io::Error,
    },
    /// The client socket could not be created.
    #[error("Cannot listen on {}", path.display())]
    Listen {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        error: io::Error,
    },
    /// Reading the agent stream failed.
    #[error("Reading the agent stream failed")]
    Read(#[source] io::Error),
    /// Writing the agent stream failed.
    #[error("Writing the agent stream failed")]
    Write(#[source] io::Error),
}

/// Runs the relay until the agent stream ends; `on_ready` gets the agent's `Ready`
/// from the first `Attached`.
pub async fn run(config: &RelayConfig, on_ready: impl FnOnce(&Ready)) -> Result<(), RelayError> {
    let console = config.console.clone().map(|(socket, log)| {
        let timeout = config.connect_timeout;
        tokio::spawn(async move { copy_console(&socket, &log, timeout).await })
    });
    let stream = connect(&config.agent, config.connect_timeout).await?;
    let listener = listen(&config.listen)?;
    let egress = egress::Egress::new(config.egress.as_ref());
    let result = relay(stream, &listener, &egress, on_ready).await;
    let _ = std::fs::remove_file(&config.listen);
    // QEMU closes the console with the agent stream as it exits: the console's last
    // lines (`reboot: Power down`, a panic's end, which post-mortems read) may still
    // be in its socket. Ending the process now would drop them.
    if let Some(console) = console {
        if tokio::time::timeout(CONSOLE_DRAIN, console).await.is_err() {
            tracing::warn!(
                "the console did not end with the agent stream; its tail may be missing"
            );
        }
    }
    result
}

/// How long the relay, its agent stream ended, waits for the console to end too.
const CONSOLE_DRAIN: Duration = Duration::from_secs(2);

async fn connect(path: &Path, timeout: Duration) -> Result<UnixStream, RelayError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match UnixStream::connect(path).await {
            Ok(stream) => return Ok(stream),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(RelayError::Connect {
                    path: path.to_owned(),
                    error,
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Copies the console from QEMU's socket into its bounded log until QEMU closes it.
async fn copy_console(socket: &Path, log: &Path, timeout: Duration) {
    use std::io::Write;
    use tokio::io::AsyncReadExt;
    let mut file = match log::RotatingLog::open(log, log::CONSOLE_LOG_MAX_BYTES, false) {
        Ok(file) => file,
        Err(error) => {
            tracing::warn!(%error, "cannot open the console log; the console is dropped");
            return;
        }
    };
    let mut stream = match connect(socket, timeout).await {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(error = %crate::error_chain(&error), "no console");
            return;
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 || file.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

fn listen(path: &Path) -> Result<UnixListener, RelayError> {
    let failed = |error| RelayError::Listen {
        path: path.to_owned(),
        error,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(failed(error)),
    }
    let listener = UnixListener::bind(path).map_err(failed)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    Ok(listener)
}

/// The session loop over one connected agent stream.
async fn relay(
    stream: UnixStream,
    listener: &UnixListener,
    egress: &egress::Egress,
    on_ready: impl FnOnce(&Ready),
) -> Result<(), RelayError> {
    let (read, write) = stream.into_split();
    let (outbox, rx) = Outbox::new();
    let channels = Channels::new(outbox.clone());
    let writer_outbox = outbox.clone();
    let mut writer = tokio::spawn(async move { write_loop(write, rx, &writer_outbox).await });
    let mut reader = LinkReader::new(read).with_stall_timeout(FRAME_STALL);
    let mut on_ready = Some(on_ready);
    let mut state = Attaching::new();
    outbox
        .start_session(
            &LinkFrame::Attach {
                session: state.nonce,
            },
            0,
        )
        .await;
    let mut next_channel: ChannelId = 0;
    let mut at_marker = false;
    // A guest can break the framing as often as it likes: one warning a minute, with
    // the count of the others.
    let mut desyncs = log::Summary::new(log::WARN_WINDOW);
    let mut attaches = log::Summary::new(log::WARN_WINDOW);
    loop {
        tokio::select! {
            item = reader.next() => {
                let item = match item {
                    Ok(Some(item)) => item,
                    Ok(None) => return Ok(()),
                    Err(error) => return Err(RelayError::Read(error)),
                };
                let after_marker = std::mem::take(&mut at_marker);
                match item {
                    LinkItem::Sync => at_marker = true,
                    LinkItem::Desync if state.attached => {
                        if let Some(held_back) = desyncs.event(std::time::Instant::now()) {
                            tracing::warn!(clients = channels.len(), earlier_unlogged = held_back, "the link lost frame sync: dropping every client and attaching again (logged once a minute)");
                        }
                        channels.reset();
                        state = Attaching::new();
                        outbox.start_session(&LinkFrame::Attach { session: state.nonce }, ATTACH_PADDING_BYTES).await;
                    }
                    LinkItem::Desync => {}
                    LinkItem::Frame(LinkFrame::Attached { session, ready }) if after_marker && !state.attached && session == state.nonce => {
                        state.attached = true;
                        if let Some(held_back) = attaches.event(std::time::Instant::now()) {
                            tracing::info!(agent_version = %ready.agent_version, egress = egress.enabled(), earlier_unlogged = held_back, "agent attached");
                        }
                        // Before any client's `Open`: the agent sets up its proxy (and the
                        // variables of the processes clients start) first.
                        if egress.enabled() {
                            outbox.send(outbox.session(), &LinkFrame::Network { egress: true }).await;
                        }
                        if let Some(on_ready) = on_ready.take() {
                            on_ready(&ready);
                        }
                    }
                    LinkItem::Frame(LinkFrame::Dial { channel, host, port }) if state.attached => {
                        egress.dial(&channels, channel, host, port).await;
                    }
                    LinkItem::Frame(LinkFrame::ProxyRefused { note }) if state.attached => {
                        egress.proxy_refused(&note);
                    }
                    LinkItem::Frame(frame) if state.attached => {
                        let _ = channels.deliver(frame);
                    }
                    LinkItem::Frame(_) => {}
                }
            }
            () = tokio::time::sleep_until(state.next_try), if !state.attached => {
                state.back_off();
                tracing::debug!("no Attached yet: attaching again");
                outbox.start_session(&LinkFrame::Attach { session: state.nonce }, ATTACH_PADDING_BYTES).await;
            }
            accepted = listener.accept(), if state.attached => match accepted {
                Ok((client, _)) => {
                    // Below the agent's egress numbers.
                    next_channel = (next_channel.wrapping_add(1) & !EGRESS_CHANNEL_BIT).max(1);
                    open_channel(&channels, next_channel, client).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            result = &mut writer => {
                return match result {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(RelayError::Write(error)),
                    Err(join) => Err(RelayError::Write(io::Error::other(join))),
                };
            }
        }
    }
}

/// Gives `client` a channel; refused (closed at once) when the session is full.
async fn open_channel(channels: &Arc<Channels>, id: ChannelId, client: UnixStream) {
    match channels.open(id) {
        Ok(channel) => {
            let outbox = channels.outbox();
            outbox
                .send(outbox.session(), &LinkFrame::Open { channel: id })
                .await;
            tokio::spawn(channel.splice(client));
        }
        Err(error) => tracing::warn!(%error, "client refused"),
    }
}

/// Waiting for (or holding) an `Attached`.
#[derive(Debug)]
struct Attaching {
    nonce: u64,
    attached: bool,
    retry: Duration,
    /// When to try again: a deadline, so that traffic read meanwhile (a guest's
    /// leftovers) cannot keep postponing it.
    next_try: tokio::time::Instant,
}

impl Attaching {
    fn new() -> Self {
        Self {
            nonce: random_nonce(),
            attached: false,
            retry: ATTACH_RETRY_FIRST,
            next_try: tokio::time::Instant::now() + ATTACH_RETRY_FIRST,
        }
    }

    fn back_off(&mut self) {
        self.retry = (self.retry * 2).min(ATTACH_RETRY_MAX);
        self.next_try = tokio::time::Instant::now() + self.retry;
    }
}

/// A nonce no other host end of this VM will pick: from the kernel's CSPRNG, falling
/// back to the clock and pid (uniqueness, not secrecy, is what matters).
fn random_nonce() -> u64 {
    let mut bytes = [0u8; 8];
    if crate::launcher::run_dir::random_bytes(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos) ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::link::mux::LinkReader;
    use sandbox_protocol::link::{encode_session_start, LinkItem};
    use tokio::io::AsyncWriteExt;

    /// The next frame from the relay, skipping markers (panics after 60 s).
    async fn next_frame(reader: &mut LinkReader<tokio::net::unix::OwnedReadHalf>) -> LinkFrame {
        let wait = async {
            loop {
                match reader.next().await.unwrap() {
                    Some(LinkItem::Frame(frame)) => return frame,
                    Some(_) => {}
                    None => panic!("the relay closed the link"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("no frame from the relay within 60 s")
    }

    /// Regression (issue 22, item 7): a guest that writes the start of a 32 KiB link
    /// frame and never finishes it wedged the relay: every later client timed out.
    /// Now the relay gives the frame up and attaches again, and serves clients.
    #[tokio::test]
    async fn a_frame_that_stalls_mid_body_makes_the_relay_attach_again() {
        let dir = tempfile::tempdir().unwrap();
        let agent_path = dir.path().join("agent-link.sock");
        let agent = UnixListener::bind(&agent_path).unwrap();
        let config = RelayConfig {
            agent: agent_path,
            listen: dir.path().join("agent.sock"),
            connect_timeout: Duration::from_secs(10),
            egress: None,
            console: None,
        };
        let relay = tokio::spawn(async move { run(&config, |_| {}).await });
        let (stream, _) = agent.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut reader = LinkReader::new(read);
        let ready = Ready {
            magic: sandbox_protocol::MAGIC,
            version: sandbox_protocol::PROTOCOL_VERSION,
            agent_version: "test".into(),
            boot_id: "b".into(),
            uptime_ms: 1,
        };
        let attach = |frame: LinkFrame| {
            let LinkFrame::Attach { session } = frame else {
                panic!("expected Attach, got {frame:?}");
            };
            let mut out = Vec::new();
            encode_session_start(
                &LinkFrame::Attached {
                    session,
                    ready: ready.clone(),
                },
                &mut out,
            )
            .unwrap();
            out
        };
        let attached = attach(next_frame(&mut reader).await);
        write.write_all(&attached).await.unwrap();
        // Half a frame: a 32 KiB length and a few bytes of body, then nothing.
        let mut half = u32::try_from(32 * 1024).unwrap().to_le_bytes().to_vec();
        half.extend_from_slice(&[7; 100]);
        write.write_all(&half).await.unwrap();
        // The relay gives it up and attaches again (a repeated Attach first comes
        // only if the first was not answered: this one is the resync).
        let again = attach(next_frame(&mut reader).await);
        write.write_all(&again).await.unwrap();
        // And a client is served: its channel opens on the link.
        let _client = UnixStream::connect(dir.path().join("agent.sock"))
            .await
            .unwrap();
        assert!(
            matches!(next_frame(&mut reader).await, LinkFrame::Open { .. }),
            "the client's channel did not open"
        );
        relay.abort();
    }
}
