//! Results sized for a model, files of any size, and MCP as clients expect it:
//! `sandbox-mcp --agent URL` against the real agent on a throwaway Unix socket,
//! driven by rmcp's MCP client. Output cut to `max_bytes` (the tail of a failure),
//! logs in the order they were written, a 20 MiB binary file in parts both ways,
//! images as image content, progress notifications during a long exec, requests
//! over a size limit, the hints that used to mislead, and standard schemas.
//!
//! `result_sizes_per_call` (ignored) prints the bytes a typical call costs; run it
//! with `SANDBOX_MCP_BIN` pointing at another build to compare.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use base64::Engine as _;
use sandbox_tests::TestAgent;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::{eventually, McpServer};

async fn attached(agent: &TestAgent) -> McpServer {
    let log = agent.dir().join("mcp.log");
    McpServer::start(&["--agent", &agent.url()], &[], &log).await
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_mib_binary_file_goes_in_and_out_in_parts_intact() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let path = agent.dir().join("blob.bin").display().to_string();
    let data = support::noise(20 * 1024 * 1024);
    let part = 4 * 1024 * 1024;

    for (n, chunk) in data.chunks(part).enumerate() {
        let offset = n * part;
        let more = offset + chunk.len() < data.len();
        let wrote = server
            .ok(
                "write_file",
                json!({"sandbox_id": "attached", "path": path, "encoding": "base64",
                       "content": b64().encode(chunk), "offset": offset, "more": more,
                       "mode": "600"}),
            )
            .await;
        assert_eq!(wrote["complete"], !more, "{wrote}");
        if more {
            assert_eq!(wrote["next_offset"], offset + chunk.len(), "{wrote}");
            assert!(
                !std::path::Path::new(&path).exists(),
                "the file appears only with the last part"
            );
        } else {
            assert_eq!(wrote["bytes"], data.len(), "{wrote}");
            assert_eq!(wrote["mode"], "600", "{wrote}");
        }
    }
    assert_eq!(sha256(&std::fs::read(&path).unwrap()), sha256(&data));
    let sum = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": format!("sha256sum {path}")}),
        )
        .await;
    assert!(sum["stdout"].as_str().unwrap().starts_with(&sha256(&data)));

    let mut back = Vec::new();
    let mut offset = 0u64;
    loop {
        let read = server
            .ok(
                "read_file",
                json!({"sandbox_id": "attached", "path": path, "encoding": "base64",
                       "offset": offset, "max_bytes": part}),
            )
            .await;
        assert_eq!(read["size"], data.len());
        back.extend(b64().decode(read["content"].as_str().unwrap()).unwrap());
        match read["next_offset"].as_u64() {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert_eq!(sha256(&back), sha256(&data));

    // The tail by a negative offset; a part out of order is refused with the offset
    // to send; a whole 6 MiB file fits one call (it used to fail past 4 MiB, with
    // advice to destroy the sandbox).
    let tail = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": path, "encoding": "base64",
                   "offset": -16}),
        )
        .await;
    assert_eq!(
        b64().decode(tail["content"].as_str().unwrap()).unwrap(),
        &data[data.len() - 16..]
    );
    let started = server
        .ok(
            "write_file",
            json!({"sandbox_id": "attached", "path": path, "content": "abc", "more": true}),
        )
        .await;
    assert_eq!(started["next_offset"], 3);
    let gap = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": path, "content": "x", "offset": 9}),
        )
        .await;
    assert!(gap.contains("send the part at offset 3"), "{gap}");
    let whole = format!("{}/six.bin", agent.dir().display());
    let six = support::noise(6 * 1024 * 1024);
    let wrote = server
        .ok(
            "write_file",
            json!({"sandbox_id": "attached", "path": whole, "encoding": "base64",
                   "content": b64().encode(&six)}),
        )
        .await;
    assert_eq!(wrote["bytes"], six.len());
    assert_eq!(sha256(&std::fs::read(&whole).unwrap()), sha256(&six));
    let bad = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": whole, "encoding": "base64",
                   "content": "not base64!"}),
        )
        .await;
    assert!(bad.contains("not valid base64"), "{bad}");
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_mib_of_output_is_cut_to_max_bytes_keeping_the_error() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    // 3.0 MiB of numbered lines, then the error, then a failing exit.
    let command = "seq 1 470000; echo 'error: boom'; exit 2";
    let result = server
        .call(
            "exec",
            json!({"sandbox_id": "attached", "command": command}),
        )
        .await;
    let (wire, text, _) = support::sizes(&result);
    let failed = result.structured_content.clone().unwrap();
    assert_eq!(failed["exit_code"], 2);
    assert_eq!(failed["stdout_bytes"], 3_178_907);
    assert_eq!(failed["kept"], "tail", "a failure keeps its tail: {failed}");
    let stdout = failed["stdout"].as_str().unwrap();
    assert!(
        stdout.ends_with("469999\n470000\nerror: boom\n"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with("[... 3.0 MiB omitted ...]\n"),
        "starts on a line"
    );
    assert!(stdout.len() <= 16 * 1024 + 40, "{}", stdout.len());
    assert!(wire < 40 * 1024, "a default result costs {wire} bytes");
    assert!(text < 20 * 1024, "{text}");

    let tail = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": command,
                   "max_bytes": 1_048_576, "keep": "tail"}),
        )
        .await;
    let stdout = tail["stdout"].as_str().unwrap();
    // max_bytes counts the bytes as JSON encodes them: each newline of these short
    // lines takes two.
    let encoded = serde_json::to_string(stdout).unwrap().len() - 2;
    assert!(encoded <= 1_048_576 && encoded > 1_040_000, "{encoded}");
    assert!(stdout.ends_with("error: boom\n"));
    let head = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": command, "max_bytes": 100,
                   "keep": "head"}),
        )
        .await;
    assert!(
        head["stdout"].as_str().unwrap().starts_with("1\n2\n3\n"),
        "{head}"
    );
    // A success keeps both ends.
    let success = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "seq 1 470000"}),
        )
        .await;
    assert_eq!(success["kept"], "head_tail");
    let stdout = success["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("1\n2\n") && stdout.ends_with("470000\n"));
    assert!(stdout.contains(" omitted ...]\n"), "{stdout}");
    let bad = server
        .err(
            "exec",
            json!({"sandbox_id": "attached", "command": "true", "max_bytes": 2_000_000}),
        )
        .await;
    assert!(bad.contains("read_file"), "{bad}");
    // Regression: 3 MB of NUL bytes cut to 16 KiB cost 197 KB, JSON writing each as
    // six (\u0000) in both parts. max_bytes bounds the encoded bytes.
    let zeros = server
        .call(
            "exec",
            json!({"sandbox_id": "attached", "command": "head -c 3000000 /dev/zero; exit 1"}),
        )
        .await;
    let (wire, _, _) = support::sizes(&zeros);
    assert!(wire < 40 * 1024, "NUL bytes: a {wire}-byte result");
    let zeros = zeros.structured_content.unwrap();
    assert_eq!(
        (zeros["stdout_bytes"].as_u64(), zeros["kept"].as_str()),
        (Some(3_000_000), Some("tail"))
    );
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_keep_the_written_order_and_default_to_the_newest_16_kib() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached", "command":
                "for i in 1 2 3; do echo out$i; sleep 0.2; echo err$i >&2; sleep 0.2; done"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let logs = eventually(Duration::from_secs(10), "the job to end", || async {
        let logs = server
            .ok("logs", json!({"sandbox_id": "attached", "pid": pid}))
            .await;
        (logs["running"] == false).then_some(logs)
    })
    .await;
    let runs: Vec<(String, String)> = logs["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            (
                run["stream"].as_str().unwrap().to_owned(),
                run["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = (1..=3)
        .flat_map(|i| {
            [
                ("stdout".to_owned(), format!("out{i}\n")),
                ("stderr".to_owned(), format!("err{i}\n")),
            ]
        })
        .collect();
    assert_eq!(runs, expected, "{logs}");

    // 40000 lines (229 KiB): the default is the newest 16 KiB, on a line start;
    // from cursor 0 the oldest, to page on.
    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached", "command": "seq 1 40000"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let logs = eventually(Duration::from_secs(10), "seq to end", || async {
        let logs = server
            .ok("logs", json!({"sandbox_id": "attached", "pid": pid}))
            .await;
        (logs["running"] == false).then_some(logs)
    })
    .await;
    let text = logs["output"][0]["text"].as_str().unwrap();
    assert!(
        text.len() <= 16 * 1024 && text.len() > 15 * 1024,
        "{}",
        text.len()
    );
    assert!(text.ends_with("39999\n40000\n"));
    assert!(text.starts_with(|c: char| c.is_ascii_digit()));
    assert_eq!(logs["end"], 228_894);
    assert_eq!(logs["next_cursor"], 228_894);
    assert_eq!(
        logs["omitted_bytes"].as_u64().unwrap() + text.len() as u64,
        228_894
    );
    let page = server
        .ok(
            "logs",
            json!({"sandbox_id": "attached", "pid": pid, "cursor": 0, "max_bytes": 1000}),
        )
        .await;
    let first = page["output"][0]["text"].as_str().unwrap();
    assert!(
        first.starts_with("1\n2\n3\n") && first.ends_with('\n'),
        "{first}"
    );
    assert_eq!(page["next_cursor"], first.len());
    assert!(page["omitted_bytes"].as_u64().unwrap() > 200_000);
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_exec_reports_its_last_lines_as_progress() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let (result, progress) = server
        .call_with_progress(
            "exec",
            json!({"sandbox_id": "attached",
                   "command": "for i in 1 2 3 4; do echo step $i; sleep 1; done"}),
        )
        .await;
    assert_ne!(result.is_error, Some(true));
    support::assert_exec_progress(&progress);
    // A quick call sends none.
    let (_, quick) = server
        .call_with_progress("exec", json!({"sandbox_id": "attached", "command": "true"}))
        .await;
    assert!(quick.is_empty(), "{quick:?}");
    server.disconnect(Duration::from_secs(10)).await;
}

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_read_as_image_content() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let path = agent.dir().join("dot.png").display().to_string();
    server
        .ok(
            "write_file",
            json!({"sandbox_id": "attached", "path": path, "content": PNG,
                   "encoding": "base64"}),
        )
        .await;
    let result = server
        .call("read_file", json!({"sandbox_id": "attached", "path": path}))
        .await;
    assert_ne!(result.is_error, Some(true));
    let image = result
        .content
        .iter()
        .find_map(|block| block.as_image())
        .expect("an image block");
    assert_eq!(image.mime_type, "image/png");
    assert_eq!(image.data, PNG);
    // Regression: the structured part had `"content": ""`, so a client that reads
    // only structuredContent got no image at all.
    let body = result.structured_content.unwrap();
    assert_eq!(body["encoding"], "image");
    assert_eq!(body["mime_type"], "image/png");
    assert_eq!(body["content"], PNG);
    // Its bytes, when asked.
    let bytes = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": path, "as_image": false,
                   "encoding": "base64"}),
        )
        .await;
    assert_eq!(bytes["content"], PNG);
    let text_file = agent.dir().join("a.txt").display().to_string();
    std::fs::write(&text_file, "text").unwrap();
    let not_image = server
        .err(
            "read_file",
            json!({"sandbox_id": "attached", "path": text_file, "as_image": true}),
        )
        .await;
    assert!(not_image.contains("not a PNG"), "{not_image}");
    server.disconnect(Duration::from_secs(10)).await;
}

