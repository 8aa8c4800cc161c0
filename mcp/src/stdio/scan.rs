//! A streaming scan of a line too large to parse, for the two things its error reply
//! needs: the top-level `"id"` (so the client can match the reply to its request) and
//! whether the line is a notification (which gets no reply at all).
//!
//! The scan is fed the line in chunks as it streams past and keeps a few dozen bytes
//! of state, so an oversize line is never held in memory to be understood. It reads
//! the whole line, not only its first few KiB, because clients put `id` in different
//! places: rmcp and the Python SDK write it before `params`, the TypeScript SDK (used
//! by Claude Code and Cursor) after them, that is after the megabytes that made the
//! line too large. It is a tokenizer, not a validator: it tracks nesting and strings
//! to tell a top-level key from the same text inside `params`, and trusts the rest.
//! A key spelled with escapes (`"\u0069d"`) is not recognised; the reply then
//! carries `id: null`, which JSON-RPC allows when the id cannot be read.

use serde_json::Value;

/// Longest `id` value kept, in bytes of JSON. Real ids are counters or UUIDs; a
/// longer one is not worth holding, and the reply falls back to `id: null`.
const ID_VALUE_BYTES: usize = 256;

/// Longest top-level key kept while scanning: long enough to compare with `method`.
const KEY_BYTES: usize = 8;

/// What the scan found in the line so far.
#[derive(Debug, Default)]
pub struct IdScan {
    /// Nesting depth outside strings: 1 inside the top-level object.
    depth: u32,
    /// Whether the first non-blank byte was seen, and it opened an object.
    started: bool,
    object: bool,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key (after `{` or `,`), not a value.
    expect_key: bool,
    /// The top-level key being read, while `in_string` at depth 1 with `expect_key`.
    key: Vec<u8>,
    reading_key: bool,
    key_overflow: bool,
    /// The last complete top-level key, until its `:`.
    last_key: Option<TopKey>,
    /// The raw bytes of the top-level `id` value, while it is being read.
    value: Option<Vec<u8>>,
    id: Option<Value>,
    has_id: bool,
    has_method: bool,
}

/// Top-level keys the scan cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Id,
    Method,
    Other,
}

