//! What differs between languages: how the interpreter starts, how its driver gets
//! in, and the driver's control messages.
//!
//! The drivers ship inside the agent (`driver.py`, `driver.sh` next to this file):
//! the interpreter is started with a one-line bootstrap that reads the driver from
//! the control socket on fd 0 and runs it, so a template needs nothing but the
//! interpreter, and `ps` shows a short command line. Each driver's file says its
//! side of the protocol; this module is the agent's side.

use sandbox_protocol::eval::{EVAL_EXCEPTION_CAP_BYTES, EVAL_VALUE_CAP_BYTES};
use sandbox_protocol::{EvalException, Language};
use serde::Deserialize;

use super::control::{Control, ControlError, CONTROL_LINE_MAX_BYTES};
use super::SessionError;

/// The Python driver's source.
const PYTHON_DRIVER: &str = include_str!("driver.py");

/// The sh driver's source.
const SHELL_DRIVER: &str = include_str!("driver.sh");

/// Reads the driver from fd 0 (its length in 8 hex digits, then the source) and
/// runs it. `-u`: unbuffered stdout and stderr, so `print` and a subprocess's output
/// reach the pipe in the order they were written.
const PYTHON_BOOTSTRAP: &str =
    "import sys;exec(sys.stdin.buffer.read(int(sys.stdin.buffer.read(8),16)))";

/// Moves the control socket to fd 9 (fd 0 becomes `/dev/null`), reads the driver's
/// lines up to a line `.`, and evals them; `$n` holds a newline for the driver.
const SHELL_BOOTSTRAP: &str = r#"exec 9<&0 </dev/null;n=$(printf '\n.');n=${n%.};d=;while IFS= read -r l <&9;do [ "$l" = . ]&&break;d=$d$l$n;done;eval "$d""#;

/// The longest message a Python driver may send: a reply holds at most the value
/// and the exception's message and traceback at their caps (64 KiB each), which
/// JSON escaping can grow up to sixfold (a control character is `\u001b`).
pub const CONTROL_FRAME_MAX_BYTES: usize = 2 * 1024 * 1024;

/// Longest exception type name kept.
const TYPE_NAME_CAP_BYTES: usize = 256;

/// The argument vector of a session's interpreter: `ps` shows it, with the
/// session's name last.
pub fn argv(language: Language, name: &str) -> Vec<String> {
    let argv: &[&str] = match language {
        Language::Python => &["python3", "-u", "-c", PYTHON_BOOTSTRAP, name],
        Language::Shell => &["/bin/sh", "-c", SHELL_BOOTSTRAP, name],
    };
    argv.iter().map(|&arg| arg.to_owned()).collect()
}

