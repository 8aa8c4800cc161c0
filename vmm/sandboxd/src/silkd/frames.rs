//! The silkd wire format: one JSON object per line, `{"v":1,"op":...}` from the
//! client, `{"type":...}` from us, binary payloads as base64 `data` strings.
//!
//! No I/O here but the line reader, which owns its buffer, never holds more than
//! [`MAX_FRAME_BYTES`] of a line, and returns `Ok(None)` on a clean end of stream.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::{ErrorKind, MAX_FRAME_BYTES};

/// Client → node frames. Unknown fields are ignored (the SDK adds fields over
/// time); an op we do not know never reaches this type (see [`parse`]).
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Info,
    Exec(ExecReq),
    Ps,
    Kill {
        pid: i32,
        #[serde(default)]
        signal: Option<i32>,
    },
    Logs {
        pid: i32,
    },
    Attach {
        pid: i32,
    },
    Stdin {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    StdinClose,
    Data {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    DataEnd,
    FsWrite {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
    },
    FsRead {
        path: String,
    },
    FsList {
        path: String,
    },
    FsStat {
        path: String,
    },
    FsMkdir {
        path: String,
        #[serde(default)]
        parents: Option<bool>,
    },
    FsRm {
        path: String,
        #[serde(default)]
        recursive: Option<bool>,
    },
    FsRename {
        from: String,
        to: String,
    },
    FsPush {
        dest: String,
    },
    FsPull {
        path: String,
    },
    FsFind {
        path: String,
        pattern: String,
        #[serde(default)]
        glob: Option<String>,
    },
    FsReplace {
        files: Vec<String>,
        pattern: String,
        replacement: String,
    },
    FsWatch {
        path: String,
        #[serde(default)]
        recursive: Option<bool>,
    },
    SessionCreate {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        cwd: Option<String>,
        #[serde(default)]
        env: Option<BTreeMap<String, String>>,
    },
    SessionList,
    SessionRm {
        id: String,
    },
    PtyOpen(PtyReq),
    PtyResize {
        pid: i32,
        cols: u16,
        rows: u16,
    },
    PortForward {
        port: u16,
    },
}

/// The ops seed 000's daemon serves that this node does not: answered with
/// `unimplemented` (the SDK's typed error for them), never a dropped connection.
pub const UNSERVED_OPS: &[&str] = &[
    "git_clone",
    "git_status",
    "git_add",
    "git_commit",
    "git_push",
    "git_pull",
    "git_branch",
    "lsp_start",
    "lsp_request",
    "lsp_stop",
];

/// The ops [`Request`] knows, so an unknown one is told apart from a bad one.
const SERVED_OPS: &[&str] = &[
    "info",
    "exec",
    "ps",
    "kill",
    "logs",
    "attach",
    "stdin",
    "stdin_close",
    "data",
    "data_end",
    "fs_write",
    "fs_read",
    "fs_list",
    "fs_stat",
    "fs_mkdir",
    "fs_rm",
    "fs_rename",
    "fs_push",
    "fs_pull",
    "fs_find",
    "fs_replace",
    "fs_watch",
    "session_create",
    "session_list",
    "session_rm",
    "pty_open",
    "pty_resize",
    "port_forward",
];

impl Request {
    /// Whether the frame feeds the request in flight instead of opening one.
    pub fn is_continuation(&self) -> bool {
        matches!(
            self,
            Self::Stdin { .. } | Self::StdinClose | Self::Data { .. } | Self::DataEnd
        )
    }
}

#[derive(Debug, Deserialize)]
pub struct ExecReq {
    pub argv: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub detach: bool,
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct PtyReq {
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default = "default_rows")]
    pub rows: u16,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub user: Option<String>,
}

fn default_cols() -> u16 {
    80
}

fn default_rows() -> u16 {
    24
}