/// Regression: 1 KiB of binary read with the defaults came back as 3.5 KB of U+FFFD
/// text, its bytes lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_content_read_with_the_defaults_comes_as_base64() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let path = agent.dir().join("blob.bin").display().to_string();
    let data: Vec<u8> = (0..1024u32)
        .map(|n| u8::try_from(n * 7 % 256).unwrap())
        .collect();
    std::fs::write(&path, &data).unwrap();
    let result = server
        .call("read_file", json!({"sandbox_id": "attached", "path": path}))
        .await;
    assert_ne!(result.is_error, Some(true), "{}", support::text(&result));
    let body = result.structured_content.clone().unwrap();
    assert_eq!(body["encoding"], "base64", "{body}");
    assert_eq!(body["binary"], true);
    assert_eq!(body["lossy"], false);
    let content = body["content"].as_str().unwrap();
    assert_eq!(b64().decode(content).unwrap(), data);
    let text = support::text(&result);
    assert!(text.contains("binary content"), "{text}");
    assert!(
        text.contains(content),
        "the text carries the bytes too: {text}"
    );
    // Text asked for is text, replaced where it is not.
    let lossy = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": path, "encoding": "utf-8"}),
        )
        .await;
    assert_eq!(
        (lossy["encoding"].as_str(), lossy["lossy"].as_bool()),
        (Some("utf-8"), Some(true))
    );
    // A text file is still text, in parts too (a part may end inside a character).
    let text_path = agent.dir().join("text.txt").display().to_string();
    std::fs::write(&text_path, "caf\u{e9}\n".repeat(100)).unwrap();
    let part = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": text_path, "offset": 0, "max_bytes": 4}),
        )
        .await;
    assert_eq!(
        (part["encoding"].as_str(), part["content"].as_str()),
        (Some("utf-8"), Some("caf"))
    );
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_over_the_limit_is_refused_with_what_to_do_and_the_sandbox_goes_on() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let stdin = "a".repeat(5 * 1024 * 1024);
    let refused = server
        .err(
            "exec",
            json!({"sandbox_id": "attached", "command": "wc -c", "stdin": stdin}),
        )
        .await;
    assert!(refused.contains("at most 3.0 MiB"), "{refused}");
    assert!(
        refused.contains("write_file") && refused.contains("< FILE"),
        "{refused}"
    );
    assert!(
        !refused.contains("release"),
        "the sandbox is fine: {refused}"
    );
    let fits = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "wc -c",
                   "stdin": "a".repeat(3 * 1024 * 1024)}),
        )
        .await;
    assert_eq!(fits["stdout"].as_str().unwrap().trim(), "3145728");
    server.disconnect(Duration::from_secs(10)).await;
}

