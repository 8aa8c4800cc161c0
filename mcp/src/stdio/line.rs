//! What the stdio front does with one line: hand it to rmcp, answer it with a
//! JSON-RPC error, or log and drop it. The split follows what rmcp 3.11 would do
//! with the line itself: it accepts exactly the lines that parse as a client
//! message, ignores invalid JSON without a word, and answers well-formed JSON of the
//! wrong shape with `-32600` but without the request's id, and even when the line
//! was a notification. Parsing here with rmcp's own message type keeps the two in
//! step: a line this module forwards is one rmcp accepts. The price is a second
//! parse of every message (rmcp parses the forwarded bytes again), bounded by the
//! line cap; in exchange rmcp keeps its own reader, with its compatibility rules.

use rmcp::model::{ClientJsonRpcMessage, ErrorCode};
use serde_json::{json, Value};

use super::scan::IdScan;
use super::{ADVISED_PART_BYTES, MAX_LINE_BYTES};

/// RFC 8259 §8.1 lets a parser skip a leading UTF-8 byte order mark; rmcp does.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The fate of one line.
#[derive(Debug, PartialEq)]
pub enum Verdict<'a> {
    /// Only whitespace: nothing to do.
    Blank,
    /// A client message rmcp will accept: these bytes, without the line ending.
    Forward(&'a [u8]),
    /// An error response to write back, newline included.
    Reply(Vec<u8>),
    /// Malformed, but a notification or a response, which JSON-RPC never answers
    /// (an answer to a response could start an error ping-pong): log why, drop it.
    Drop(String),
}

/// Decides what to do with a complete line (its `\n` already removed).
pub fn classify(line: &[u8]) -> Verdict<'_> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Blank;
    }
    let body = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Ok(_) => return Verdict::Forward(line),
        Err(error) => error,
    };
    let value = match serde_json::from_slice::<Value>(body) {
        Ok(value) => value,
        Err(error) => {
            return Verdict::Reply(response(
                None,
                ErrorCode::PARSE_ERROR,
                &format!(
                    "Parse error: the line is not valid JSON ({error}). Send one JSON-RPC \
                     message per line, as UTF-8 JSON with no raw newline inside it."
                ),
                None,
            ))
        }
    };
    if let Value::Object(object) = &value {
        let kind = if object.contains_key("method") && !object.contains_key("id") {
            Some("notification")
        } else if !object.contains_key("method")
            && (object.contains_key("result") || object.contains_key("error"))
        {
            Some("response")
        } else {
            None
        };
        if let Some(kind) = kind {
            return Verdict::Drop(format!("malformed {kind} ({error})"));
        }
    }
    Verdict::Reply(response(
        request_id(&value),
        ErrorCode::INVALID_REQUEST,
        &format!(
            "Invalid request: this JSON is not a JSON-RPC 2.0 message this server accepts \
             ({error}). Send one object per line with \"jsonrpc\": \"2.0\", a \"method\", \
             its \"params\", and an \"id\" (a number or a string) unless it is a \
             notification."
        ),
        None,
    ))
}

/// The answer to a line longer than [`MAX_LINE_BYTES`] that was discarded unread, or
/// `None` when the scan says it was a notification.
///
/// The code is `-32600` (invalid request) rather than a server-defined one: the
/// line was never read as a request, so to this server it is not a valid request
/// object, and clients already turn `-32600` into a readable failure that shows
/// the message, which says what to send instead. `data` carries the numbers.
pub fn too_large(scan: &IdScan, line_bytes: u64) -> Option<Vec<u8>> {
    if scan.is_notification() {
        return None;
    }
    let mib = MAX_LINE_BYTES / (1024 * 1024);
    let part_mib = ADVISED_PART_BYTES / (1024 * 1024);
    let message = format!(
        "Request too large: this message was {line_bytes} bytes, and sandbox-mcp reads at \
         most {MAX_LINE_BYTES} bytes ({mib} MiB) per JSON-RPC message, so it was discarded \
         unread. Send a big file in parts of at most {part_mib} MiB: write_file each with its \
         offset (0 first, then the next_offset returned) and more: true, and the last part \
         with more: false; the file appears when the last part arrives. Or create the \
         content inside the sandbox with exec."
    );
    let data = json!({"limit_bytes": MAX_LINE_BYTES, "line_bytes": line_bytes});
    Some(response(
        scan.id().cloned(),
        ErrorCode::INVALID_REQUEST,
        &message,
        Some(data),
    ))
}