impl IdScan {
    /// Feeds the next bytes of the line.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.step(byte);
        }
    }

    /// The top-level `id` if it was a number or a string that could be read.
    pub fn id(&self) -> Option<&Value> {
        self.id.as_ref()
    }

    /// Whether the line is a top-level object with a `method` and no `id` key: a
    /// JSON-RPC notification, which must not be answered.
    pub fn is_notification(&self) -> bool {
        self.object && self.has_method && !self.has_id
    }

    fn step(&mut self, byte: u8) {
        if let Some(value) = self.value.as_mut() {
            // Inside the top-level `id` value: keep its bytes until the `,` or `}`
            // that ends it at depth 1 (checked below, outside strings).
            let ends = !self.in_string && self.depth == 1 && matches!(byte, b',' | b'}');
            if ends {
                self.finish_id();
            } else if value.len() < ID_VALUE_BYTES {
                value.push(byte);
            } else {
                // Too long to be a real id: give up on it.
                self.value = None;
            }
        }
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        if !self.started {
            if byte.is_ascii_whitespace() {
                return;
            }
            self.started = true;
            self.object = byte == b'{';
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.reading_key = true;
                    self.key.clear();
                    self.key_overflow = false;
                }
            }
            b'{' | b'[' => {
                self.depth = self.depth.saturating_add(1);
                if self.depth == 1 {
                    self.expect_key = byte == b'{';
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 => {
                self.expect_key = false;
                if self.last_key.take() == Some(TopKey::Id) && !self.has_id {
                    self.has_id = true;
                    self.value = Some(Vec::new());
                }
            }
            _ => {}
        }
    }

    fn string_byte(&mut self, byte: u8) {
        if self.escaped {
            self.escaped = false;
            self.key_overflow |= self.reading_key;
            return;
        }
        match byte {
            b'\\' => self.escaped = true,
            b'"' => {
                self.in_string = false;
                if self.reading_key {
                    self.reading_key = false;
                    let key = match (self.key_overflow, self.key.as_slice()) {
                        (false, b"id") => TopKey::Id,
                        (false, b"method") => {
                            self.has_method = true;
                            TopKey::Method
                        }
                        _ => TopKey::Other,
                    };
                    self.last_key = Some(key);
                }
            }
            _ if self.reading_key => {
                if self.key.len() < KEY_BYTES {
                    self.key.push(byte);
                } else {
                    self.key_overflow = true;
                }
            }
            _ => {}
        }
    }

    /// The `id` value ended: keep it if it is a JSON-RPC id (a number or a string).
    fn finish_id(&mut self) {
        let Some(raw) = self.value.take() else {
            return;
        };
        if let Ok(value @ (Value::Number(_) | Value::String(_))) = serde_json::from_slice(&raw) {
            self.id = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(line: &str) -> IdScan {
        let mut scan = IdScan::default();
        scan.feed(line.as_bytes());
        scan
    }

    fn scan_bytewise(line: &str) -> IdScan {
        let mut scan = IdScan::default();
        for byte in line.as_bytes() {
            scan.feed(std::slice::from_ref(byte));
        }
        scan
    }

    #[test]
    fn finds_an_id_before_or_after_the_params() {
        let big = "x".repeat(10_000);
        let first = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"content":"{big}"}}}}"#
        );
        let last = format!(
            r#"{{"method":"tools/call","params":{{"content":"{big}"}},"jsonrpc":"2.0","id":"req-9"}}"#
        );
        assert_eq!(scan(&first).id(), Some(&json!(7)));
        assert_eq!(scan(&last).id(), Some(&json!("req-9")));
        assert!(!scan(&last).is_notification());
    }

    #[test]
    fn chunk_boundaries_do_not_matter() {
        let line = r#" { "params" : {"a":[1,{"id":3}]} , "id" : -12 , "method":"ping"}"#;
        assert_eq!(scan_bytewise(line).id(), Some(&json!(-12)));
        assert_eq!(scan(line).id(), Some(&json!(-12)));
    }

    #[test]
    fn an_id_inside_params_or_inside_a_string_is_not_the_request_id() {
        let nested = r#"{"method":"tools/call","params":{"id":5,"arguments":{"id":6}}}"#;
        let scanned = scan(nested);
        assert_eq!(scanned.id(), None);
        assert!(scanned.is_notification(), "no top-level id: a notification");
        let quoted = r#"{"params":{"content":"\"id\":5, \\\"id\": 6"},"method":"x","id":8}"#;
        assert_eq!(scan(quoted).id(), Some(&json!(8)));
    }

    #[test]
    fn null_odd_or_overlong_ids_are_unreadable() {
        assert_eq!(scan(r#"{"id":null,"method":"x"}"#).id(), None);
        assert!(!scan(r#"{"id":null,"method":"x"}"#).is_notification());
        assert_eq!(scan(r#"{"id":{"a":1},"method":"x"}"#).id(), None);
        let long = format!(r#"{{"id":"{}","method":"x"}}"#, "9".repeat(1000));
        assert_eq!(scan(&long).id(), None);
        assert_eq!(scan(r#"{"\u0069d":4,"method":"x"}"#).id(), None);
    }

    #[test]
    fn an_id_cut_off_by_the_end_of_the_line_is_unreadable() {
        assert_eq!(scan(r#"{"method":"x","id":12"#).id(), None);
        assert_eq!(scan(r#"{"method":"x","id":"abc"#).id(), None);
    }

    #[test]
    fn only_objects_with_a_method_and_no_id_are_notifications() {
        assert!(
            scan(r#"{"jsonrpc":"2.0","method":"notifications/x","params":{}}"#).is_notification()
        );
        assert!(!scan(r#"[{"method":"x"}]"#).is_notification());
        assert!(!scan(r#"{"params":{"method":"x"}}"#).is_notification());
        assert!(!scan("garbage").is_notification());
    }
}
