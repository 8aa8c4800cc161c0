//! Limits every side agrees on. Units are in the names.

use std::time::Duration;

/// Largest frame body (after the 4-byte length prefix) either side accepts.
/// Sized to carry one exec reply with both streams at their cap plus headroom.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Largest frame accepted before the handshake: a `Hello` is a few dozen bytes, and a
/// peer that has not proven it holds the token gets no large buffer.
pub const HELLO_FRAME_BYTES: usize = 4 * 1024;

/// Longest agent token `reidentify` accepts: every client must still be able to
/// present it in a `Hello` of at most [`HELLO_FRAME_BYTES`], or none could connect.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Requests one connection may have in flight (from its frame until its final frame
/// is queued for writing). The agent answers `Busy` beyond it; the host client waits
/// for a slot instead, so a well-behaved client never sees that error. With replies
/// of at most a few MiB this bounds what one connection can make the agent hold.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 32;

/// Connections the agent serves at once. A newcomer past it replaces the oldest idle
/// connection (which is told why), or is refused with `Busy` when every connection
/// has a request in flight: a pile of idle connections never locks a client out.
pub const MAX_CONNECTIONS: usize = 128;

/// Event payload bytes (exec output, log chunks, `get` data) the agent sends on one
/// request beyond what the client reported consumed (`ClientMsg::Consumed`).
pub const STREAM_WINDOW_BYTES: u64 = 4 * 1024 * 1024;

/// The `Hello` capability of an agent that applies [`STREAM_WINDOW_BYTES`] and so
/// understands `ClientMsg::Consumed`; a client sends that message only to such an
/// agent (an older one would take it for a broken frame of the stream).
pub const STREAM_WINDOW_CAPABILITY: &str = "stream_window";

/// The client reports consumption at least every this many bytes; well under the
/// window, so the agent never waits on bytes the client has already used.
pub const CONSUMED_REPORT_BYTES: u64 = 1024 * 1024;

/// Output ring kept per spawned process (and per pty, and per exec).
pub const RING_BYTES: usize = 256 * 1024;

/// An exec reply keeps at most this much of each of stdout and stderr.
pub const EXEC_OUTPUT_CAP_BYTES: usize = 1024 * 1024;

/// `read_file` refuses regular files larger than this.
pub const READ_FILE_CAP_BYTES: u64 = 1024 * 1024;

/// Largest `Data` chunk a `put` or `get` sends in one frame.
pub const FILE_CHUNK_BYTES: usize = 1024 * 1024;

/// Bytes a `put` client may send beyond the agent's last `Acked` count.
pub const PUT_WINDOW_BYTES: u64 = 8 * 1024 * 1024;

/// Default and maximum exec deadline.
pub const EXEC_DEADLINE_SECS: u64 = 5 * 60;

/// How long the agent may take past an exec deadline to reply with what it collected.
pub const EXEC_DEADLINE_GRACE_SECS: u64 = 5;

/// Exited processes are forgotten this long after they exit.
pub const FORGET_EXITED_AFTER_SECS: u64 = 5 * 60;

/// Default vsock port the agent listens on.
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// Default vsock port on the host that the agent reports readiness to.
pub const READY_VSOCK_PORT: u32 = 1025;

/// The host's vsock CID, the only peer a guest agent accepts by default.
pub const HOST_CID: u32 = 2;

/// [`EXEC_DEADLINE_SECS`] as a [`Duration`].
pub const EXEC_DEADLINE: Duration = Duration::from_secs(EXEC_DEADLINE_SECS);
