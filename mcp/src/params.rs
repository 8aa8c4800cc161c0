//! Tool inputs: one type per tool, with the JSON schema (via schemars) and the
//! field descriptions a model reads before calling. Unknown fields are rejected so a
//! misspelt argument fails loudly instead of being ignored.

use std::collections::BTreeMap;

use sandbox_protocol::limits::EXEC_DEADLINE_SECS;
use sandbox_protocol::Command;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::ToolError;
use crate::output::{size, Keep};

/// Network access for a new sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Net {
    /// No network interface beyond loopback (the default).
    #[default]
    None,
    /// Outbound connections through the host's allowlist (HTTP/HTTPS proxy).
    Egress,
}

/// A VM size preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum SizeName {
    /// 1 vCPU, 512 MiB.
    #[serde(rename = "small")]
    Small,
    /// 2 vCPUs, 1 GiB.
    #[serde(rename = "medium")]
    Medium,
    /// 2 vCPUs, 2 GiB.
    #[serde(rename = "large")]
    Large,
    /// 4 vCPUs, 4 GiB.
    #[serde(rename = "xlarge")]
    Xlarge,
    /// 8 vCPUs, 8 GiB.
    #[serde(rename = "2xlarge")]
    Xxlarge,
}

impl SizeName {
    /// The launcher's preset name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
            Self::Xlarge => "xlarge",
            Self::Xxlarge => "2xlarge",
        }
    }
}

/// `create_sandbox`
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxParams {
    /// Template to boot (see node_info for the list). Omit for the server's default
    /// template, which is kept warm and claims in milliseconds.
    #[serde(default)]
    pub template: Option<String>,
    /// Network access: "none" (default: no route out) or "egress": programs reach
    /// the destinations the server's allowlist permits through an HTTP proxy the
    /// sandbox's http_proxy/https_proxy variables name (curl, wget, pip, git and
    /// Python's urllib use it). Every attempt is in egress_log.
    #[serde(default)]
    pub net: Net,
    /// With net "egress": narrow the server's allowlist to these entries (host names,
    /// "*.domain", "*", IP addresses or CIDR blocks, each with an optional ":port" or
    /// ":low-high"). A destination must pass both lists; omit to use the server's.
    #[serde(default)]
    pub allow: Vec<String>,
    /// VM size: small (default: 1 vCPU, 512 MiB), medium, large, xlarge or 2xlarge.
    /// Sizes other than the template's default boot a fresh VM (a few seconds).
    #[serde(default)]
    pub size: Option<SizeName>,
    /// Lifetime in seconds; 0 or omitted means one hour, at most 86400. Nothing
    /// renews it: at the deadline the VM and everything in it is destroyed.
    #[serde(default)]
    pub ttl_seconds: u64,
}

impl CreateSandboxParams {
    /// The engine's claim; a build of its template (an image reference) reports to
    /// `progress`.
    pub fn claim_request(
        self,
        progress: Option<sandbox_engine::image_build::BuildProgress>,
    ) -> sandbox_engine::node::ClaimRequest {
        sandbox_engine::node::ClaimRequest {
            template: self.template,
            progress,
            size: self.size.map(|size| size.as_str().to_owned()),
            net: match self.net {
                Net::None => sandbox_engine::node::NetRequest::None,
                Net::Egress => sandbox_engine::node::NetRequest::Egress,
            },
            allow: self.allow,
            ttl_seconds: self.ttl_seconds,
        }
    }
}

/// `exec`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Shell command line, run with `/bin/sh -c` (pipes, &&, redirections work).
    /// Give command or argv, not both.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, run directly with no shell (nothing is
    /// expanded or split), like ["python3", "-c", "print(1)"]; the program is looked
    /// up in PATH. Give command or argv, not both.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory (absolute); defaults to the user's home, else /.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables, applied over a clean default environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds before the command is killed with everything it started (background
    /// children too): default 60, at most 300 (0 means 300). For longer jobs use
    /// spawn and poll with logs.
    #[serde(default, alias = "timeout")]
    pub timeout_seconds: Option<u64>,
    /// Text written to the command's standard input, which is then closed; at most
    /// 3 MiB (for more, write_file it and run `command < FILE`).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Most bytes of each of stdout and stderr to return: default 16384, at most
    /// 1048576. The rest is read and left out (see keep).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Which part of a stream longer than max_bytes to return: "auto" (default: the
    /// tail of a failed command, where the error is; head and tail of a successful
    /// one), "head", "tail" or "head_tail".
    #[serde(default)]
    pub keep: Keep,
}