/// The request's `id` when it is one JSON-RPC allows (a number or a string).
fn request_id(value: &Value) -> Option<Value> {
    value
        .get("id")
        .filter(|id| id.is_number() || id.is_string())
        .cloned()
}

/// A JSON-RPC error response as one line. `id` is `null` when it could not be read,
/// as JSON-RPC 2.0 §5 asks.
fn response(id: Option<Value>, code: ErrorCode, message: &str, data: Option<Value>) -> Vec<u8> {
    let mut error = json!({"code": code.0, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    let reply = json!({"jsonrpc": "2.0", "id": id.unwrap_or(Value::Null), "error": error});
    let mut line = reply.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(verdict: Verdict<'_>) -> Value {
        match verdict {
            Verdict::Reply(line) => {
                assert_eq!(line.last(), Some(&b'\n'));
                serde_json::from_slice(&line).expect("replies are JSON")
            }
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn client_messages_are_forwarded_without_their_line_ending() {
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let mut crlf = ping.to_vec();
        crlf.extend_from_slice(b"\r");
        assert_eq!(classify(&crlf), Verdict::Forward(ping));
        let initialized = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(classify(initialized), Verdict::Forward(initialized));
        let mut bom = UTF8_BOM.to_vec();
        bom.extend_from_slice(ping);
        assert!(matches!(classify(&bom), Verdict::Forward(_)));
    }

    #[test]
    fn blank_lines_are_ignored() {
        assert_eq!(classify(b""), Verdict::Blank);
        assert_eq!(classify(b"  \t\r"), Verdict::Blank);
    }

    #[test]
    fn invalid_json_is_a_parse_error_with_a_null_id() {
        let body = reply(classify(b"this is not json"));
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["id"], Value::Null);
        assert_eq!(body["error"]["code"], -32700);
        let body = reply(classify(b"{\"id\": 4, \"method\": \"ping\""));
        assert_eq!(body["id"], Value::Null, "a truncated object's id is unread");
        let body = reply(classify(b"\"\xff\""));
        assert_eq!(body["error"]["code"], -32700, "invalid UTF-8");
    }

    #[test]
    fn json_that_is_not_a_message_is_an_invalid_request_under_its_id() {
        let body = reply(classify(br#"{"foo":1}"#));
        assert_eq!(body["error"]["code"], -32600);
        assert_eq!(body["id"], Value::Null);
        let body = reply(classify(br#"{"jsonrpc":"2.0","id":"a-1","method":5}"#));
        assert_eq!(body["id"], "a-1");
        assert_eq!(body["error"]["code"], -32600);
        let body = reply(classify(
            br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#,
        ));
        assert_eq!(body["id"], Value::Null, "an object is no JSON-RPC id");
        let body = reply(classify(b"[1,2]"));
        assert_eq!(body["error"]["code"], -32600);
    }

    #[test]
    fn malformed_notifications_and_responses_are_dropped_unanswered() {
        let bad = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#;
        assert!(matches!(classify(bad), Verdict::Drop(why) if why.contains("notification")));
        let response = br#"{"jsonrpc":"2.0","id":3,"result":5,"error":{}}"#;
        assert!(matches!(classify(response), Verdict::Drop(why) if why.contains("response")));
    }

    #[test]
    fn an_oversize_request_is_answered_under_its_id_with_the_limit_and_a_way_out() {
        let mut scan = IdScan::default();
        scan.feed(br#"{"jsonrpc":"2.0","method":"tools/call","params":{},"id":42}"#);
        let line = too_large(&scan, 17 << 20).expect("a request is answered");
        let body: Value = serde_json::from_slice(&line).expect("JSON");
        assert_eq!(body["id"], 42);
        assert_eq!(body["error"]["code"], -32600);
        assert_eq!(body["error"]["data"]["limit_bytes"], MAX_LINE_BYTES);
        assert_eq!(body["error"]["data"]["line_bytes"], 17 << 20);
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("16777216 bytes (16 MiB)"), "{message}");
        assert!(message.contains("write_file") && message.contains("more: true"));

        let mut notification = IdScan::default();
        notification.feed(br#"{"jsonrpc":"2.0","method":"notifications/x","params":{}}"#);
        assert_eq!(too_large(&notification, 17 << 20), None);
    }
}
