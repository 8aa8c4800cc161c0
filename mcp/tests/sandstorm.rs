//! `sandbox-mcp --profile sandstorm` on real QEMU microVMs, driven by rmcp's MCP
//! client the way a sandstorm-mcp client drives sandstorm: the tool list is exactly
//! seed 001's; `spawn_sandboxes("python", n=2)` returns ids and tokens; `exec_command`
//! with an argv and the right token runs, a missing, wrong or other sandbox's token
//! is refused (by `branch_sandbox` and `kill_sandbox` too); `eval_code` keeps state in the warm interpreter; `wait_for_text` sees
//! a marker written later and times out with the file's tail; `branch_sandbox` makes
//! a tag that `spawn_sandboxes` fans out into two sandboxes with the source's files
//! and interpreter state (and tokens of their own); `list_snapshots` shows it;
//! `kill_sandbox` ends one. After the session no QEMU, relay or run folder is left.
//!
//! Needs the `python` template (scripts/test.sh builds it) besides what
//! `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the test
//! ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rmcp::model::CallToolResult;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_vmm::launcher::{Launcher, LauncherConfig, TemplateRef};
use serde_json::{json, Value};
use support::{assert_nothing_left, eventually, text, Folders, McpServer};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(240);

/// The template the test spawns from: sandstorm's eval is Python.
const PYTHON_TEMPLATE: &str = "python";

/// Seed 001's tools, sorted.
const SANDSTORM_TOOLS: [&str; 10] = [
    "branch_sandbox",
    "eval_code",
    "exec_command",
    "get_sandbox",
    "kill_sandbox",
    "list_sandboxes",
    "list_snapshots",
    "ping_sandbox",
    "spawn_sandboxes",
    "wait_for_text",
];

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "the_sandstorm_profile_end_to_end_with_tokens",
            run: || block_on(the_sandstorm_profile_end_to_end()),
        },
        VmTest {
            name: "a_first_sandstorm_session_on_a_template_without_python",
            run: || block_on(a_first_sandstorm_session_on_a_template_without_python()),
        },
    ])
}

/// A sandbox as spawn_sandboxes returns it: id and token.
#[derive(Debug, Clone)]
struct Spawned {
    id: String,
    token: String,
}

fn spawned(result: &Value) -> Vec<Spawned> {
    result["result"]
        .as_array()
        .unwrap_or_else(|| panic!("no result list: {result}"))
        .iter()
        .map(|item| Spawned {
            id: item["id"].as_str().unwrap().to_owned(),
            token: item["token"].as_str().unwrap().to_owned(),
        })
        .collect()
}

/// exec_command with `sandbox`'s token.
async fn exec(server: &McpServer, sandbox: &Spawned, args: &[&str]) -> Value {
    server
        .ok(
            "exec_command",
            json!({"sandbox_id": sandbox.id, "args": args, "sandbox_token": sandbox.token}),
        )
        .await
}

/// eval_code with `sandbox`'s token.
async fn eval(server: &McpServer, sandbox: &Spawned, code: &str) -> Value {
    server
        .ok(
            "eval_code",
            json!({"sandbox_id": sandbox.id, "code": code, "sandbox_token": sandbox.token}),
        )
        .await
}

/// The JSON of each text block, as a FastMCP client of sandstorm-mcp reads them.
fn text_json(result: &CallToolResult) -> Vec<Value> {
    result
        .content
        .iter()
        .map(|block| serde_json::from_str(&block.as_text().unwrap().text).unwrap())
        .collect()
}

fn require_python_template() {
    let launcher = Launcher::new(LauncherConfig::from_env().unwrap());
    if let Err(error) = launcher.template(&TemplateRef::Name(PYTHON_TEMPLATE.to_owned())) {
        panic!(
            "no {PYTHON_TEMPLATE} template ({}): build it with the README's \
             `sandbox-rootfs build --name {PYTHON_TEMPLATE} --base debian --packages …` \
             command (scripts/test.sh runs it), or set SANDBOX_SKIP_VM_TESTS=1 to skip the \
             microVM tests",
            sandbox_vmm::error_chain(&error)
        );
    }
}

/// Whether the python template is here and starts a Python session at boot.
fn python_template_starts_python() -> bool {
    let launcher = Launcher::new(LauncherConfig::from_env().unwrap());
    launcher
        .template(&TemplateRef::Name(PYTHON_TEMPLATE.to_owned()))
        .is_ok_and(|template| {
            template
                .image_config
                .sessions
                .iter()
                .any(|session| session.language == sandbox_protocol::Language::Python)
        })
}

