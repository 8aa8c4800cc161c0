//! The sandbox wire protocol: types and framing shared by the in-guest agent, the
//! host client and every tool built on them. This crate does no I/O of its own
//! (the optional `tokio` feature adds a frame reader and writer over any byte stream).
//!
//! # Layout
//! - [`frame`]: `u32` little-endian length + postcard body; strict, incremental decoding.
//! - [`message`]: the envelope. Every frame carries a [`RequestId`], so many requests
//!   run at once over one ordered byte stream (a Unix socket, a vsock stream, or a
//!   virtio-serial port that admits a single host connection) and streams of events
//!   never block other requests.
//! - [`hello`]: the handshake that opens every connection.
//! - [`process`], [`output`]: exec, spawn, pty, ps, kill and logs.
//! - [`files`]: whole-file and streamed file transfer, directories.
//! - [`eval`]: interpreter sessions whose state persists between calls.
//! - [`port`]: a host-to-guest TCP connection to a guest port (the mirror of egress).
//! - [`wait`]: waiting until a file or a process's output contains a string.
//! - [`image`]: the defaults a template bakes in for the agent.
//! - [`machine`]: requests about the whole guest: `info`, `resumed`, `reidentify`,
//!   `shutdown`.
//! - [`error`]: errors as a typed kind, a message and an errno.
//! - [`limits`]: sizes and deadlines every side agrees on.
//! - [`link`]: many connections as channels over one stream that cannot be reopened
//!   (a virtio-serial port), for VMs that are snapshotted.
//!
//! # A connection
//! 1. The client sends `ClientMsg::Hello` with id 0; the agent answers `AgentMsg::Hello`,
//!    or an `Error` (`VersionMismatch`, `Unauthorized`, `BadRequest`) and closes.
//! 2. The client sends `ClientMsg::Request`s under fresh non-zero ids. The agent answers
//!    each with zero or more `Event`s, then one `Reply` or `Error`.
//! 3. `ClientMsg::Cancel` with a request's id stops it; it still gets a final frame.
//!    `ClientMsg::Consumed` reports how much of a stream's payload the client has
//!    used; the agent keeps at most `STREAM_WINDOW_BYTES` unreported in flight.
//! 4. A frame that cannot be decoded gets an `Error` under its id (or id 0 when even
//!    the id is unreadable) and the connection goes on.
//!
//! # Evolution
//! postcard encodes enums by variant index and structs by field order, without names.
//! So: **existing variants and fields never change, move or disappear; new request,
//! event, reply and error variants are appended at the end of their enum.** A new
//! field means a new variant carrying a new struct. An agent that meets a variant it
//! does not know answers `Unsupported`. [`hello::PROTOCOL_VERSION`] changes only for a
//! break, which the handshake reports. Tests in this file pin exact bytes, so an
//! accidental change breaks a test, not a deployed guest.

pub mod error;
pub mod eval;
pub mod files;
pub mod frame;
pub mod hello;
pub mod image;
pub mod limits;
pub mod link;
pub mod machine;
pub mod message;
pub mod output;
pub mod port;
pub mod process;
pub mod ready;
#[cfg(feature = "tokio")]
pub mod transport;
pub mod wait;

pub use error::{ErrorKind, WireError};
pub use eval::{
    is_valid_session_name, CloseSessionRequest, EvalException, EvalReply, EvalRequest, Language,
    SessionInfo, WarmSession,
};
pub use files::{
    DirEntry, FileKind, FileStat, MkdirRequest, PathRequest, PutRequest, RemoveRequest,
    RenameRequest, WriteFileRequest,
};
pub use hello::{tokens_equal, Hello, HelloReply, MAGIC, PROTOCOL_VERSION};
pub use image::ImageConfig;
pub use machine::{
    AgentInfo, Confinement, ConfinementMode, ReidentifyRequest, ResumedRequest, ShutdownRequest,
};
pub use message::{AgentFrame, AgentMsg, ClientFrame, ClientMsg, Event, Reply, Request, RequestId};
pub use output::{LogsBatch, LogsReply, LogsRequest, OutputChunk, Stream};
pub use port::PortForwardRequest;
pub use process::{
    Command, ExecReply, ExecRequest, ExitStatus, KillRequest, OomKill, Pid, ProcessDetail,
    ProcessInfo, ProcessKind, ProcessSpec, ProcessState, PtyInputRequest, PtyOpenRequest,
    PtyResizeRequest, SpawnRequest, User, WindowSize, MAX_SIGNAL,
};
pub use ready::Ready;
pub use wait::{TextFound, WaitForTextRequest, WaitTarget};

