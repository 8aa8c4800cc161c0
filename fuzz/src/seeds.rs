//! Valid messages of every kind, from which `examples/seeds.rs` writes the committed
//! corpus: the fuzzer starts from inputs that reach deep into each decoder instead of
//! having to discover the wire format byte by byte.

use sandbox_protocol::{
    AgentFrame, AgentInfo, AgentMsg, ClientFrame, ClientMsg, Command, DirEntry, ErrorKind, Event,
    ExecReply, ExecRequest, ExitStatus, FileKind, FileStat, Hello, HelloReply, KillRequest,
    LogsBatch, LogsReply, LogsRequest, MkdirRequest, OutputChunk, PathRequest, Pid, ProcessInfo,
    PortForwardRequest, ProcessKind, ProcessSpec, ProcessState, PtyInputRequest, PtyOpenRequest, PtyResizeRequest,
    PutRequest, ReidentifyRequest, RemoveRequest, RenameRequest, Reply, Request, RequestId,
    ResumedRequest, ShutdownRequest, SpawnRequest, Stream, User, WindowSize, WireError,
    WriteFileRequest, PROTOCOL_VERSION,
};

fn path(path: &str) -> Vec<u8> {
    path.as_bytes().to_vec()
}

fn spec() -> ProcessSpec {
    ProcessSpec {
        command: Some(Command::Argv(vec!["echo".into(), "hi".into()])),
        env: vec![("A".into(), "1".into())],
        cwd: Some("/tmp".into()),
        user: Some(User::Uid(1000)),
    }
}

/// One request of every kind, named.
pub fn requests() -> Vec<(&'static str, Request)> {
    let size = WindowSize { rows: 24, cols: 80 };
    let exec = ExecRequest {
        spec: ProcessSpec::new(Command::Shell("echo hi".into())),
        stdin: b"in".to_vec(),
        timeout_ms: Some(1000),
        stream: true,
    };
    let requests = vec![
        Request::Exec(exec),
        Request::Spawn(SpawnRequest { spec: spec() }),
        Request::Logs(LogsRequest {
            pid: Pid(7),
            cursor: Some(3),
            follow: true,
        }),
        Request::Ps,
        Request::Kill(KillRequest {
            pid: Pid(7),
            signal: 15,
        }),
        Request::PtyOpen(PtyOpenRequest {
            spec: ProcessSpec {
                command: None,
                user: Some(User::Name("root".into())),
                ..spec()
            },
            size,
        }),
        Request::PtyInput(PtyInputRequest {
            pid: Pid(7),
            data: b"ls\n".to_vec(),
        }),
        Request::PtyResize(PtyResizeRequest { pid: Pid(7), size }),
        Request::Info,
        Request::PsDetail,
        Request::Confinement,
        Request::WriteFile(WriteFileRequest {
            path: path("/a/f"),
            data: b"hello".to_vec(),
            mode: Some(0o600),
        }),
        Request::ReadFile(PathRequest { path: path("/a/f") }),
        Request::ListDir(PathRequest { path: path("/a") }),
        Request::Stat(PathRequest { path: path("/a/f") }),
        Request::Mkdir(MkdirRequest {
            path: path("/a/b/c"),
            parents: true,
            mode: None,
        }),
        Request::Remove(RemoveRequest {
            path: path("/a"),
            recursive: true,
        }),
        Request::Rename(RenameRequest {
            from: path("/a/f"),
            to: path("/a/g"),
        }),
        Request::Put(PutRequest {
            path: path("/a/p"),
            mode: Some(0o755),
        }),
        Request::Get(PathRequest { path: path("/a/p") }),
        Request::Resumed(ResumedRequest {
            wall_clock_ns: 1_700_000_000_000_000_000,
            entropy: vec![1, 2, 3, 4],
            new_identity: true,
        }),
        Request::Shutdown(ShutdownRequest { reboot: false }),
        // Last, so the ids of the seeds before it stay as committed.
        Request::Reidentify(ReidentifyRequest {
            hostname: Some("fork-1".into()),
            token: Some("fresh".into()),
        }),
        Request::PortForward(PortForwardRequest { port: 8000 }),
    ];
    requests.into_iter().map(|r| (r.name(), r)).collect()
}

/// Client frames of every kind: a request of each kind and the other messages.
pub fn client_frames() -> Vec<(String, ClientFrame)> {
    let frame = |id: u64, msg: ClientMsg| ClientFrame {
        id: RequestId(id),
        msg,
    };
    let mut out = vec![
        (
            "hello".to_owned(),
            frame(0, ClientMsg::Hello(Hello::new(Some("secret".into())))),
        ),
        ("cancel".to_owned(), frame(3, ClientMsg::Cancel)),
        (
            "data".to_owned(),
            frame(3, ClientMsg::Data(b"chunk".to_vec())),
        ),
        ("data_end".to_owned(), frame(3, ClientMsg::DataEnd)),
        ("consumed".to_owned(), frame(3, ClientMsg::Consumed(4096))),
    ];
    for (i, (name, request)) in (1..).zip(requests()) {
        out.push((
            format!("request_{name}"),
            frame(i, ClientMsg::Request(request)),
        ));
    }
    out
}