/// Why a line is not a request we serve; each becomes an `error` frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("Invalid JSON frame: {0}")]
    Json(String),
    #[error("Frame without an op")]
    NoOp,
    #[error("Unsupported protocol version {0}")]
    Version(u64),
    #[error("Op {0} is not served by this node")]
    Unserved(String),
    #[error("Invalid {op} frame: {reason}")]
    Fields { op: String, reason: String },
}

impl ParseError {
    /// The wire kind the SDK sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unserved(_) => ErrorKind::Unimplemented,
            _ => ErrorKind::BadRequest,
        }
    }
}

/// Parses one line: bad JSON and bad fields are `bad_request`, an op this node
/// does not serve (or has never heard of) is `unimplemented`.
pub fn parse(line: &[u8]) -> Result<Request, ParseError> {
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|error| ParseError::Json(error.to_string()))?;
    let op = value
        .get("op")
        .and_then(serde_json::Value::as_str)
        .ok_or(ParseError::NoOp)?
        .to_owned();
    if let Some(version) = value.get("v").and_then(serde_json::Value::as_u64) {
        if version != 1 {
            return Err(ParseError::Version(version));
        }
    }
    if !SERVED_OPS.contains(&op.as_str()) {
        return Err(ParseError::Unserved(op));
    }
    serde_json::from_value(value).map_err(|error| ParseError::Fields {
        op,
        reason: error.to_string(),
    })
}