async fn the_sandstorm_profile_end_to_end() {
    let Some(folders) = Folders::new("sandstorm", "profile") else {
        return;
    };
    require_python_template();
    let server = folders
        .server(&[
            "--profile",
            "sandstorm",
            "--template",
            PYTHON_TEMPLATE,
            "--pool",
            "1",
            "--max-sandboxes",
            "4",
        ])
        .await;

    // Exactly seed 001's tools.
    let tools = server.session().list_all_tools().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    assert_eq!(names, SANDSTORM_TOOLS);

    eventually(WARM_WITHIN, "a warm python VM", || async {
        let snapshots = server.ok("list_snapshots", json!({})).await;
        let rows = snapshots["result"].as_array().unwrap().clone();
        rows.into_iter()
            .find(|row| row["tag"] == PYTHON_TEMPLATE && row["warm"] == 1)
    })
    .await;

    // Two sandboxes, each with its own token.
    let started = Instant::now();
    let result = server
        .call(
            "spawn_sandboxes",
            json!({"snapshot_tag": PYTHON_TEMPLATE, "n": 2}),
        )
        .await;
    let spawn_took = started.elapsed();
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let body = result.structured_content.clone().unwrap();
    let pair = spawned(&body);
    assert_eq!(pair.len(), 2, "{body}");
    let (a, b) = (pair[0].clone(), pair[1].clone());
    assert_ne!(a.id, b.id);
    assert_ne!(a.token, b.token);
    for sandbox in &pair {
        assert_eq!(sandbox.token.len(), 64, "{sandbox:?}");
        assert!(sandbox.token.bytes().all(|c| c.is_ascii_hexdigit()));
    }
    // What FastMCP gives a sandstorm-mcp client: one JSON text block per sandbox.
    let blocks = text_json(&result);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[1]["token"].as_str(), Some(b.token.as_str()));
    assert_eq!(blocks[0]["snapshot_tag"], PYTHON_TEMPLATE);

    // Listings never show a token.
    let listed = server.call("list_sandboxes", json!({})).await;
    let rows = listed.structured_content.clone().unwrap();
    assert_eq!(rows["result"].as_array().unwrap().len(), 2, "{rows}");
    let got = server
        .call("get_sandbox", json!({"sandbox_id": a.id}))
        .await;
    let got_body = got.structured_content.clone().unwrap();
    assert_eq!(got_body["id"].as_str(), Some(a.id.as_str()));
    assert_eq!(got_body["state"], "running", "{got_body}");
    for (what, shown) in [
        ("list_sandboxes", format!("{rows}{}", text(&listed))),
        ("get_sandbox", format!("{got_body}{}", text(&got))),
    ] {
        assert!(!shown.contains("token"), "{what} shows a token: {shown}");
        assert!(
            !shown.contains(&a.token) && !shown.contains(&b.token),
            "{what} leaks a token"
        );
    }

    // exec_command: an argv, no shell; the right token only.
    let ran = exec(&server, &a, &["python3", "-c", "print(2+2)"]).await;
    assert_eq!(
        (ran["stdout"].as_str(), ran["exit_code"].as_i64()),
        (Some("4\n"), Some(0)),
        "{ran}"
    );
    let literal = exec(&server, &a, &["echo", "$HOME", "a;b"]).await;
    assert_eq!(literal["stdout"], "$HOME a;b\n", "{literal}");
    let failed = exec(&server, &a, &["sh", "-c", "echo no >&2; exit 3"]).await;
    assert_eq!(
        (failed["exit_code"].as_i64(), failed["stderr"].as_str()),
        (Some(3), Some("no\n"))
    );
    let call = |token: Option<&str>| {
        let mut args = json!({"sandbox_id": a.id, "args": ["id"]});
        if let Some(token) = token {
            args["sandbox_token"] = json!(token);
        }
        args
    };
    let missing = server.err("exec_command", call(None)).await;
    assert!(missing.contains("sandbox_token is required"), "{missing}");
    let others = server.err("exec_command", call(Some(&b.token))).await;
    assert!(others.contains("is not the token"), "{others}");
    let wrong = server
        .err("exec_command", call(Some(&"0".repeat(64))))
        .await;
    assert!(wrong.contains("is not the token"), "{wrong}");
    assert!(!wrong.contains(&a.token), "a refusal shows the token");
    let unknown = server
        .err(
            "exec_command",
            json!({"sandbox_id": "sbx-nope", "args": ["id"], "sandbox_token": a.token}),
        )
        .await;
    assert!(
        unknown.starts_with("Unknown sandbox_id") && unknown.contains("spawn_sandboxes"),
        "{unknown}"
    );
    let no_program = exec_error(&server, &a, &["no-such-program"]).await;
    assert!(no_program.contains("PATH"), "{no_program}");

    // eval_code: the warm interpreter keeps state; an exception is a result.
    let first = eval(&server, &a, "import os\nx = 40\nx + 2").await;
    assert_eq!(
        (first["result"].as_str(), first["exit_code"].as_i64()),
        (Some("42"), Some(0)),
        "{first}"
    );
    let kept = eval(&server, &a, "print('hi'); x").await;
    assert_eq!(
        (kept["result"].as_str(), kept["stdout"].as_str()),
        (Some("40"), Some("hi\n")),
        "{kept}"
    );
    let raised = eval(&server, &a, "1 / 0").await;
    assert_eq!(raised["exit_code"], 1, "{raised}");
    assert!(
        raised["error"]
            .as_str()
            .is_some_and(|e| e.contains("ZeroDivisionError")),
        "{raised}"
    );
    let refused = server
        .err("eval_code", json!({"sandbox_id": a.id, "code": "x"}))
        .await;
    assert!(refused.contains("sandbox_token is required"), "{refused}");

    // wait_for_text: a marker written a second later, and one that never comes.
    eval(
        &server,
        &a,
        "import threading, time\n\
         def later():\n    time.sleep(1)\n    open('/tmp/output', 'a').write('step 1\\nREADY\\n')\n\
         threading.Thread(target=later).start()",
    )
    .await;
    let wait = |marker: &str, timeout: f64, token: &str| {
        json!({"sandbox_id": a.id, "path": "/tmp/output", "marker": marker,
               "timeout_secs": timeout, "sandbox_token": token})
    };
    let found = server
        .ok("wait_for_text", wait("READY", 60.0, &a.token))
        .await;
    assert_eq!(
        (found["found"].as_bool(), found["last_excerpt"].as_str()),
        (Some(true), Some("READY")),
        "{found}"
    );
    let not_found = server
        .ok("wait_for_text", wait("NEVER", 0.5, &a.token))
        .await;
    assert_eq!(not_found["found"], false, "{not_found}");
    assert_eq!(not_found["last_excerpt"], "step 1\nREADY\n", "{not_found}");
    let refused = server
        .err("wait_for_text", wait("READY", 1.0, &b.token))
        .await;
    assert!(refused.contains("is not the token"), "{refused}");

    // ping_sandbox
    let ping = server
        .ok(
            "ping_sandbox",
            json!({"sandbox_id": b.id, "sandbox_token": b.token}),
        )
        .await;
    assert_eq!(ping["ok"], true, "{ping}");
    assert!(ping["round_trip_ms"].is_u64(), "{ping}");
    let refused = server
        .err("ping_sandbox", json!({"sandbox_id": b.id}))
        .await;
    assert!(refused.contains("sandbox_token is required"), "{refused}");

    // Regression (issue 22, item 13): branch_sandbox took no token, so anyone with
    // the MCP connection could branch A and spawn its state under a token of their
    // own (A's files, A's secrets). Without A's own token nothing is captured.
    let tag = format!("after-setup-{}", std::process::id());
    let branch_with = |token: Option<&str>| {
        let mut args = json!({"sandbox_id": a.id, "tag": tag});
        if let Some(token) = token {
            args["sandbox_token"] = json!(token);
        }
        args
    };
    let missing = server.err("branch_sandbox", branch_with(None)).await;
    assert!(missing.contains("sandbox_token is required"), "{missing}");
    let others = server
        .err("branch_sandbox", branch_with(Some(&b.token)))
        .await;
    assert!(others.contains("is not the token"), "{others}");
    let snapshots = server.ok("list_snapshots", json!({})).await;
    assert!(
        !snapshots.to_string().contains(&tag),
        "a refused branch made a snapshot: {snapshots}"
    );
    assert!(
        folders.checkpoints_left().is_empty(),
        "a refused branch left a checkpoint"
    );

    // branch_sandbox makes a tag; spawn_sandboxes fans it out into two.
    let started = Instant::now();
    let branch = server
        .ok("branch_sandbox", branch_with(Some(&a.token)))
        .await;
    let branch_took = started.elapsed();
    assert_eq!(
        (branch["tag"].as_str(), branch["status"].as_str()),
        (Some(tag.as_str()), Some("ready")),
        "{branch}"
    );
    let taken = server
        .err("branch_sandbox", branch_with(Some(&a.token)))
        .await;
    assert!(taken.contains("taken"), "{taken}");
    let template_name = server
        .err(
            "branch_sandbox",
            json!({"sandbox_id": a.id, "tag": PYTHON_TEMPLATE, "sandbox_token": a.token}),
        )
        .await;
    assert!(template_name.contains("taken"), "{template_name}");
    let both = server
        .err(
            "branch_sandbox",
            json!({"sandbox_id": a.id, "mode": "full", "diff": true, "sandbox_token": a.token}),
        )
        .await;
    assert!(both.contains("not both"), "{both}");
    let snapshots = server.ok("list_snapshots", json!({})).await;
    let row = snapshots["result"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["tag"] == tag.as_str())
        .unwrap_or_else(|| panic!("{tag} not listed: {snapshots}"))
        .clone();
    assert_eq!(row["kind"], "snapshot", "{row}");
    assert_eq!(row["source_sandbox_id"].as_str(), Some(a.id.as_str()));

    let started = Instant::now();
    let children = spawned(
        &server
            .ok("spawn_sandboxes", json!({"snapshot_tag": tag, "n": 2}))
            .await,
    );
    let fan_out_took = started.elapsed();
    assert_eq!(children.len(), 2);
    let all_tokens: HashSet<&str> = [&a, &b, &children[0], &children[1]]
        .iter()
        .map(|s| s.token.as_str())
        .collect();
    assert_eq!(all_tokens.len(), 4, "tokens repeat");
    for (i, child) in children.iter().enumerate() {
        // The source's files and its interpreter's state, at the branch.
        let output = exec(&server, child, &["cat", "/tmp/output"]).await;
        assert_eq!(output["stdout"], "step 1\nREADY\n", "{output}");
        let x = eval(&server, child, "x").await;
        assert_eq!(x["result"], "40", "{x}");
        exec(&server, child, &["touch", &format!("/tmp/child-{i}")]).await;
        let got = server
            .ok("get_sandbox", json!({"sandbox_id": child.id}))
            .await;
        assert_eq!(got["snapshot_tag"].as_str(), Some(tag.as_str()), "{got}");
    }
    // They diverge: each sees only its own file, the source neither.
    for (i, child) in children.iter().enumerate() {
        let other = format!("/tmp/child-{}", 1 - i);
        let absent = exec(&server, child, &["ls", &other]).await;
        assert_ne!(absent["exit_code"], 0, "{} sees {other}", child.id);
    }
    let absent = exec(&server, &a, &["ls", "/tmp/child-0"]).await;
    assert_ne!(absent["exit_code"], 0, "the source sees a child's file");
    let source_token_on_child = server
        .err(
            "exec_command",
            json!({"sandbox_id": children[0].id, "args": ["id"], "sandbox_token": a.token}),
        )
        .await;
    assert!(
        source_token_on_child.contains("is not the token"),
        "{source_token_on_child}"
    );

    // Full (four of four): one more is refused, naming what frees room.
    let no_room = server
        .err("spawn_sandboxes", json!({"snapshot_tag": tag, "n": 1}))
        .await;
    assert!(
        no_room.contains("room") && no_room.contains("kill_sandbox"),
        "{no_room}"
    );
    let unknown = server
        .err("spawn_sandboxes", json!({"snapshot_tag": "no-such-tag"}))
        .await;
    assert!(
        unknown.contains("Unknown snapshot_tag") && unknown.contains(PYTHON_TEMPLATE),
        "{unknown}"
    );
    let netns = server
        .err(
            "spawn_sandboxes",
            json!({"snapshot_tag": PYTHON_TEMPLATE, "per_child_netns": true}),
        )
        .await;
    assert!(netns.contains("no network"), "{netns}");

    // kill_sandbox: with the sandbox's own token only (issue 22, item 13: it took
    // none, so anyone could end anyone's sandbox).
    let kill_with = |token: Option<&str>| {
        let mut args = json!({"sandbox_id": children[1].id});
        if let Some(token) = token {
            args["sandbox_token"] = json!(token);
        }
        args
    };
    let missing = server.err("kill_sandbox", kill_with(None)).await;
    assert!(missing.contains("sandbox_token is required"), "{missing}");
    let others = server
        .err("kill_sandbox", kill_with(Some(&children[0].token)))
        .await;
    assert!(others.contains("is not the token"), "{others}");
    let alive = exec(&server, &children[1], &["true"]).await;
    assert_eq!(alive["exit_code"], 0, "a refused kill ended it: {alive}");
    let killed = server
        .ok("kill_sandbox", kill_with(Some(&children[1].token)))
        .await;
    assert_eq!(
        (killed["id"].as_str(), killed["killed"].as_bool()),
        (Some(children[1].id.as_str()), Some(true))
    );
    let gone = server
        .err("get_sandbox", json!({"sandbox_id": children[1].id}))
        .await;
    assert!(gone.contains("was killed"), "{gone}");
    let again = server
        .err("kill_sandbox", kill_with(Some(&children[1].token)))
        .await;
    assert!(again.contains("was killed"), "{again}");
    let listed = server.ok("list_sandboxes", json!({})).await;
    assert_eq!(listed["result"].as_array().unwrap().len(), 3, "{listed}");

    // A second branch keeps only what changed since the first (mode diff, the
    // default), and a sandbox spawned from it has the change; mode full writes the
    // whole memory again.
    exec(&server, &a, &["sh", "-c", "echo step 2 >> /tmp/output"]).await;
    let branch_as = |tag: &str, mode: &str| json!({"sandbox_id": a.id, "tag": tag, "mode": mode, "sandbox_token": a.token});
    let (diff_tag, full_tag) = (format!("{tag}-diff"), format!("{tag}-full"));
    let diff = server
        .ok("branch_sandbox", branch_as(&diff_tag, "diff"))
        .await;
    let full = server
        .ok("branch_sandbox", branch_as(&full_tag, "full"))
        .await;
    let bytes = |reply: &Value| reply["bytes_on_disk"].as_u64().unwrap_or(0);
    eprintln!(
        "branch_sandbox bytes on disk: first {}, diff {}, full {}",
        bytes(&branch),
        bytes(&diff),
        bytes(&full)
    );
    assert!(
        bytes(&diff) * 3 < bytes(&branch) && bytes(&full) * 4 > bytes(&branch) * 3,
        "first {branch}, diff {diff}, full {full}"
    );
    let from_diff = spawned(
        &server
            .ok("spawn_sandboxes", json!({"snapshot_tag": diff_tag, "n": 1}))
            .await,
    );
    let output = exec(&server, &from_diff[0], &["cat", "/tmp/output"]).await;
    assert_eq!(output["stdout"], "step 1\nREADY\nstep 2\n", "{output}");

    eprintln!(
        "spawn of 2 python: {spawn_took:?}; branch_sandbox: {branch_took:?} (paused {} ms); \
         spawn of 2 from the tag: {fan_out_took:?}",
        branch["pause_ms"]
    );
    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&folders.run);
    // The tags outlive the session, as sandstorm's snapshots do.
    assert_eq!(folders.checkpoints_left().len(), 3);
}