/// What the agent writes first: the driver, as its bootstrap reads it.
pub fn payload(language: Language) -> Vec<u8> {
    match language {
        Language::Python => {
            let source = format!(
                "VALUE_CAP = {EVAL_VALUE_CAP_BYTES}\nEXCEPTION_CAP = {EVAL_EXCEPTION_CAP_BYTES}\n\
                 {PYTHON_DRIVER}"
            );
            let mut bytes = format!("{:08x}", source.len()).into_bytes();
            bytes.extend_from_slice(source.as_bytes());
            bytes
        }
        Language::Shell => {
            let mut bytes = SHELL_DRIVER.as_bytes().to_vec();
            if !bytes.ends_with(b"\n") {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(b".\n");
            bytes
        }
    }
}

/// A length-prefixed JSON message for the Python driver.
fn frame(message: &serde_json::Value) -> Vec<u8> {
    let body = message.to_string().into_bytes();
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    bytes
}

/// The message that runs `code`. Shell code travels as lines, so it may not hold
/// a NUL byte (no shell variable can).
pub fn eval_message(language: Language, code: &str) -> Result<Vec<u8>, SessionError> {
    match language {
        Language::Python => Ok(frame(&serde_json::json!({"op": "eval", "code": code}))),
        Language::Shell => {
            if code.contains('\0') {
                return Err(SessionError::NulInShellCode);
            }
            let mut lines: Vec<&str> = code.split('\n').collect();
            if lines.last() == Some(&"") {
                lines.pop();
            }
            let mut bytes = format!("eval {}\n", lines.len()).into_bytes();
            for line in lines {
                bytes.extend_from_slice(line.as_bytes());
                bytes.push(b'\n');
            }
            Ok(bytes)
        }
    }
}

/// The message that ends an evaluation's output with `marker`.
pub fn flush_message(language: Language, marker: &str) -> Vec<u8> {
    match language {
        Language::Python => frame(&serde_json::json!({"op": "flush", "marker": marker})),
        Language::Shell => format!("flush {marker}\n").into_bytes(),
    }
}

/// The message that reseeds the language's generators (`seed` for sh's `$RANDOM`;
/// Python takes its own from the kernel). A Python session also gets the egress
/// proxy variables now in force (none without egress): a warm session started
/// before its VM had egress would otherwise never see them.
pub fn reseed_message(language: Language, seed: u32) -> Vec<u8> {
    match language {
        Language::Python => {
            let env: serde_json::Map<String, serde_json::Value> = crate::egress::proxy_env()
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect();
            frame(&serde_json::json!({"op": "reseed", "env": env}))
        }
        Language::Shell => format!("reseed {seed}\n").into_bytes(),
    }
}

/// The driver's first message: it runs and owns the control socket. Returns what it
/// says about the interpreter (Python's version).
pub async fn read_ready(language: Language, control: &mut Control) -> Result<String, ControlError> {
    match language {
        Language::Python => {
            #[derive(Deserialize)]
            struct Ready {
                ready: bool,
                #[serde(default)]
                python: String,
            }
            let ready: Ready = json(&control.read_frame(CONTROL_FRAME_MAX_BYTES).await?)?;
            match ready.ready {
                true => Ok(format!("Python {}", ready.python)),
                false => Err(ControlError::Invalid("ready: false".into())),
            }
        }
        Language::Shell => match control.read_line(CONTROL_LINE_MAX_BYTES).await?.as_str() {
            "ready" => Ok("sh".into()),
            other => Err(ControlError::Invalid(shown(other))),
        },
    }
}

/// How a cell ended, as its driver reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellResult {
    /// Python: the repr of the trailing expression.
    pub value: Option<String>,
    /// The repr was cut.
    pub value_truncated: bool,
    /// Python: what the cell raised.
    pub exception: Option<EvalException>,
    /// Shell: `$?`.
    pub status: Option<i32>,
}

/// The driver's answer to an eval message. Cancel-safe. Caps are enforced here
/// again: the driver runs next to user code and is not trusted to.
pub async fn read_result(
    language: Language,
    control: &mut Control,
) -> Result<CellResult, ControlError> {
    match language {
        Language::Python => {
            #[derive(Deserialize)]
            struct Reply {
                value: Option<String>,
                #[serde(default)]
                value_truncated: bool,
                exception: Option<Raised>,
            }
            #[derive(Deserialize)]
            struct Raised {
                type_name: String,
                message: String,
                traceback: String,
            }
            let reply: Reply = json(&control.read_frame(CONTROL_FRAME_MAX_BYTES).await?)?;
            let (value, value_truncated) = match reply.value {
                Some(value) => {
                    let (value, cut) = cap_text(value, EVAL_VALUE_CAP_BYTES);
                    (Some(value), cut || reply.value_truncated)
                }
                None => (None, false),
            };
            let exception = reply.exception.map(|raised| EvalException {
                type_name: cap_text(raised.type_name, TYPE_NAME_CAP_BYTES).0,
                message: cap_text(raised.message, EVAL_EXCEPTION_CAP_BYTES).0,
                traceback: cap_text(raised.traceback, EVAL_EXCEPTION_CAP_BYTES).0,
            });
            Ok(CellResult {
                value,
                value_truncated,
                exception,
                status: None,
            })
        }
        Language::Shell => {
            let line = control.read_line(CONTROL_LINE_MAX_BYTES).await?;
            let status = line
                .strip_prefix("done ")
                .and_then(|status| status.parse::<i32>().ok())
                .ok_or_else(|| ControlError::Invalid(shown(&line)))?;
            Ok(CellResult {
                status: Some(status),
                ..CellResult::default()
            })
        }
    }
}

