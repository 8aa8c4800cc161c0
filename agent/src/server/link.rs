//! Serving the link (see `sandbox_protocol::link`): every channel a host client opens
//! becomes one ordinary connection, served by [`connection::serve`] on the channel
//! itself (a `ChannelStream`), so the protocol, the handshake, admission and cancellation are exactly those
//! of a Unix or vsock connection.
//!
//! Two kinds of stream carry a link:
//! - the guest's virtio-serial port ([`serve_port`]), for snapshot-capable VMs: opened
//!   once and served forever; a read of 0 means no host is connected right now, so the
//!   session ends and the agent waits for the next host's `Attach`;
//! - a Unix socket a host relay connects to ([`serve_link_listener`]), for
//!   development and tests on the host: one relay at a time, each connection a
//!   session.

use std::sync::Arc;
use std::time::Duration;

use sandbox_protocol::link::mux::{write_loop, Channels, Delivery, LinkReader, Outbox};
use sandbox_protocol::link::{LinkFrame, LinkItem};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;

use super::connection::{self, Admissions};
use super::serial::SerialPort;
use crate::agent::Agent;
use crate::ready::ready_message;

/// What a read of 0 bytes means on this stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The end of the stream: the session and the stream are over.
    Final,
    /// No host is connected now (a virtio-serial port): wait for the next one.
    HostGone,
}

/// Serves the link on a virtio-serial port forever.
pub async fn serve_port(port: SerialPort, agent: Arc<Agent>, admissions: Admissions) {
    tracing::info!(port = %port.path().display(), "serving the link");
    let (read, write) = tokio::io::split(port);
    serve_stream(read, write, &agent, &admissions, Ending::HostGone).await;
}

/// Serves the link to one relay at a time on a Unix socket.
pub async fn serve_link_listener(
    listener: UnixListener,
    agent: Arc<Agent>,
    admissions: Admissions,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (read, write) = stream.into_split();
                serve_stream(read, write, &agent, &admissions, Ending::Final).await;
            }
            Err(error) => {
                tracing::warn!(%error, "link accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Runs sessions over one stream until it ends for good.
async fn serve_stream<R, W>(
    read: R,
    write: W,
    agent: &Arc<Agent>,
    admissions: &Admissions,
    ending: Ending,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbox, rx) = Outbox::new();
    let channels = Channels::new(outbox.clone());
    let writer_outbox = outbox.clone();
    let mut writer = tokio::spawn(async move { write_loop(write, rx, &writer_outbox).await });
    let mut reader = LinkReader::new(read);
    let mut session = Session {
        channels: &channels,
        agent,
        admissions,
        attached: None,
        at_marker: false,
    };
    loop {
        let item = tokio::select! {
            item = reader.next() => item,
            result = &mut writer => {
                tracing::warn!(?result, "link writer ended");
                break;
            }
        };
        match item {
            Ok(Some(item)) => session.handle(item).await,
            Ok(None) if ending == Ending::HostGone => {
                session.end("the host disconnected");
                reader.hunt();
            }
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(%error, "link read failed");
                session.end("a read failed");
                if ending == Ending::Final {
                    break;
                }
                reader.hunt();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    session.end("the stream ended");
    writer.abort();
}

/// One stream's session state.
struct Session<'a> {
    channels: &'a Arc<Channels>,
    agent: &'a Arc<Agent>,
    admissions: &'a Admissions,
    /// The nonce of the `Attach` answered, while no desync happened since.
    attached: Option<u64>,
    /// The last item was the session marker.
    at_marker: bool,
}

impl Session<'_> {
    async fn handle(&mut self, item: LinkItem) {
        let after_marker = std::mem::take(&mut self.at_marker);
        let frame = match item {
            LinkItem::Sync => {
                self.at_marker = true;
                return;
            }
            LinkItem::Desync => {
                self.end("the link lost frame sync");
                return;
            }
            LinkItem::Frame(frame) => frame,
        };
        match frame {
            // The same host trying again (its retries may queue up while the guest
            // boots): the session it has stands.
            LinkFrame::Attach { session } if after_marker && self.attached == Some(session) => {}
            LinkFrame::Attach { session } if after_marker => {
                self.end("a host attached");
                let attached = LinkFrame::Attached {
                    session,
                    ready: ready_message(self.agent.boot_id.clone()),
                };
                self.channels.outbox().start_session(&attached, 0).await;
                self.attached = Some(session);
                tracing::info!("link session started");
            }
            _ if self.attached.is_none() => {}
            LinkFrame::Open { channel } => self.open(channel).await,
            LinkFrame::Network { egress: true } => {
                self.agent.egress.enable(self.channels.clone());
                // Sessions started before (a template's warm ones) get the proxy
                // variables with a reseed (see `session::driver::reseed_message`).
                let sessions = self.agent.sessions.clone();
                tokio::spawn(async move { crate::session::warm::reseed_all(&sessions).await });
            }
            LinkFrame::Network { egress: false } => self.agent.egress.disable(),
            LinkFrame::Dialed { channel, outcome } => {
                self.agent.egress.dialed(channel, outcome).await;
            }
            frame => {
                if self.channels.deliver(frame) == Delivery::Violation {
                    tracing::warn!("the host broke a channel's flow control: channel closed");
                }
            }
        }
    }

    async fn open(&self, channel: u32) {
        match self.channels.open(channel) {
            Ok(opened) => {
                tokio::spawn(connection::serve(
                    opened.into_stream(),
                    self.agent.clone(),
                    self.admissions.clone(),
                ));
            }
            Err(error) => {
                tracing::warn!(%error, "channel refused");
                let outbox = self.channels.outbox();
                outbox
                    .send(outbox.session(), &LinkFrame::Close { channel })
                    .await;
            }
        }
    }

    /// Ends the session, if any: every channel closes, as if its client had gone.
    fn end(&mut self, why: &str) {
        if self.attached.is_some() || !self.channels.is_empty() {
            tracing::info!(channels = self.channels.len(), "link session ended: {why}");
        }
        self.attached = None;
        self.agent.egress.disable();
        self.channels.reset();
    }
}