#[cfg(test)]
mod wire_tests {
    //! Exact bytes on the wire. If one of these fails, a type changed shape: that
    //! breaks every deployed guest. Append a new variant instead (see the crate docs).
    use super::*;
    use crate::frame::encode;
    use crate::limits::MAX_FRAME_BYTES;

    fn bytes<T: serde::Serialize>(msg: &T) -> Vec<u8> {
        encode(msg, MAX_FRAME_BYTES).unwrap()
    }

    #[test]
    fn consumed_bytes_are_pinned() {
        let consumed = ClientFrame {
            id: RequestId(3),
            msg: ClientMsg::Consumed(300),
        };
        assert_eq!(bytes(&consumed), [4, 0, 0, 0, 3, 5, 0xAC, 2]);
    }

    #[test]
    fn hello_bytes_are_pinned() {
        let hello = ClientFrame {
            id: RequestId(0),
            msg: ClientMsg::Hello(Hello::new(Some("t".into()))),
        };
        assert_eq!(
            bytes(&hello),
            [10, 0, 0, 0, 0, 0, b'S', b'B', b'X', b'1', 1, 1, 1, b't']
        );
    }

    #[test]
    fn exec_request_bytes_are_pinned() {
        let exec = ClientFrame {
            id: RequestId(300),
            msg: ClientMsg::Request(Request::Exec(ExecRequest {
                spec: ProcessSpec::new(Command::Shell("true".into())),
                stdin: vec![],
                timeout_ms: Some(1000),
                stream: false,
            })),
        };
        assert_eq!(
            bytes(&exec),
            [
                19, 0, 0, 0, 0xAC, 2, 1, 0, 1, 1, 4, b't', b'r', b'u', b'e', 0, 0, 0, 0, 1, 0xE8,
                7, 0
            ]
        );
    }

    #[test]
    fn machine_request_bytes_are_pinned() {
        // Guards the move of these types into `machine`: the variant indexes of
        // `Info` (8), `Resumed` (18) and `Shutdown` (19) and their fields must not move.
        let frame = |id, request| {
            bytes(&ClientFrame {
                id: RequestId(id),
                msg: ClientMsg::Request(request),
            })
        };
        assert_eq!(frame(1, Request::Info), [3, 0, 0, 0, 1, 1, 8]);
        let resumed = Request::Resumed(ResumedRequest {
            wall_clock_ns: 5,
            entropy: vec![9],
            new_identity: true,
        });
        assert_eq!(frame(2, resumed), [7, 0, 0, 0, 2, 1, 18, 5, 1, 9, 1]);
        let shutdown = Request::Shutdown(ShutdownRequest { reboot: true });
        assert_eq!(frame(3, shutdown), [4, 0, 0, 0, 3, 1, 19, 1]);
    }

    #[test]
    fn reidentify_bytes_are_pinned() {
        // Appended for fork children: request 22, answered with `Done` (4). Older
        // variants keep their indexes (the tests above and below).
        let frame = |id, request| {
            bytes(&ClientFrame {
                id: RequestId(id),
                msg: ClientMsg::Request(request),
            })
        };
        let both = Request::Reidentify(ReidentifyRequest {
            hostname: Some("h".into()),
            token: Some("t".into()),
        });
        assert_eq!(
            frame(4, both),
            [9, 0, 0, 0, 4, 1, 22, 1, 1, b'h', 1, 1, b't']
        );
        let neither = Request::Reidentify(ReidentifyRequest {
            hostname: None,
            token: None,
        });
        assert_eq!(frame(5, neither), [5, 0, 0, 0, 5, 1, 22, 0, 0]);
        let done = AgentFrame {
            id: RequestId(4),
            msg: AgentMsg::Reply(Reply::Done),
        };
        assert_eq!(bytes(&done), [3, 0, 0, 0, 4, 2, 4]);
    }