/// `spawn`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Shell command line, run detached with `/bin/sh -c`.
    pub command: String,
    /// Working directory (absolute); defaults to the user's home, else /.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables, applied over a clean default environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

/// `eval_code`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalCodeParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// The code: a Python cell (the value of a last expression is returned, as in a
    /// notebook), or shell commands.
    pub code: String,
    /// "python" (the default) or "sh".
    #[serde(default = "default_language")]
    pub language: String,
    /// The session: its variables, imports, functions and working directory persist
    /// from one call to the next. Default "default"; 1 to 64 letters, digits, '-',
    /// '_' or '.'.
    #[serde(default = "default_session")]
    pub session: String,
    /// Seconds before the code is interrupted (Python raises KeyboardInterrupt and
    /// the session keeps its state); default and maximum 300.
    #[serde(default, alias = "timeout")]
    pub timeout_seconds: Option<u64>,
    /// When the session died (exit(), a crash, a kill): start a fresh one instead of
    /// failing. Its old state is gone either way.
    #[serde(default)]
    pub restart: bool,
}

fn default_language() -> String {
    "python".to_owned()
}

fn default_session() -> String {
    sandbox_protocol::eval::DEFAULT_SESSION.to_owned()
}

/// Tools that need only a sandbox: `release`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
}

/// A process kind `ps` can filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KindFilter {
    /// Commands run by exec.
    Exec,
    /// Processes started by spawn.
    Spawn,
    /// Terminals.
    Pty,
    /// eval_code's interpreters.
    Session,
}

/// `ps`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PsParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// List only running processes (default true). false also lists exited ones,
    /// which are kept 5 minutes after they exit.
    #[serde(default = "yes")]
    pub running_only: bool,
    /// List only processes of this kind: "exec", "spawn", "pty" or "session".
    #[serde(default)]
    pub kind: Option<KindFilter>,
}

fn yes() -> bool {
    true
}

/// Which part of a process's output `logs` returns when more than max_bytes is held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogsKeep {
    /// The newest output without a cursor; the oldest after a cursor (to page
    /// forward with next_cursor).
    #[default]
    Auto,
    /// The oldest output from the cursor on.
    Head,
    /// The newest output.
    Tail,
}

/// `logs`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// The process, as returned by spawn or listed by ps.
    pub pid: i32,
    /// Return only output from this byte offset on: pass the previous call's
    /// next_cursor to poll for new output or to page on. Omit for the newest output.
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Most bytes to return: default 16384, at most 262144 (the whole ring).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// With more than max_bytes held: "auto" (default: the newest bytes without a
    /// cursor, the first ones after a cursor), "head" or "tail".
    #[serde(default)]
    pub keep: LogsKeep,
}

/// `kill`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// The process, as returned by spawn or listed by ps; every process it started is
    /// signalled (also what an exited one left running).
    pub pid: i32,
    /// Signal number: 15 (SIGTERM, the default), 2 (SIGINT), 9 or 0 (SIGKILL).
    #[serde(default)]
    pub signal: Option<i32>,
}

/// How file content travels in a tool call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Encoding {
    /// Text (reading replaces invalid UTF-8 with U+FFFD).
    #[default]
    #[serde(rename = "utf-8", alias = "utf8", alias = "text")]
    Utf8,
    /// Standard base64 (RFC 4648, with padding): any bytes, exactly.
    #[serde(rename = "base64")]
    Base64,
}

/// `write_file`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Absolute path; the parent directory must exist (create it with exec
    /// `mkdir -p`). An existing file is replaced atomically, once the last part is in.
    pub path: String,
    /// The content (or this part of it), as encoding says.
    pub content: String,
    /// "utf-8" (default: content is text) or "base64" (content is base64 of any
    /// bytes).
    #[serde(default)]
    pub encoding: Encoding,
    /// Permission bits in octal, like "755"; default keeps an existing file's, or
    /// 644 for a new one. With parts, the first part's counts.
    #[serde(default)]
    pub mode: Option<String>,
    /// For a file sent in parts: where this part starts. 0 (default) starts the file;
    /// each next part starts where the last ended (the previous call's next_offset).
    #[serde(default)]
    pub offset: u64,
    /// true: more parts follow, so keep the file open; omit or false on the last (or
    /// only) part, which writes the file. Send parts of a few MiB (each call is one
    /// message, at most 16 MiB with its base64).
    #[serde(default)]
    pub more: bool,
}