/// exec_command that must fail; its text.
async fn exec_error(server: &McpServer, sandbox: &Spawned, args: &[&str]) -> String {
    server
        .err(
            "exec_command",
            json!({"sandbox_id": sandbox.id, "args": args, "sandbox_token": sandbox.token}),
        )
        .await
}

/// What a first session on the `default` template (busybox, no Python) meets.
/// Regressions: results as large as the output (3 MB of output gave a 2 MB result,
/// 3 MB of NUL bytes a 12 MB one); an empty listing with no text block; a
/// non-executable file reported as "may not do this"; eval_code on a template
/// without Python sent to `restart`.
async fn a_first_sandstorm_session_on_a_template_without_python() {
    let Some(folders) = Folders::new("sandstorm", "sized") else {
        return;
    };
    let server = folders
        .server(&[
            "--profile",
            "sandstorm",
            "--template",
            "default",
            "--pool",
            "0",
            "--max-sandboxes",
            "1",
        ])
        .await;
    let empty = server.call("list_sandboxes", json!({})).await;
    assert_eq!(
        text_json(&empty),
        [json!([])],
        "one text block: the empty list"
    );
    assert_eq!(empty.structured_content.unwrap(), json!({"result": []}));
    let result = server
        .call("spawn_sandboxes", json!({"snapshot_tag": "default"}))
        .await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    let sandbox = spawned(&result.structured_content.unwrap())[0].clone();
    let call = |args: Value| {
        let server = &server;
        let sandbox = &sandbox;
        async move {
            server
                .call(
                    "exec_command",
                    json!({"sandbox_id": sandbox.id, "args": args,
                           "sandbox_token": sandbox.token}),
                )
                .await
        }
    };

    // 3 MB of printable output and 3 MB of NUL bytes: each stream at most 16 KiB as
    // JSON encodes it, in the text and in the structured part.
    for (what, script) in [
        ("printable", "yes 0123456789abcdef | head -c 3000000"),
        ("NUL bytes", "head -c 3000000 /dev/zero"),
    ] {
        let result = call(json!(["sh", "-c", script])).await;
        assert_ne!(result.is_error, Some(true), "{what}: {}", text(&result));
        let (wire, text_bytes, structured) = support::sizes(&result);
        eprintln!("{what}: result {wire} bytes (text {text_bytes}, structured {structured})");
        assert!(wire < 80 * 1024, "{what}: a {wire}-byte result");
        let body = result.structured_content.unwrap();
        assert_eq!(body["truncated"], true, "{what}");
        assert_eq!(body["exit_code"], 0, "{what}");
        let stdout = serde_json::to_string(&body["stdout"]).unwrap();
        assert!(
            stdout.len() <= 16 * 1024 + 2,
            "{what}: stdout {} bytes",
            stdout.len()
        );
        assert!(stdout.contains("omitted"), "{what}: the cut is marked");
    }

    // A failed command keeps the end of its output, where the error is.
    let failed = call(json!([
        "sh",
        "-c",
        "seq 1 200000; echo 'error: the last line' >&2; exit 3"
    ]))
    .await;
    assert_ne!(
        failed.is_error,
        Some(true),
        "a non-zero exit is a normal result"
    );
    let body = failed.structured_content.unwrap();
    assert_eq!(body["exit_code"], 3);
    let stdout = body["stdout"].as_str().unwrap();
    assert!(
        stdout.ends_with("199999\n200000\n"),
        "the tail: {}",
        &stdout[stdout.len() - 40..]
    );
    assert!(!stdout.starts_with("1\n"), "not the head");
    assert_eq!(body["stderr"], "error: the last line\n");

    // args as a shell command line, as models write it (regression: a string failed
    // to deserialize), next to sandstorm's list.
    let line = call(json!("echo one two three | wc -w; echo err >&2; exit 4")).await;
    assert_ne!(line.is_error, Some(true), "{}", text(&line));
    let line = line.structured_content.unwrap();
    assert_eq!(
        (
            line["stdout"].as_str().map(str::trim),
            line["exit_code"].as_i64()
        ),
        (Some("3"), Some(4)),
        "{line}"
    );
    assert_eq!(line["stderr"], "err\n");
    let empty = call(json!("  ")).await;
    assert_eq!(empty.is_error, Some(true));
    assert!(
        text(&empty).contains("shell command line"),
        "{}",
        text(&empty)
    );

    // A file that is not executable is named as such.
    let refused = call(json!(["/etc/passwd"])).await;
    assert_eq!(refused.is_error, Some(true));
    let refused = text(&refused);
    assert!(refused.contains("not executable"), "{refused}");
    assert!(!refused.contains("may not do this"), "{refused}");

    // eval_code says the template has no Python, and names one that has.
    let no_python = server
        .err(
            "eval_code",
            json!({"sandbox_id": sandbox.id, "code": "1+1", "sandbox_token": sandbox.token}),
        )
        .await;
    assert!(
        no_python.contains("\"default\" has no python3"),
        "{no_python}"
    );
    assert!(!no_python.contains("restart"), "{no_python}");
    if python_template_starts_python() {
        assert!(
            no_python.contains(&format!("snapshot_tag \"{PYTHON_TEMPLATE}\"")),
            "{no_python}"
        );
    }

    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&folders.run);
}