    #[test]
    fn reidentify_debug_hides_the_token() {
        let request = ReidentifyRequest {
            hostname: Some("box-2".into()),
            token: Some("hunter2".into()),
        };
        let shown = format!("{:?}", Request::Reidentify(request));
        assert!(shown.contains("box-2"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn the_longest_token_fits_in_a_hello() {
        use crate::limits::{HELLO_FRAME_BYTES, MAX_TOKEN_BYTES};
        let hello = ClientFrame {
            id: RequestId(0),
            msg: ClientMsg::Hello(Hello::new(Some("t".repeat(MAX_TOKEN_BYTES)))),
        };
        // The frame's body, without its 4-byte length prefix.
        assert!(bytes(&hello).len() - 4 <= HELLO_FRAME_BYTES);
    }

    #[test]
    fn port_forward_bytes_are_pinned() {
        // Appended for ports: request 26 (a varint port), and error kind 14.
        let open = ClientFrame {
            id: RequestId(1),
            msg: ClientMsg::Request(Request::PortForward(PortForwardRequest { port: 8000 })),
        };
        assert_eq!(bytes(&open), [5, 0, 0, 0, 1, 1, 26, 0xc0, 0x3e]);
        let refused = AgentFrame {
            id: RequestId(1),
            msg: AgentMsg::Error(WireError::new(ErrorKind::NotListening, "n")),
        };
        assert_eq!(bytes(&refused), [6, 0, 0, 0, 1, 3, 14, 1, b'n', 0]);
    }

    #[test]
    fn error_reply_bytes_are_pinned() {
        let err = AgentFrame {
            id: RequestId(2),
            msg: AgentMsg::Error(WireError {
                kind: ErrorKind::NotFound,
                message: "x".into(),
                errno: Some(3),
            }),
        };
        assert_eq!(bytes(&err), [7, 0, 0, 0, 2, 3, 1, 1, b'x', 1, 6]);
    }

    #[test]
    fn logs_event_bytes_are_pinned() {
        let event = AgentFrame {
            id: RequestId(4),
            msg: AgentMsg::Event(Event::Logs(LogsBatch {
                chunks: vec![OutputChunk {
                    stream: Stream::Stderr,
                    offset: 5,
                    data: b"hi".to_vec(),
                }],
                dropped: 0,
                end: 7,
            })),
        };
        assert_eq!(
            bytes(&event),
            [11, 0, 0, 0, 4, 1, 2, 1, 1, 5, 2, b'h', b'i', 0, 7]
        );
    }

    #[test]
    fn eval_and_wait_bytes_are_pinned() {
        // Appended for sessions and waiting: requests 23 to 25, replies 13 and 14,
        // process kind 3. Older variants keep their indexes (the tests above).
        let request = |id, request| {
            bytes(&ClientFrame {
                id: RequestId(id),
                msg: ClientMsg::Request(request),
            })
        };
        let eval = Request::Eval(EvalRequest {
            session: "s".into(),
            language: Language::Shell,
            code: "x".into(),
            timeout_ms: None,
            restart: true,
        });
        assert_eq!(
            request(1, eval),
            [10, 0, 0, 0, 1, 1, 23, 1, b's', 1, 1, b'x', 0, 1]
        );
        let close = Request::CloseSession(CloseSessionRequest {
            session: "s".into(),
        });
        assert_eq!(request(2, close), [5, 0, 0, 0, 2, 1, 24, 1, b's']);
        let wait = Request::WaitForText(WaitForTextRequest {
            target: WaitTarget::Output(Pid(7)),
            text: "ok".into(),
            timeout_ms: Some(5),
        });
        assert_eq!(
            request(3, wait),
            [10, 0, 0, 0, 3, 1, 25, 1, 14, 2, b'o', b'k', 1, 5]
        );
        let found = AgentFrame {
            id: RequestId(3),
            msg: AgentMsg::Reply(Reply::TextFound(TextFound {
                offset: 2,
                stream: Some(Stream::Stderr),
                line: "a".into(),
                waited_ms: 0,
            })),
        };
        assert_eq!(bytes(&found), [9, 0, 0, 0, 3, 2, 14, 2, 1, 1, 1, b'a', 0]);
        let reply = AgentFrame {
            id: RequestId(1),
            msg: AgentMsg::Reply(Reply::Eval(EvalReply {
                session: SessionInfo {
                    name: "s".into(),
                    language: Language::Python,
                    pid: Pid(9),
                    started: true,
                    evaluations: 1,
                },
                stdout: b"o".to_vec(),
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                value: Some("4".into()),
                value_truncated: false,
                exception: None,
                status: None,
                timed_out: false,
                died: None,
                duration_ms: 3,
            })),
        };
        assert_eq!(
            bytes(&reply),
            [
                23, 0, 0, 0, 1, 2, 13, 1, b's', 0, 18, 1, 1, 1, b'o', 0, 0, 0, 1, 1, b'4', 0, 0, 0,
                0, 0, 3
            ]
        );
        assert_eq!(ProcessKind::Session.as_str(), "session");
        assert_eq!(postcard::to_allocvec(&ProcessKind::Session).unwrap(), [3]);
    }

    #[test]
    fn confinement_bytes_are_pinned() {
        // Appended for cgroup confinement: requests 20 and 21, replies 11 and 12.
        // Older variants keep their indexes (the tests above).
        let request = |id, request| {
            bytes(&ClientFrame {
                id: RequestId(id),
                msg: ClientMsg::Request(request),
            })
        };
        assert_eq!(request(5, Request::PsDetail), [3, 0, 0, 0, 5, 1, 20]);
        assert_eq!(request(6, Request::Confinement), [3, 0, 0, 0, 6, 1, 21]);
        let oom = OomKill {
            pid: Pid(42),
            kills: 1,
            memory_max_bytes: Some(32 << 20),
        };
        let confinement = AgentFrame {
            id: RequestId(8),
            msg: AgentMsg::Reply(Reply::Confinement(Confinement {
                mode: ConfinementMode::Cgroups,
                agent_cgroup: Some("/a".into()),
                workload_cgroup: None,
                memory_max_bytes: Some(5),
                pids_max: None,
                reason: None,
            })),
        };
        assert_eq!(
            bytes(&confinement),
            [13, 0, 0, 0, 8, 2, 12, 1, 1, 2, b'/', b'a', 0, 1, 5, 0, 0]
        );
        let detail = AgentFrame {
            id: RequestId(9),
            msg: AgentMsg::Reply(Reply::PsDetail(vec![ProcessDetail {
                info: ProcessInfo {
                    pid: Pid(3),
                    kind: ProcessKind::Exec,
                    argv: vec!["x".into()],
                    state: ProcessState::Running,
                    started_at_ms: 1,
                    ended_at_ms: None,
                },
                cgroup: Some("/w".into()),
                live_pids: 2,
                oom: Some(oom),
            }])),
        };
        assert_eq!(
            bytes(&detail),
            [
                25, 0, 0, 0, 9, 2, 11, 1, 6, 0, 1, 1, b'x', 0, 1, 0, 1, 2, b'/', b'w', 2, 1, 84, 1,
                1, 0x80, 0x80, 0x80, 0x10
            ]
        );
        assert_eq!(
            oom.to_string(),
            "killed by the OOM killer (memory limit 32 MiB)"
        );
        let many = OomKill { kills: 3, ..oom };
        assert_eq!(
            many.to_string(),
            "killed by the OOM killer (3 processes, memory limit 32 MiB)"
        );
    }
}