/// `read_file`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Absolute path in the sandbox.
    pub path: String,
    /// First byte to read: default 0; negative counts from the end (-4096 reads the
    /// last 4 KiB). Page through a large file with the returned next_offset.
    #[serde(default)]
    pub offset: Option<i64>,
    /// Most bytes to return: default 65536, at most 4194304.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// "utf-8" (text, invalid UTF-8 replaced) or "base64" (exact bytes). Default:
    /// text, or base64 when the bytes read are not text (not UTF-8, or NUL bytes).
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Return an image (PNG, JPEG, GIF or WebP, at most 3 MiB) as image content the
    /// model can see. Default: yes for a file that starts like an image when
    /// offset, max_bytes and encoding are not given; false reads its bytes instead.
    #[serde(default)]
    pub as_image: Option<bool>,
}

/// `list_dir`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Absolute path in the sandbox.
    pub path: String,
}

/// `wait_for_text`
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitForTextParams {
    /// The sandbox, as returned by create_sandbox.
    pub sandbox_id: String,
    /// Wait on this file (absolute path). It, and its directory, may not exist yet;
    /// appends, a rename over it and rewrites are all seen. Give path or pid, not
    /// both.
    #[serde(default)]
    pub path: Option<String>,
    /// Wait on this tracked process's output (stdout and stderr), as returned by
    /// spawn or listed by ps: everything still in its 256 KiB ring counts. Give path
    /// or pid, not both.
    #[serde(default)]
    pub pid: Option<i32>,
    /// The exact text to find (not a pattern), at most 4096 bytes.
    pub text: String,
    /// Seconds to wait: default 30, at most 300; 0 only looks once.
    #[serde(default, alias = "timeout")]
    pub timeout_seconds: Option<u64>,
}

/// The timeout of an `exec` or `eval_code` that names none: an answer (with the
/// output so far) before the 60 s after which common MCP clients give up on a call.
/// Up to [`EXEC_DEADLINE_SECS`] when asked.
pub const DEFAULT_TIMEOUT_SECS: u64 = 55;

/// A tool's `timeout_seconds`: none is [`DEFAULT_TIMEOUT_SECS`], 0 the maximum, more
/// than it is refused.
pub fn timeout_secs(asked: Option<u64>) -> Result<u64, ToolError> {
    match asked {
        None => Ok(DEFAULT_TIMEOUT_SECS),
        Some(0) => Ok(EXEC_DEADLINE_SECS),
        Some(secs) if secs > EXEC_DEADLINE_SECS => Err(ToolError::new(format!(
            "timeout_seconds may be at most {EXEC_DEADLINE_SECS}; got {secs}. For longer \
             jobs, start the command with spawn and poll its output with logs."
        ))),
        Some(secs) => Ok(secs),
    }
}

/// A tool's `max_bytes`: `default` when not given, at least 1, at most `cap`.
pub fn max_bytes(asked: Option<u64>, default: usize, cap: usize) -> Result<usize, ToolError> {
    match asked {
        None => Ok(default),
        Some(0) => Err(ToolError::new(format!(
            "max_bytes must be at least 1; omit it for {default}."
        ))),
        Some(bytes) if bytes > cap as u64 => Err(ToolError::new(format!(
            "max_bytes may be at most {cap} ({}); got {bytes}. For more output, redirect it \
             to a file in the command (> /tmp/out.log) and page through it with read_file \
             (offset, max_bytes).",
            size(cap as u64)
        ))),
        Some(bytes) => Ok(usize::try_from(bytes).unwrap_or(cap)),
    }
}

/// `exec`'s command: a shell line or an argv, exactly one of them.
pub fn command_of(line: Option<String>, argv: Option<Vec<String>>) -> Result<Command, ToolError> {
    match (line, argv) {
        (Some(line), None) => Ok(Command::Shell(line)),
        (None, Some(argv)) if argv.first().is_some_and(|program| !program.is_empty()) => {
            Ok(Command::Argv(argv))
        }
        (None, Some(_)) => Err(ToolError::new(
            "argv must start with a program name, like [\"ls\", \"-l\", \"/tmp\"].",
        )),
        _ => Err(ToolError::new(
            "Give exactly one of command (a shell line, like \"ls -l /tmp | head\") and argv \
             (a program and its arguments, run without a shell, like [\"ls\", \"-l\", \"/tmp\"]).",
        )),
    }
}