/// Node → client frames.
#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Started {
        pid: i32,
    },
    Stdout {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    Stderr {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    Exit {
        code: i32,
    },
    Done,
    Ready,
    Error {
        kind: ErrorKind,
        message: String,
    },
    Info {
        version: String,
        proto: u32,
        uptime_secs: u64,
        procs: usize,
        sessions: usize,
    },
    Procs {
        procs: Vec<ProcRow>,
    },
    Data {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    Entries {
        entries: Vec<EntryRow>,
    },
    Stat {
        info: StatRow,
    },
    SessionCreated {
        id: String,
    },
    Sessions {
        sessions: Vec<String>,
    },
    Match {
        file: String,
        line: u64,
        content: String,
    },
    Replaced {
        file: String,
        replacements: u64,
    },
    Event {
        kind: EventKind,
        path: String,
    },
}

impl Response {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Error {
            kind,
            message: message.into(),
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct ProcRow {
    pub pid: i32,
    pub argv: Vec<String>,
    pub detached: bool,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub started_at_epoch_secs: u64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct EntryRow {
    pub name: String,
    pub kind: &'static str,
    pub size: u64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct StatRow {
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub mtime_epoch_secs: u64,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Created,
    Modified,
    Deleted,
}

/// Renders one newline-terminated frame.
pub fn render(response: &Response) -> Vec<u8> {
    // Serializing these types cannot fail: every field is a string, number or list.
    let mut line = serde_json::to_vec(response).unwrap_or_else(|_| {
        br#"{"type":"error","kind":"internal","message":"unrenderable frame"}"#.to_vec()
    });
    line.push(b'\n');
    line
}

/// Writes one frame and flushes it.
pub async fn write<W: AsyncWrite + Unpin>(out: &mut W, response: &Response) -> std::io::Result<()> {
    out.write_all(&render(response)).await?;
    out.flush().await
}

/// Why a line could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("Reading the connection failed")]
    Io(#[from] std::io::Error),
    #[error("A frame exceeds the {MAX_FRAME_BYTES}-byte cap")]
    TooLarge,
    #[error("The connection ended in the middle of a frame")]
    Truncated,
}

/// Reads one line into `line` (cleared first) without ever holding more than the
/// cap; `Ok(false)` on a clean end of stream between frames.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
) -> Result<bool, ReadError> {
    line.clear();
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return if line.is_empty() {
                Ok(false)
            } else {
                Err(ReadError::Truncated)
            };
        }
        if let Some(at) = memchr::memchr(b'\n', available) {
            if line.len() + at > MAX_FRAME_BYTES {
                return Err(ReadError::TooLarge);
            }
            line.extend_from_slice(&available[..at]);
            input.consume(at + 1);
            return Ok(true);
        }
        let taken = available.len();
        if line.len() + taken > MAX_FRAME_BYTES {
            return Err(ReadError::TooLarge);
        }
        line.extend_from_slice(available);
        input.consume(taken);
    }
}

/// Base64 for `data` fields, standard alphabet with padding (the SDK's).
mod b64 {
    use super::{Engine, STANDARD};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_render_with_the_exact_bytes_the_sdk_parses() {
        assert_eq!(render(&Response::Done), b"{\"type\":\"done\"}\n");
        assert_eq!(
            render(&Response::Stdout {
                data: b"hi".to_vec()
            }),
            b"{\"type\":\"stdout\",\"data\":\"aGk=\"}\n"
        );
        assert_eq!(
            render(&Response::error(ErrorKind::NotFound, "no")),
            b"{\"type\":\"error\",\"kind\":\"not_found\",\"message\":\"no\"}\n"
        );
        assert_eq!(
            render(&Response::Exit { code: 3 }),
            b"{\"type\":\"exit\",\"code\":3}\n"
        );
    }

    #[test]
    fn requests_parse_as_the_sdk_encodes_them() {
        let exec = parse(br#"{"v":1,"op":"exec","argv":["true"],"detach":false}"#).unwrap();
        assert!(matches!(exec, Request::Exec(ExecReq { ref argv, .. }) if argv == &["true"]));
        let data = parse(br#"{"v":1,"op":"data","data":"aGk="}"#).unwrap();
        assert!(matches!(data, Request::Data { ref data } if data == b"hi"));
        let rename = parse(br#"{"v":1,"op":"fs_rename","from":"/a","to":"/b"}"#).unwrap();
        assert!(matches!(rename, Request::FsRename { .. }));
    }

    #[test]
    fn an_unknown_or_unserved_op_is_unimplemented_and_bad_json_is_bad_request() {
        assert_eq!(
            parse(br#"{"v":1,"op":"lsp_start","language":"rust"}"#)
                .unwrap_err()
                .kind(),
            ErrorKind::Unimplemented
        );
        assert_eq!(
            parse(br#"{"v":1,"op":"teleport"}"#).unwrap_err().kind(),
            ErrorKind::Unimplemented
        );
        assert_eq!(
            parse(b"{not json").unwrap_err().kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(parse(br#"{"v":1}"#).unwrap_err(), ParseError::NoOp);
        assert_eq!(
            parse(br#"{"v":1,"op":"kill"}"#).unwrap_err().kind(),
            ErrorKind::BadRequest
        );
        assert_eq!(
            parse(br#"{"v":1,"op":"data","data":"!!"}"#)
                .unwrap_err()
                .kind(),
            ErrorKind::BadRequest
        );
    }

    #[tokio::test]
    async fn the_reader_refuses_a_line_over_the_cap_without_buffering_it() {
        let big = vec![b'x'; MAX_FRAME_BYTES + 10];
        let mut input = tokio::io::BufReader::new(&big[..]);
        let mut line = Vec::new();
        assert!(matches!(
            read_line(&mut input, &mut line).await,
            Err(ReadError::TooLarge)
        ));
        assert!(line.len() <= MAX_FRAME_BYTES);
    }

    #[tokio::test]
    async fn the_reader_tells_a_clean_end_from_a_cut_frame() {
        let mut input = tokio::io::BufReader::new(&b"{\"op\":\"ps\"}\n{\"op"[..]);
        let mut line = Vec::new();
        assert!(read_line(&mut input, &mut line).await.unwrap());
        assert_eq!(line, b"{\"op\":\"ps\"}");
        assert!(matches!(
            read_line(&mut input, &mut line).await,
            Err(ReadError::Truncated)
        ));
        let mut empty = tokio::io::BufReader::new(&b""[..]);
        assert!(!read_line(&mut empty, &mut line).await.unwrap());
    }
}
