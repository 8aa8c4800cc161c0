//! `sandbox-mcp --agent URL` against the real agent on a throwaway Unix socket,
//! driven by rmcp's MCP client over the server's stdio: every tool, its edge
//! cases, concurrency, and the server's own exit on disconnect and on SIGTERM.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use sandbox_tests::TestAgent;
use serde_json::json;
use support::{eventually, McpServer, RawServer};

async fn attached(agent: &TestAgent) -> McpServer {
    let log = agent.dir().join("mcp.log");
    McpServer::start(&["--agent", &agent.url()], &[], &log).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_list_is_the_documented_one_with_schemas() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let tools = server.session().list_all_tools().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "create_sandbox",
            "eval_code",
            "exec",
            "expose_port",
            "get_sandbox",
            "kill",
            "list_dir",
            "list_sandboxes",
            "logs",
            "node_info",
            "ping_sandbox",
            "ps",
            "read_file",
            "release",
            "spawn",
            "wait_for_text",
            "write_file"
        ]
    );
    let exec = tools.iter().find(|t| t.name == "exec").unwrap();
    let schema = serde_json::to_value(&*exec.input_schema).unwrap();
    assert_eq!(schema["required"], json!(["sandbox_id"]));
    assert!(schema["properties"]["command"].is_object());
    assert!(schema["properties"]["argv"].is_object());
    assert!(schema["properties"]["timeout_seconds"].is_object());
    assert!(exec.output_schema.is_some());

    // The fleet tools that describe work on the attached agent too.
    let listed = server.ok("list_sandboxes", json!({})).await;
    assert_eq!(listed["sandboxes"][0]["sandbox_id"], "attached", "{listed}");
    assert!(listed["sandboxes"][0]["deadline"].is_null(), "{listed}");
    let ping = server
        .ok("ping_sandbox", json!({"sandbox_id": "attached"}))
        .await;
    assert_eq!(ping["state"], "running", "{ping}");
    assert!(ping["round_trip_ms"].is_u64(), "{ping}");
    let argv = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "argv": ["printf", "%s", "a b $HOME"]}),
        )
        .await;
    assert_eq!(argv["stdout"], "a b $HOME", "{argv}");
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_spawn_ps_logs_and_kill() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;

    let info = server.ok("node_info", json!({})).await;
    assert_eq!(info["mode"], "attach");
    assert_eq!(info["claims"][0]["sandbox_id"], "attached");

    let run = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "echo out; echo err >&2; exit 3"}),
        )
        .await;
    assert_eq!(run["stdout"], "out\n");
    assert_eq!(run["stderr"], "err\n");
    assert_eq!(run["exit_code"], 3, "a non-zero exit is a normal result");
    assert_eq!(run["truncated"], false);
    assert!(run["error"].is_null());

    let dir = agent.dir().display().to_string();
    let run = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "pwd; echo $GREETING; cat",
                   "cwd": dir, "env": {"GREETING": "hello"}, "stdin": "from stdin"}),
        )
        .await;
    assert_eq!(run["stdout"], format!("{dir}\nhello\nfrom stdin"));

    let killed = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "kill -9 $$"}),
        )
        .await;
    assert_eq!(killed["signal"], 9);
    assert_eq!(killed["exit_code"], 137);

    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached", "command": "echo started; exec sleep 60"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let ps = server.ok("ps", json!({"sandbox_id": "attached"})).await;
    let row = ps["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap()
        .clone();
    assert_eq!(row["state"], "running");
    assert_eq!(row["kind"], "spawn");
    assert_eq!(row["command"], "echo started; exec sleep 60");

    let logs = eventually(Duration::from_secs(5), "spawned output", || async {
        let logs = server
            .ok("logs", json!({"sandbox_id": "attached", "pid": pid}))
            .await;
        (logs["output"][0]["text"] == "started\n").then_some(logs)
    })
    .await;
    assert_eq!(logs["running"], true);
    let cursor = logs["next_cursor"].as_u64().unwrap();
    let newer = server
        .ok(
            "logs",
            json!({"sandbox_id": "attached", "pid": pid, "cursor": cursor}),
        )
        .await;
    assert_eq!(
        newer["output"],
        json!([]),
        "a cursor returns only newer output"
    );

    let kill = server
        .ok("kill", json!({"sandbox_id": "attached", "pid": pid}))
        .await;
    assert_eq!(kill["signal"], 15);
    assert_eq!(kill["sent"], true);
    assert_eq!(kill["already_exited"], false);
    let ended = eventually(Duration::from_secs(5), "the process to exit", || async {
        let logs = server
            .ok("logs", json!({"sandbox_id": "attached", "pid": pid}))
            .await;
        (logs["running"] == false).then_some(logs)
    })
    .await;
    assert_eq!(ended["signal"], 15);
    // Killing an exited process is a success that says it had exited, and sends
    // nothing when it left nothing running. Regression: it said the signal was sent.
    let late = server
        .call(
            "kill",
            json!({"sandbox_id": "attached", "pid": pid, "signal": 0}),
        )
        .await;
    let body = late.structured_content.clone().unwrap();
    assert_eq!(body["already_exited"], true, "{body}");
    assert_eq!(body["sent"], false, "{body}");
    assert_eq!(body["exit_code"], 143, "{body}");
    let text = support::text(&late);
    assert!(text.contains("had already exited"), "{text}");
    assert!(!text.contains("signal 9 sent"), "{text}");

    let missing = server
        .err("logs", json!({"sandbox_id": "attached", "pid": 999_999}))
        .await;
    assert!(missing.contains("Call ps"), "{missing}");
    let bad = server
        .err(
            "kill",
            json!({"sandbox_id": "attached", "pid": pid, "signal": 99}),
        )
        .await;
    assert!(bad.contains("between 0 and 64"), "{bad}");
    server.disconnect(Duration::from_secs(10)).await;
    // The agent is not ours: the session's end leaves it running.
    let mut agent = agent;
    agent.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_and_read_file_refuses_what_it_should() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let dir = agent.dir().display().to_string();
    let file = format!("{dir}/notes.txt");

    let wrote = server
        .ok(
            "write_file",
            json!({"sandbox_id": "attached", "path": file, "content": "héllo\n", "mode": "750"}),
        )
        .await;
    assert_eq!(wrote["bytes"], 7);
    let read = server
        .ok("read_file", json!({"sandbox_id": "attached", "path": file}))
        .await;
    assert_eq!(read["content"], "héllo\n");
    assert_eq!(read["lossy"], false);
    let mode = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": format!("stat -c %a {file}")}),
        )
        .await;
    assert_eq!(mode["stdout"], "750\n");

    let listing = server
        .ok("list_dir", json!({"sandbox_id": "attached", "path": dir}))
        .await;
    let entry = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "notes.txt")
        .unwrap()
        .clone();
    assert_eq!(entry["kind"], "file");
    assert_eq!(entry["size"], 7);

    // Invalid UTF-8 read as text is replaced, not refused; with the defaults it
    // comes as base64 (results.rs checks that case).
    let binary = format!("{dir}/binary");
    server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": format!("printf 'a\\377b' > {binary}")}),
        )
        .await;
    let read = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": binary, "encoding": "utf-8"}),
        )
        .await;
    assert_eq!(read["content"], "a\u{fffd}b");
    assert_eq!(read["lossy"], true);
    assert_eq!(read["bytes"], 3);
    let read = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": binary}),
        )
        .await;
    assert_eq!(
        (&read["content"], &read["binary"]),
        (&json!("Yf9i"), &json!(true))
    );

    let big = format!("{dir}/big");
    server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": format!("head -c 1048577 /dev/zero > {big}")}),
        )
        .await;
    // Regression: over 1 MiB read_file failed, advising a `get` that is no tool.
    let first = server
        .ok("read_file", json!({"sandbox_id": "attached", "path": big}))
        .await;
    assert_eq!(first["size"], 1_048_577);
    assert_eq!(first["bytes"], 65_536);
    assert_eq!(first["next_offset"], 65_536);
    let last = server
        .ok(
            "read_file",
            json!({"sandbox_id": "attached", "path": big, "offset": -1, "encoding": "base64"}),
        )
        .await;
    assert_eq!(
        (&last["content"], &last["offset"]),
        (&json!("AA=="), &json!(1_048_576))
    );
    assert!(last["next_offset"].is_null());
    let directory = server
        .err("read_file", json!({"sandbox_id": "attached", "path": dir}))
        .await;
    assert!(directory.contains("list_dir"), "{directory}");
    let device = server
        .err(
            "read_file",
            json!({"sandbox_id": "attached", "path": "/dev/null"}),
        )
        .await;
    assert!(
        device.contains("device") && device.contains("exec"),
        "{device}"
    );
    let missing = server
        .err(
            "read_file",
            json!({"sandbox_id": "attached", "path": format!("{dir}/nope")}),
        )
        .await;
    assert!(missing.contains("not_found"), "{missing}");
    let relative = server
        .err(
            "read_file",
            json!({"sandbox_id": "attached", "path": "notes.txt"}),
        )
        .await;
    assert!(relative.contains("absolute"), "{relative}");
    let no_parent = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": format!("{dir}/a/b/c"), "content": "x"}),
        )
        .await;
    assert!(no_parent.contains("not_found"), "{no_parent}");
    let bad_mode = server
        .err(
            "write_file",
            json!({"sandbox_id": "attached", "path": file, "content": "x", "mode": "rwx"}),
        )
        .await;
    assert!(bad_mode.contains("octal"), "{bad_mode}");
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_text_finds_a_servers_line_and_a_files_and_fails_usefully() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let spawned = server
        .ok(
            "spawn",
            json!({"sandbox_id": "attached",
                   "command": "echo booting; echo 'listening on :8080' >&2; exec sleep 60"}),
        )
        .await;
    let pid = spawned["pid"].as_i64().unwrap();
    let found = server
        .ok(
            "wait_for_text",
            json!({"sandbox_id": "attached", "pid": pid, "text": "listening on",
                   "timeout_seconds": 30}),
        )
        .await;
    assert_eq!(found["pid"], pid);
    assert!(found["path"].is_null());
    assert_eq!(found["offset"], 8);
    assert_eq!(found["stream"], "stderr");
    assert_eq!(found["line"], "listening on :8080");

    // A file (in a directory) that appears while, or before, the tool waits.
    let path = agent.dir().join("later/job.log").display().to_string();
    let (found, ()) = tokio::join!(
        server.ok(
            "wait_for_text",
            json!({"sandbox_id": "attached", "path": path, "text": "done"}),
        ),
        async {
            std::fs::create_dir_all(agent.dir().join("later")).unwrap();
            std::fs::write(&path, "job done\n").unwrap();
        }
    );
    assert_eq!(found["path"], path.as_str());
    assert!(
        found["pid"].is_null() && found["stream"].is_null(),
        "{found}"
    );
    assert_eq!(
        (found["offset"].as_u64(), &found["line"]),
        (Some(4), &json!("job done"))
    );

    // Running out of time is an error result that says what was seen and what to do.
    let timed_out = server
        .err(
            "wait_for_text",
            json!({"sandbox_id": "attached", "path": path, "text": "never",
                   "timeout_seconds": 0}),
        )
        .await;
    assert!(timed_out.contains("Timed out after"), "{timed_out}");
    assert!(
        timed_out.contains("call wait_for_text again"),
        "{timed_out}"
    );
    let both = server
        .err(
            "wait_for_text",
            json!({"sandbox_id": "attached", "path": path, "pid": pid, "text": "x"}),
        )
        .await;
    assert!(both.contains("exactly one of path"), "{both}");
    let long = server
        .err(
            "wait_for_text",
            json!({"sandbox_id": "attached", "pid": pid, "text": "x", "timeout_seconds": 301}),
        )
        .await;
    assert!(long.contains("at most 300"), "{long}");
    server
        .ok(
            "kill",
            json!({"sandbox_id": "attached", "pid": pid, "signal": 9}),
        )
        .await;
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_create_and_argument_errors_are_tool_errors() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;

    let again = server.err("create_sandbox", json!({})).await;
    assert!(again.contains("\"attached\""), "{again}");
    let egress = server.err("create_sandbox", json!({"net": "egress"})).await;
    assert!(egress.contains("has no egress to give"), "{egress}");
    let ttl = server
        .err("create_sandbox", json!({"ttl_seconds": 999_999}))
        .await;
    assert!(ttl.contains("at most 86400"), "{ttl}");

    let released = server
        .ok("release", json!({"sandbox_id": "attached"}))
        .await;
    assert!(released["outcome"]
        .as_str()
        .unwrap()
        .contains("keep running"));
    let twice = server
        .err("release", json!({"sandbox_id": "attached"}))
        .await;
    assert!(
        twice.starts_with("Unknown sandbox_id \"attached\""),
        "{twice}"
    );
    assert!(twice.contains("released"), "{twice}");
    let gone = server
        .err("exec", json!({"sandbox_id": "attached", "command": "true"}))
        .await;
    assert!(gone.contains("create_sandbox"), "{gone}");
    // The agent itself was left alone, and can be claimed again.
    let mut agent = agent;
    agent.assert_alive();
    let claimed = server.ok("create_sandbox", json!({})).await;
    assert_eq!(claimed["sandbox_id"], "attached");
    assert!(claimed["deadline"].is_null());
    server
        .ok("exec", json!({"sandbox_id": "attached", "command": "true"}))
        .await;

    let unknown = server.err("ps", json!({"sandbox_id": "sbx-nope"})).await;
    assert!(unknown.contains("Live sandboxes: attached"), "{unknown}");
    // Bad arguments are isError results the model can correct, not protocol errors.
    let missing = server.err("exec", json!({"sandbox_id": "attached"})).await;
    assert!(missing.contains("command"), "{missing}");
    let misspelt = server
        .err(
            "exec",
            json!({"sandbox_id": "attached", "command": "true", "timeout_secs": 1}),
        )
        .await;
    assert!(misspelt.contains("timeout_secs"), "{misspelt}");
    let long = server
        .err(
            "exec",
            json!({"sandbox_id": "attached", "command": "true", "timeout_seconds": 301}),
        )
        .await;
    assert!(long.contains("spawn"), "{long}");
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_exec_returns_its_partial_output_next_to_an_error() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let started = Instant::now();
    let result = server
        .call(
            "exec",
            json!({"sandbox_id": "attached", "command": "echo before; sleep 30; echo after",
                   "timeout_seconds": 1}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(result.is_error, Some(true));
    let body = result.structured_content.clone().unwrap();
    assert_eq!(body["stdout"], "before\n");
    assert_eq!(body["timed_out"], true);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("Timed out after 1 s"));
    let text = support::text(&result);
    assert!(
        text.contains("before") && text.contains("error: Timed out"),
        "{text}"
    );

    // Output past max_bytes (16 KiB by default) is cut, and flagged.
    let big = server
        .ok(
            "exec",
            json!({"sandbox_id": "attached", "command": "head -c 1100000 /dev/zero | tr '\\0' a"}),
        )
        .await;
    assert_eq!(big["truncated"], true);
    assert_eq!(big["stdout_bytes"], 1_100_000);
    assert_eq!(big["kept"], "head_tail");
    assert!(big["stdout"].as_str().unwrap().len() < 16 * 1024 + 100);
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_code_keeps_state_and_reports_exceptions_timeouts_and_deaths() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let call = |code: &str| json!({"sandbox_id": "attached", "code": code});

    let first = server
        .ok("eval_code", call("import os\nx = 20\nx * 2 + 2"))
        .await;
    assert_eq!(first["value"], "42");
    assert_eq!(
        (first["session"].as_str(), first["language"].as_str()),
        (Some("default"), Some("python"))
    );
    assert_eq!(first["started"], true);
    let output = server
        .ok(
            "eval_code",
            call("print('out'); os.system('echo sub >&2'); x"),
        )
        .await;
    assert_eq!(
        (output["stdout"].as_str(), output["stderr"].as_str()),
        (Some("out\n"), Some("sub\n"))
    );
    assert_eq!(
        (output["value"].as_str(), output["started"].as_bool()),
        (Some("20"), Some(false))
    );

    // An exception is an error result that keeps everything else.
    let raised = server
        .call("eval_code", call("print('before')\n1 / 0"))
        .await;
    assert_eq!(raised.is_error, Some(true));
    let body = raised.structured_content.clone().unwrap();
    assert_eq!(body["stdout"], "before\n");
    assert_eq!(body["exception"]["type"], "ZeroDivisionError");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("ZeroDivisionError"));
    assert!(
        support::text(&raised).contains("line 2"),
        "{}",
        support::text(&raised)
    );

    // A timeout interrupts; the session keeps its state.
    let slow = json!({"sandbox_id": "attached", "code": "import time; time.sleep(30)",
                      "timeout_seconds": 1});
    let interrupted = server.call("eval_code", slow).await;
    assert_eq!(interrupted.is_error, Some(true));
    let body = interrupted.structured_content.clone().unwrap();
    assert_eq!(
        (body["timed_out"].as_bool(), body["died"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(body["exception"]["type"], "KeyboardInterrupt");
    assert_eq!(server.ok("eval_code", call("x")).await["value"], "20");

    // A death is an error; the dead session answers with a hint until restart.
    let died = server.call("eval_code", call("exit(5)")).await;
    assert_eq!(died.is_error, Some(true));
    let body = died.structured_content.clone().unwrap();
    assert_eq!(
        (body["died"].as_bool(), body["exit_code"].as_i64()),
        (Some(true), Some(5))
    );
    let gone = server.err("eval_code", call("x")).await;
    assert!(gone.contains("restart: true"), "{gone}");
    let fresh = server
        .ok(
            "eval_code",
            json!({"sandbox_id": "attached", "code": "1", "restart": true}),
        )
        .await;
    assert_eq!(fresh["started"], true);

    // sh sessions, and what the tool refuses.
    let shell = json!({"sandbox_id": "attached", "language": "sh", "session": "sh",
                       "code": "cd /tmp; false"});
    assert_eq!(server.ok("eval_code", shell).await["status"], 1);
    let pwd = json!({"sandbox_id": "attached", "language": "sh", "session": "sh", "code": "pwd"});
    assert_eq!(server.ok("eval_code", pwd).await["stdout"], "/tmp\n");
    let wrong = json!({"sandbox_id": "attached", "session": "sh", "code": "1"});
    let text = server.err("eval_code", wrong).await;
    assert!(text.contains("another session name"), "{text}");
    let ruby = json!({"sandbox_id": "attached", "language": "ruby", "code": "1"});
    assert!(server.err("eval_code", ruby).await.contains("\"sh\""));
    let bad = json!({"sandbox_id": "attached", "session": "a b", "code": "1"});
    assert!(server.err("eval_code", bad).await.contains("session name"));
    let ps = server.ok("ps", json!({"sandbox_id": "attached"})).await;
    let kinds: Vec<&str> = ps["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"session"), "{ps}");
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_run_side_by_side() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    let started = Instant::now();
    let calls = (0..4).map(|n| {
        server.ok(
            "exec",
            json!({"sandbox_id": "attached", "command": format!("sleep 1; echo {n}")}),
        )
    });
    let results = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    for (n, result) in results.iter().enumerate() {
        assert_eq!(result["stdout"], format!("{n}\n"));
    }
    assert!(
        elapsed < Duration::from_millis(2500),
        "4 one-second execs took {elapsed:?}: they ran one after another"
    );
    let (info, ps) = tokio::join!(
        server.ok("node_info", json!({})),
        server.ok(
            "ps",
            json!({"sandbox_id": "attached", "running_only": false})
        )
    );
    assert_eq!(info["capacity"]["live_claims"], 1);
    assert!(ps["processes"].as_array().unwrap().len() >= 4);
    server.disconnect(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_cleanly() {
    let agent = TestAgent::start();
    let server = attached(&agent).await;
    server
        .ok("exec", json!({"sandbox_id": "attached", "command": "true"}))
        .await;
    let status = server.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
}

/// The limit on one message, as the server documents it.
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

async fn raw_attached(agent: &TestAgent) -> RawServer {
    let log = agent.dir().join("mcp-raw.log");
    let mut server = RawServer::start(&["--agent", &agent.url()], &[], &log).await;
    server.initialize().await;
    server
}

/// Regression: rmcp dropped a line over 16 MiB and a line of invalid JSON without
/// any reply (the client waited forever), and answered malformed JSON-RPC without
/// its id, even when it was a notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_and_malformed_lines_get_json_rpc_errors_and_the_session_goes_on() {
    let agent = TestAgent::start();
    let mut server = raw_attached(&agent).await;
    let path = agent.dir().join("huge.txt").display().to_string();

    // 17 MiB of content, with the id after it, where TypeScript clients put it.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"write_file","arguments":{{"sandbox_id":"attached","path":"{path}","content":"{}"}}}},"id":17}}"#,
        "a".repeat(17 * 1024 * 1024)
    );
    server.send(huge.as_bytes()).await;
    drop(huge);
    let reply = server.recv().await;
    assert_eq!(reply["id"], 17, "{reply}");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["error"]["data"]["limit_bytes"], MAX_LINE_BYTES);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("16 MiB"), "names the limit: {message}");
    assert!(
        message.contains("write_file") && message.contains("exec"),
        "says what to use instead: {message}"
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "the oversize write must not have happened"
    );

    // The session goes on.
    let run = server
        .request(
            18,
            "tools/call",
            json!({"name": "exec", "arguments": {"sandbox_id": "attached", "command": "echo ok"}}),
        )
        .await;
    assert_eq!(
        run["result"]["structuredContent"]["stdout"], "ok\n",
        "{run}"
    );

    server.send(b"this is not json").await;
    let parse = server.recv().await;
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    assert!(parse["id"].is_null(), "{parse}");
    assert!(
        parse.as_object().unwrap().contains_key("id"),
        "id: null, not absent"
    );

    server.send(br#"{"foo":1}"#).await;
    let invalid = server.recv().await;
    assert_eq!(invalid["error"]["code"], -32600, "{invalid}");
    assert!(invalid["id"].is_null(), "{invalid}");

    server
        .send(br#"{"jsonrpc":"2.0","id":"r-21","method":"tools/call","params":5}"#)
        .await;
    let bad_params = server.recv().await;
    assert_eq!(bad_params["id"], "r-21", "{bad_params}");
    assert_eq!(bad_params["error"]["code"], -32600, "{bad_params}");

    // A malformed notification and a blank line get no reply: the next line out
    // answers the ping sent after them.
    server
        .send(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#)
        .await;
    server.send(b"   ").await;
    let pong = server.request(22, "ping", json!({})).await;
    assert!(pong["result"].is_object(), "{pong}");
    assert!(
        server.log().contains("dropped a malformed message"),
        "{}",
        server.log()
    );

    server.close_stdin();
    let status = server.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
}

/// Regression: after the client went away, rmcp waited for in-flight calls (here an
/// exec that sleeps a minute) before the server shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_stdin_mid_exec_stops_the_server_at_once() {
    let agent = TestAgent::start();
    let mut server = raw_attached(&agent).await;
    server
        .send_json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "exec",
                       "arguments": {"sandbox_id": "attached", "command": "sleep 60"}}}))
        .await;
    server
        .wait_running(&json!("attached"), "sleep 60", Duration::from_secs(10))
        .await;
    let started = Instant::now();
    server.close_stdin();
    let status = server.wait_exit(Duration::from_secs(2)).await;
    eprintln!(
        "server exited ({status}) {:?} after stdin closed",
        started.elapsed()
    );
    assert!(status.success(), "{status}");
}