/// Parses an octal mode like `"755"`, `"0755"` or `"0o755"`.
pub fn parse_mode(mode: &str) -> Option<u32> {
    let digits = mode.trim();
    let digits = digits.strip_prefix("0o").unwrap_or(digits);
    if digits.is_empty() || digits.len() > 5 {
        return None;
    }
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_and_bounded() {
        assert_eq!(parse_mode("755"), Some(0o755));
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("0o600"), Some(0o600));
        assert_eq!(parse_mode("4755"), Some(0o4755));
        assert_eq!(parse_mode("888"), None);
        assert_eq!(parse_mode("17777"), None);
        assert_eq!(parse_mode(""), None);
        assert_eq!(parse_mode("rwx"), None);
    }

    #[test]
    fn create_defaults_to_no_network_and_an_hour() {
        let params: CreateSandboxParams = serde_json::from_str("{}").unwrap();
        assert_eq!(params.net, Net::None);
        assert_eq!(params.ttl_seconds, 0);
        assert!(params.size.is_none());
        let params: CreateSandboxParams =
            serde_json::from_str(r#"{"size":"2xlarge","net":"egress"}"#).unwrap();
        assert_eq!(params.size, Some(SizeName::Xxlarge));
        // Every size the schema offers is one of the launcher's presets.
        for size in [
            SizeName::Small,
            SizeName::Medium,
            SizeName::Large,
            SizeName::Xlarge,
            SizeName::Xxlarge,
        ] {
            assert!(
                sandbox_vmm::launcher::Size::preset(size.as_str()).is_some(),
                "{size:?}"
            );
        }
        assert_eq!(params.net, Net::Egress);
    }

    #[test]
    fn wait_for_text_takes_a_path_or_a_pid() {
        let params: WaitForTextParams =
            serde_json::from_str(r#"{"sandbox_id":"a","pid":7,"text":"ready","timeout":5}"#)
                .unwrap();
        assert_eq!((params.pid, params.timeout_seconds), (Some(7), Some(5)));
        assert!(params.path.is_none());
        let err = serde_json::from_str::<WaitForTextParams>(
            r#"{"sandbox_id":"a","file":"/x","text":"y"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("file"), "{err}");
    }

    #[test]
    fn eval_code_defaults_to_the_default_python_session() {
        let params: EvalCodeParams =
            serde_json::from_str(r#"{"sandbox_id":"a","code":"1+1"}"#).unwrap();
        assert_eq!(params.language, "python");
        assert_eq!(params.session, "default");
        assert_eq!(params.timeout_seconds, None);
        assert!(!params.restart);
        let schema = serde_json::to_value(schemars::schema_for!(EvalCodeParams)).unwrap();
        assert_eq!(
            schema["required"],
            serde_json::json!(["sandbox_id", "code"])
        );
        assert_eq!(schema["properties"]["language"]["default"], "python");
    }

    #[test]
    fn misspelt_arguments_are_rejected() {
        let err = serde_json::from_str::<ExecParams>(r#"{"sandbox_id":"a","cmd":"ls"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cmd"), "{err}");
        let params: ExecParams =
            serde_json::from_str(r#"{"sandbox_id":"a","command":"ls","timeout":3}"#).unwrap();
        assert_eq!(params.timeout_seconds, Some(3));
        let params: ExecParams =
            serde_json::from_str(r#"{"sandbox_id":"a","argv":["ls","-l"]}"#).unwrap();
        assert_eq!((params.command, params.argv.unwrap().len()), (None, 2));
    }

    #[test]
    fn timeouts_default_below_client_deadlines() {
        assert_eq!(timeout_secs(None), Ok(DEFAULT_TIMEOUT_SECS));
        const { assert!(DEFAULT_TIMEOUT_SECS < 60) };
        assert_eq!(timeout_secs(Some(0)), Ok(EXEC_DEADLINE_SECS));
        assert!(timeout_secs(Some(301)).is_err());
    }

    #[test]
    fn exec_takes_a_shell_line_or_an_argv_but_not_both() {
        assert_eq!(
            command_of(Some("ls | wc".into()), None).unwrap(),
            Command::Shell("ls | wc".into())
        );
        let argv = vec!["echo".to_owned(), "a b".to_owned()];
        assert_eq!(
            command_of(None, Some(argv.clone())).unwrap(),
            Command::Argv(argv.clone())
        );
        let both = command_of(Some("ls".into()), Some(argv)).unwrap_err();
        assert!(both.message.contains("exactly one"), "{}", both.message);
        assert!(command_of(None, None).is_err());
        assert!(command_of(None, Some(Vec::new())).is_err());
        assert!(command_of(None, Some(vec![String::new()])).is_err());
    }
}