/// Agent frames of every kind: the hello reply, each event, each reply, an error.
pub fn agent_frames() -> Vec<(String, AgentFrame)> {
    let exit = ExitStatus {
        code: Some(0),
        signal: None,
    };
    let chunk = OutputChunk {
        stream: Stream::Stdout,
        offset: 0,
        data: b"out".to_vec(),
    };
    let batch = LogsBatch {
        chunks: vec![chunk.clone()],
        dropped: 1,
        end: 4,
    };
    let info = AgentInfo {
        agent_version: "0.1.0".into(),
        protocol_version: PROTOCOL_VERSION,
        boot_id: "boot".into(),
        is_init: true,
        uptime_ms: 5,
        generation: 1,
        load: [0.5, 0.25, 0.125],
        mem_total_bytes: 1 << 29,
        mem_available_bytes: 1 << 28,
        processes_running: 1,
        processes_exited: 2,
    };
    let messages = vec![
        (
            "hello",
            AgentMsg::Hello(HelloReply {
                version: PROTOCOL_VERSION,
                agent_version: "0.1.0".into(),
                boot_id: "boot".into(),
                capabilities: vec!["exec".into(), "pty".into()],
            }),
        ),
        ("event_started", AgentMsg::Event(Event::Started(Pid(42)))),
        ("event_output", AgentMsg::Event(Event::Output(chunk))),
        ("event_logs", AgentMsg::Event(Event::Logs(batch.clone()))),
        ("event_data", AgentMsg::Event(Event::Data(b"data".to_vec()))),
        ("event_acked", AgentMsg::Event(Event::Acked(5))),
        (
            "reply_exec",
            AgentMsg::Reply(Reply::Exec(ExecReply {
                pid: Pid(42),
                stdout: b"hi\n".to_vec(),
                stderr: vec![],
                stdout_truncated: false,
                stderr_truncated: true,
                exit: Some(exit),
                timed_out: false,
                duration_us: 10,
            })),
        ),
        ("reply_spawned", AgentMsg::Reply(Reply::Spawned(Pid(43)))),
        (
            "reply_logs",
            AgentMsg::Reply(Reply::Logs(LogsReply {
                batch,
                exit: Some(exit),
            })),
        ),
        (
            "reply_ps",
            AgentMsg::Reply(Reply::Ps(vec![ProcessInfo {
                pid: Pid(42),
                kind: ProcessKind::Spawn,
                argv: vec!["sleep".into(), "1".into()],
                state: ProcessState::Exited(exit),
                started_at_ms: 1,
                ended_at_ms: Some(2),
            }])),
        ),
        ("reply_done", AgentMsg::Reply(Reply::Done)),
        (
            "reply_pty_opened",
            AgentMsg::Reply(Reply::PtyOpened(Pid(44))),
        ),
        ("reply_info", AgentMsg::Reply(Reply::Info(info))),
        (
            "reply_file",
            AgentMsg::Reply(Reply::File(b"content".to_vec())),
        ),
        (
            "reply_dir",
            AgentMsg::Reply(Reply::Dir(vec![DirEntry {
                name: b"f".to_vec(),
                kind: FileKind::File,
                size: 5,
            }])),
        ),
        (
            "reply_stat",
            AgentMsg::Reply(Reply::Stat(FileStat {
                kind: FileKind::Symlink,
                size: 5,
                mode: 0o777,
                uid: 0,
                gid: 0,
                modified_ms: -1,
                symlink_target: Some(b"/target".to_vec()),
            })),
        ),
        (
            "reply_transferred",
            AgentMsg::Reply(Reply::Transferred {
                bytes: 5,
                mode: 0o644,
            }),
        ),
        (
            "error",
            AgentMsg::Error(WireError::new(ErrorKind::NotFound, "no such process")),
        ),
    ];
    messages
        .into_iter()
        .map(|(name, msg)| {
            let id = if name == "hello" { 0 } else { 1 };
            (
                name.to_owned(),
                AgentFrame {
                    id: RequestId(id),
                    msg,
                },
            )
        })
        .collect()
}

/// A script for `agent_dispatch` that touches every file request in turn: each
/// request is a postcard body, and a put's data follows it as a postcard byte vector.
pub fn dispatch_script() -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |request: Request| {
        let is_put = matches!(request, Request::Put(_));
        out.extend(postcard::to_allocvec(&request).expect("encoding a seed"));
        if is_put {
            out.extend(postcard::to_allocvec(&b"put data".to_vec()).expect("encoding a seed"));
        }
    };
    push(Request::Mkdir(MkdirRequest {
        path: path("/a/b"),
        parents: true,
        mode: None,
    }));
    for (_, request) in requests() {
        push(request);
    }
    out
}