/// Regressions: each of these hints named the wrong tool or a wrong cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_names_a_real_next_step() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let dir = agent.dir().display().to_string();
    let file = format!("{dir}/plain.txt");
    std::fs::write(&file, "x").unwrap();

    // write_file onto a directory talked about read_file.
    let onto_dir = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": dir, "content": "x"}),
        )
        .await;
    assert!(onto_dir.contains("write_file writes"), "{onto_dir}");
    assert!(!onto_dir.contains("read_file"), "{onto_dir}");
    let parts_onto_dir = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": dir, "content": "x", "more": true}),
        )
        .await;
    assert!(
        parts_onto_dir.contains("is a directory"),
        "{parts_onto_dir}"
    );
    // list_dir on a file said "read_file reads regular files".
    let on_file = server
        .err("list_dir", json!({"sandbox_id": "attached", "path": file}))
        .await;
    assert!(on_file.contains("list_dir lists directories"), "{on_file}");
    assert!(!on_file.contains("read_file reads"), "{on_file}");
    // A cursor past the end said "paths must be absolute".
    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached", "command": "echo hi"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let past = server
        .err(
            "logs",
            json!({"sandbox_id": "attached", "pid": pid, "cursor": 1_000_000}),
        )
        .await;
    assert!(past.contains("next_cursor"), "{past}");
    assert!(!past.contains("absolute"), "{past}");
    // A write whose parent is missing says how to make it.
    let no_parent = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": format!("{dir}/a/b"), "content": "x"}),
        )
        .await;
    assert!(no_parent.contains("mkdir -p"), "{no_parent}");
    // It said so twice ("... does not exist. Its parent directory does not exist").
    assert_eq!(
        no_parent.matches("does not exist").count(),
        1,
        "{no_parent}"
    );
    // A program that is not executable said "The sandbox user may not do this".
    let not_executable = server
        .err("exec", json!({"sandbox_id": "attached", "argv": [file]}))
        .await;
    assert!(
        not_executable.contains("not executable"),
        "{not_executable}"
    );
    assert!(
        !not_executable.contains("may not do this"),
        "{not_executable}"
    );
    // An offset past the end of a file says how big it is.
    let beyond = server
        .err(
            "read_file",
            json!({"sandbox_id": "attached", "path": file, "offset": 5}),
        )
        .await;
    assert!(beyond.contains("has 1 bytes"), "{beyond}");
    server.disconnect(Duration::from_secs(10)).await;
}