/// The driver's answer to a reseed message: which generators it reseeded.
pub async fn read_reseeded(
    language: Language,
    control: &mut Control,
) -> Result<Vec<String>, ControlError> {
    match language {
        Language::Python => {
            #[derive(Deserialize)]
            struct Reseeded {
                reseeded: Vec<String>,
            }
            let reply: Reseeded = json(&control.read_frame(CONTROL_FRAME_MAX_BYTES).await?)?;
            Ok(reply.reseeded)
        }
        Language::Shell => match control.read_line(CONTROL_LINE_MAX_BYTES).await?.as_str() {
            "ok" => Ok(Vec::new()),
            other => Err(ControlError::Invalid(shown(other))),
        },
    }
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ControlError> {
    serde_json::from_slice(body).map_err(|error| ControlError::Invalid(error.to_string()))
}

/// A message as an error shows it: cut to a readable length.
fn shown(message: &str) -> String {
    message.chars().take(80).collect()
}

/// `text` cut to at most `cap` bytes on a character boundary, and whether it was.
pub fn cap_text(mut text: String, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text, false);
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_code_goes_as_counted_lines() {
        let message = eval_message(Language::Shell, "echo a\n  b \\\n").unwrap();
        assert_eq!(message, b"eval 2\necho a\n  b \\\n");
        assert_eq!(eval_message(Language::Shell, "").unwrap(), b"eval 0\n");
        assert_eq!(eval_message(Language::Shell, "x").unwrap(), b"eval 1\nx\n");
        assert_eq!(
            eval_message(Language::Shell, "\n\n").unwrap(),
            b"eval 2\n\n\n"
        );
        assert!(matches!(
            eval_message(Language::Shell, "a\0b"),
            Err(SessionError::NulInShellCode)
        ));
    }

    #[test]
    fn python_messages_are_length_prefixed_json() {
        let message = eval_message(Language::Python, "print('\0')").unwrap();
        let len = u32::from_le_bytes(message[..4].try_into().unwrap());
        assert_eq!(len as usize, message.len() - 4);
        let body: serde_json::Value = serde_json::from_slice(&message[4..]).unwrap();
        assert_eq!(body["op"], "eval");
        assert_eq!(body["code"], "print('\0')");
    }

    #[test]
    fn the_drivers_travel_whole() {
        let python = payload(Language::Python);
        let len = usize::from_str_radix(std::str::from_utf8(&python[..8]).unwrap(), 16).unwrap();
        assert_eq!(len, python.len() - 8);
        assert!(python.ends_with(PYTHON_DRIVER.as_bytes()));
        // The bootstrap stops at the first line that is a lone dot.
        let shell = payload(Language::Shell);
        let text = std::str::from_utf8(&shell).unwrap();
        assert_eq!(text.lines().filter(|line| *line == ".").count(), 1);
        assert!(text.ends_with("\n.\n"));
    }

    #[test]
    fn the_command_line_is_one_line_that_names_the_session() {
        for language in [Language::Python, Language::Shell] {
            let argv = argv(language, "work");
            assert_eq!(argv.last().map(String::as_str), Some("work"));
            assert!(argv.iter().all(|arg| !arg.contains('\n')), "{argv:?}");
        }
    }

    #[test]
    fn texts_are_cut_on_character_boundaries() {
        assert_eq!(cap_text("abc".into(), 3), ("abc".into(), false));
        assert_eq!(cap_text("abcd".into(), 3), ("abc".into(), true));
        assert_eq!(cap_text("aé".into(), 2), ("a".into(), true));
    }
}