/// Regression: every exec stayed listed for 5 minutes, with no filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_lists_running_processes_unless_asked_for_all() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    server
        .ok("exec", json!({"sandbox_id": "attached", "command": "true"}))
        .await;
    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached", "command": "exec sleep 60"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let running = server.ok("ps", json!({"sandbox_id": "attached"})).await;
    let pids: Vec<i64> = running["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["pid"].as_i64().unwrap())
        .collect();
    assert_eq!(pids, [pid], "{running}");
    assert_eq!(running["hidden"], 1);
    let all = server
        .ok(
            "ps",
            json!({"sandbox_id": "attached", "running_only": false}),
        )
        .await;
    assert_eq!(all["processes"].as_array().unwrap().len(), 2);
    let execs = server
        .ok(
            "ps",
            json!({"sandbox_id": "attached", "running_only": false, "kind": "exec"}),
        )
        .await;
    assert_eq!(execs["processes"][0]["kind"], "exec");
    assert_eq!(execs["processes"].as_array().unwrap().len(), 1);
    server
        .ok(
            "kill",
            json!({"sandbox_id": "attached", "pid": pid, "signal": 9}),
        )
        .await;
    server.disconnect(Duration::from_secs(10)).await;
}

/// Formats JSON Schema defines; anything else (uint64, int32...) makes clients warn.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
    "regex",
];

fn formats(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(format)) = object.get("format") {
                found.push(format.clone());
            }
            object.values().for_each(|v| formats(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| formats(v, found)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_uses_standard_formats_and_every_tool_has_hints() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let tools = server.session().list_all_tools().await.unwrap();
    for tool in &tools {
        let mut found = Vec::new();
        formats(&Value::Object((*tool.input_schema).clone()), &mut found);
        if let Some(output) = &tool.output_schema {
            formats(&Value::Object((**output).clone()), &mut found);
        }
        found.retain(|format| !STANDARD_FORMATS.contains(&format.as_str()));
        assert!(found.is_empty(), "{}: {found:?}", tool.name);
        assert!(tool.title.is_some(), "{} has no title", tool.name);
        let hints = tool.annotations.as_ref().unwrap();
        assert!(
            hints.read_only_hint.is_some() && hints.open_world_hint.is_some(),
            "{}",
            tool.name
        );
    }
    let exec = tools.iter().find(|t| t.name == "exec").unwrap();
    let schema = serde_json::to_value(&*exec.input_schema).unwrap();
    assert_eq!(schema["properties"]["max_bytes"]["minimum"], 0, "{schema}");
    assert!(exec
        .description
        .as_deref()
        .unwrap()
        .contains("timeout_seconds (default 55"));
    server.disconnect(Duration::from_secs(10)).await;
}

/// The bytes typical calls cost, printed as the table in mcp/README.md (`cargo test
/// -p sandbox-mcp --test results -- --nocapture result_sizes`), and held to the
/// sizes a model's context can afford: the defaults cut large output to 16 KiB per
/// stream (64 KiB for a file), repeated at most once in text and structuredContent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_sizes_per_call() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let dir = agent.dir().display().to_string();
    let mut rows = Vec::new();

    let exec = server
        .call(
            "exec",
            json!({"sandbox_id": "attached",
                   "command": "yes 'a line of build output, 40 bytes long' | head -c 1048576"}),
        )
        .await;
    rows.push(("exec, 1 MiB of stdout", support::sizes(&exec)));

    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached",
                   "command": "yes 'a server log line, 30 bytes' | head -c 1000000"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    eventually(Duration::from_secs(10), "the writer to end", || async {
        let ps = server.ok("ps", json!({"sandbox_id": "attached"})).await;
        let running = ps["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|row| row["pid"] == pid && row["state"] == "running");
        (!running).then_some(())
    })
    .await;
    let logs = server
        .call("logs", json!({"sandbox_id": "attached", "pid": pid}))
        .await;
    rows.push(("logs, no cursor (ring full)", support::sizes(&logs)));

    let source = format!("{dir}/source.txt");
    let line = "    let value = compute(input, &mut state); // a line of code\n";
    std::fs::write(&source, line.repeat(100 * 1024 / line.len())).unwrap();
    let read = server
        .call(
            "read_file",
            json!({"sandbox_id": "attached", "path": source}),
        )
        .await;
    rows.push(("read_file, 100 KiB text file", support::sizes(&read)));

    println!("| call | result on the wire | text content | structuredContent |");
    println!("| --- | ---: | ---: | ---: |");
    for (call, (wire, text, structured)) in &rows {
        println!("| {call} | {wire} | {text} | {structured} |");
    }
    // Before the defaults these were 2.15 MB, 543 KB and 208 KB.
    let bounds = [64 * 1024, 64 * 1024, 160 * 1024];
    for ((call, (wire, _, _)), bound) in rows.iter().zip(bounds) {
        assert!(
            *wire <= bound,
            "{call}: {wire} bytes on the wire, over {bound}"
        );
    }
    server.disconnect(Duration::from_secs(10)).await;
}
