//! `sandboxctl` against the real agent: exit codes, output, JSON, terminals.

use std::time::{Duration, Instant};

use sandbox_tests::{binaries, AgentOptions, TestAgent, TestCommand};

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn exec_exits_with_the_commands_code_and_streams_output() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .args(["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"])
        .assert_code(3);
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
}

/// Regression: a command the agent could not start exited 1, where `docker exec`,
/// `kubectl exec` and shells exit 127 (not found) or 126 (not runnable).
#[test]
fn exec_of_a_missing_or_unrunnable_command_exits_127_or_126() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .args(["exec", "--", "nosuchcmd", "--flag"])
        .assert_code(127);
    assert!(
        stderr(&output).contains("nosuchcmd not found"),
        "{}",
        stderr(&output)
    );
    let script = agent.dir().join("not-executable");
    std::fs::write(&script, "echo hi\n").unwrap();
    let script = script.to_str().unwrap();
    for path in [script, "/tmp", "/nonexistent/prog"] {
        let code = if path.starts_with("/nonexistent") {
            127
        } else {
            126
        };
        let output = agent
            .sandboxctl()
            .args(["exec", "--", path])
            .assert_code(code);
        assert!(
            stderr(&output).contains(&format!("Cannot start {path}")),
            "{path}: {}",
            stderr(&output)
        );
    }
    // What the command itself returns is still its own.
    agent
        .sandboxctl()
        .args(["exec", "--", "sh", "-c", "exit 127"])
        .assert_code(127);
}

#[test]
fn sh_killed_by_a_signal_exits_128_plus_the_signal() {
    let agent = TestAgent::start();
    agent
        .sandboxctl()
        .args(["sh", "kill -9 $$"])
        .assert_code(137);
    agent.sandboxctl().args(["sh", "true"]).assert_code(0);
}

#[test]
fn exec_options_reach_the_command() {
    let agent = TestAgent::start();
    let input = agent.dir().join("input.txt");
    std::fs::write(&input, "from a file\n").unwrap();
    let stdout = agent
        .sandboxctl()
        .args(["exec", "--cwd", "/tmp", "--env", "A=1", "-e", "B=two words"])
        .arg_path("--stdin-file", &input)
        .args(["--", "sh", "-c", "pwd; echo \"$A $B\"; cat"])
        .stdout_ok();
    assert_eq!(stdout, "/tmp\n1 two words\nfrom a file\n");

    let stdout = agent
        .sandboxctl()
        .args(["sh", "--stdin-file", "-", "tr a-z A-Z"])
        .stdin("piped in\n")
        .stdout_ok();
    assert_eq!(stdout, "PIPED IN\n");
}

/// Regression: `echo x | sandboxctl exec -- cat` printed nothing (stdin went only
/// with `--stdin-file -`), and `-i`, as `docker exec -i` takes it, was run as the
/// command.
#[test]
fn piped_stdin_reaches_the_command_and_dash_i_is_accepted() {
    let agent = TestAgent::start();
    for args in [
        &["exec", "--", "cat"][..],
        &["exec", "-i", "--", "cat"][..],
        &["exec", "-i", "cat"][..],
        &["sh", "tr a-z A-Z | tr A-Z a-z"][..],
    ] {
        let stdout = agent
            .sandboxctl()
            .args(args)
            .stdin("piped in\n")
            .stdout_ok();
        assert_eq!(stdout, "piped in\n", "{args:?}");
    }
    // An empty pipe is an empty stdin: the command does not wait for more.
    let stdout = agent
        .sandboxctl()
        .args(["exec", "--", "wc", "-c"])
        .stdout_ok();
    assert_eq!(stdout.trim(), "0");
    // --stdin-file wins over our stdin.
    let input = agent.dir().join("input.txt");
    std::fs::write(&input, "from the file\n").unwrap();
    let stdout = agent
        .sandboxctl()
        .args(["exec"])
        .arg_path("--stdin-file", &input)
        .args(["--", "cat"])
        .stdin("piped in\n")
        .stdout_ok();
    assert_eq!(stdout, "from the file\n");
}

#[test]
fn eval_prints_output_value_and_traceback_and_exits_by_how_it_ended() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .args([
            "eval",
            "import sys\nprint('out'); print('err', file=sys.stderr)\nx = 6\nx * 7",
        ])
        .assert_code(0);
    assert_eq!(output.stdout, b"out\n42\n", "output, then the value");
    assert_eq!(output.stderr, b"err\n");
    // The code from stdin; an exception's traceback on stderr, exit 1.
    let output = agent
        .sandboxctl()
        .args(["eval", "-"])
        .stdin("x / 0\n")
        .assert_code(1);
    assert!(output.stdout.is_empty());
    assert!(
        stderr(&output).ends_with("ZeroDivisionError: division by zero\n"),
        "{}",
        stderr(&output)
    );
    // A sh session's status is the exit code; JSON says everything.
    agent
        .sandboxctl()
        .args([
            "eval",
            "--lang",
            "sh",
            "--session",
            "sh",
            "cd /tmp; (exit 3)",
        ])
        .assert_code(3);
    let json = agent
        .sandboxctl()
        .args(["eval", "--lang", "sh", "--session", "sh", "--json", "pwd"])
        .stdout_ok();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["stdout"], "/tmp\n");
    assert_eq!(json["status"], 0);
    assert_eq!(json["language"], "sh");
    assert_eq!(json["evaluations"], 2);
    // A timeout exits 124 and the session lives on; a death says to restart.
    let output = agent
        .sandboxctl()
        .args(["eval", "--timeout", "0.5", "import time; time.sleep(60)"])
        .assert_code(124);
    assert!(
        stderr(&output).contains("KeyboardInterrupt"),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("session default lives on"),
        "{}",
        stderr(&output)
    );
    let output = agent.sandboxctl().args(["eval", "exit(4)"]).assert_code(4);
    assert!(stderr(&output).contains("--restart"), "{}", stderr(&output));
    let output = agent.sandboxctl().args(["eval", "x"]).assert_code(1);
    assert!(stderr(&output).contains("not_found"), "{}", stderr(&output));
    let stdout = agent
        .sandboxctl()
        .args(["eval", "--restart", "'fresh'"])
        .stdout_ok();
    assert_eq!(stdout, "'fresh'\n");
    agent
        .sandboxctl()
        .args(["close-session", "sh"])
        .assert_code(0);
    let output = agent
        .sandboxctl()
        .args(["close-session", "sh"])
        .assert_code(1);
    assert!(stderr(&output).contains("not_found"), "{}", stderr(&output));
}

#[test]
fn exec_timeout_exits_124_with_a_message() {
    let agent = TestAgent::start();
    let started = Instant::now();
    let output = agent
        .sandboxctl()
        .args(["sh", "--timeout", "1", "echo started; sleep 1000"])
        .assert_code(124);
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(output.stdout, b"started\n");
    assert!(stderr(&output).contains("timed out"), "{}", stderr(&output));
}

#[test]
fn spawn_prints_a_pid_that_logs_and_ps_know() {
    let agent = TestAgent::start();
    let pid = agent
        .sandboxctl()
        .args([
            "spawn",
            "--",
            "sh",
            "-c",
            "echo spawned-out; echo spawned-err >&2",
        ])
        .stdout_ok();
    let pid: i32 = pid.trim().parse().expect("spawn printed no pid");

    let output = agent
        .sandboxctl()
        .args(["logs", "-f", &pid.to_string()])
        .assert_code(0);
    assert_eq!(output.stdout, b"spawned-out\n");
    assert_eq!(output.stderr, b"spawned-err\n");

    let output = agent
        .sandboxctl()
        .args(["logs", &pid.to_string()])
        .assert_code(0);
    assert_eq!(output.stdout, b"spawned-out\n");

    let json = agent.sandboxctl().args(["ps", "--json"]).stdout_ok();
    let list: serde_json::Value = serde_json::from_str(&json).expect("ps --json is not JSON");
    let entry = list
        .as_array()
        .expect("ps --json is not an array")
        .iter()
        .find(|p| p["pid"] == pid)
        .expect("spawned pid not in ps --json");
    assert_eq!(entry["kind"], "spawn");
    assert_eq!(entry["state"], "exited");
    assert_eq!(entry["exit_code"], 0);
    assert_eq!(entry["argv"][0], "sh");

    let table = agent.sandboxctl().args(["ps"]).stdout_ok();
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("PID"), "{header}");
    for column in ["KIND", "STATE", "EXIT", "STARTED", "ARGV"] {
        assert!(header.contains(column), "{header}");
    }
    assert!(
        lines.any(|l| l.starts_with(&format!("{pid} ")) && l.contains("spawn")),
        "{table}"
    );
}

#[test]
fn logs_json_carries_chunks_and_exit() {
    let agent = TestAgent::start();
    let pid = agent
        .sandboxctl()
        .args(["spawn", "--", "sh", "-c", "echo hi; exit 2"])
        .stdout_ok();
    let pid = pid.trim().to_owned();
    // Follow once to wait for the exit.
    agent.sandboxctl().args(["logs", "-f", &pid]).assert_code(0);
    let json = agent
        .sandboxctl()
        .args(["logs", "--json", "--cursor", "1", &pid])
        .stdout_ok();
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["chunks"][0]["data"], "i\n");
    assert_eq!(value["chunks"][0]["stream"], "stdout");
    assert_eq!(value["chunks"][0]["offset"], 1);
    assert_eq!(value["end"], 3);
    assert_eq!(value["exit"]["code"], 2);
}

#[test]
fn logs_report_dropped_bytes_on_stderr() {
    let agent = TestAgent::start();
    let pid = agent
        .sandboxctl()
        .args([
            "spawn",
            "--",
            "sh",
            "-c",
            "head -c 400000 /dev/zero | tr '\\0' z",
        ])
        .stdout_ok();
    // Wait for the exit, so the ring has certainly wrapped.
    agent
        .sandboxctl()
        .args(["logs", "-f", pid.trim()])
        .assert_code(0);
    for follow in [false, true] {
        let mut command = agent.sandboxctl();
        command.args(["logs", "--cursor", "0"]);
        if follow {
            command.args(["-f"]);
        }
        let output = command.args([pid.trim()]).assert_code(0);
        assert!(
            stderr(&output).contains("bytes dropped"),
            "{}",
            stderr(&output)
        );
        assert!(!output.stdout.is_empty() && output.stdout.len() <= 256 * 1024);
        assert!(output.stdout.iter().all(|&b| b == b'z'));
    }
}

#[test]
fn wait_for_prints_where_the_text_is_and_exits_124_at_the_timeout() {
    let agent = TestAgent::start();
    let log = agent.dir().join("app.log");
    std::fs::write(&log, "booting\nready on :80\n").unwrap();
    let log_arg = log.to_str().unwrap();
    let stdout = agent
        .sandboxctl()
        .args(["wait-for", "--file", log_arg, "ready"])
        .stdout_ok();
    assert_eq!(stdout, "offset 8 after 0.0 s: ready on :80\n");
    let json = agent
        .sandboxctl()
        .args(["wait-for", "--json", "--file", log_arg, "on :80"])
        .stdout_ok();
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["offset"], 14);
    assert_eq!(value["line"], "ready on :80");
    assert!(value.get("stream").is_none(), "{value}");

    let pid = agent
        .sandboxctl()
        .args([
            "spawn",
            "--",
            "sh",
            "-c",
            "echo 'listening on 8080' >&2; exec sleep 60",
        ])
        .stdout_ok();
    let pid = pid.trim();
    let stdout = agent
        .sandboxctl()
        .args(["wait-for", "--pid", pid, "--timeout", "20", "listening"])
        .stdout_ok();
    assert!(
        stdout.starts_with("offset 0 (stderr) after ") && stdout.ends_with(": listening on 8080\n"),
        "{stdout}"
    );

    let started = Instant::now();
    let output = agent
        .sandboxctl()
        .args(["wait-for", "--file", log_arg, "--timeout", "0.3", "never"])
        .assert_code(124);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(output.stdout.is_empty());
    let message = stderr(&output);
    assert!(
        message.starts_with("sandboxctl: Timed out after 0.3 s waiting for \"never\""),
        "{message}"
    );

    // Failures other than the deadline exit 1 with the agent's reason.
    let output = agent
        .sandboxctl()
        .args(["wait-for", "--file", "relative.log", "x"])
        .assert_code(1);
    assert!(
        stderr(&output).contains("is not absolute"),
        "{}",
        stderr(&output)
    );
    let done = agent
        .sandboxctl()
        .args(["spawn", "--", "sh", "-c", "echo bye; exit 4"])
        .stdout_ok();
    let output = agent
        .sandboxctl()
        .args(["wait-for", "--pid", done.trim(), "hello"])
        .assert_code(1);
    assert!(
        stderr(&output).contains("exited (code 4) without printing \"hello\""),
        "{}",
        stderr(&output)
    );
    agent
        .sandboxctl()
        .args(["kill", "-s", "KILL", pid])
        .assert_code(0);
}

#[test]
fn kill_takes_names_and_numbers_and_reports_unknown_pids() {
    let agent = TestAgent::start();
    let pid = agent
        .sandboxctl()
        .args(["spawn", "--", "sleep", "1000"])
        .stdout_ok();
    let pid = pid.trim().to_owned();
    agent
        .sandboxctl()
        .args(["kill", "-s", "SIGTERM", &pid])
        .assert_code(0);
    agent.sandboxctl().args(["logs", "-f", &pid]).assert_code(0);
    let json = agent.sandboxctl().args(["ps", "--json"]).stdout_ok();
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_i64().map(|n| n.to_string()) == Some(pid.clone()))
        .unwrap();
    assert_eq!(entry["signal"], 15);
    // Exited: a no-op success, by number too.
    agent
        .sandboxctl()
        .args(["kill", "-s", "9", &pid])
        .assert_code(0);

    let output = agent.sandboxctl().args(["kill", "999999"]).assert_code(1);
    assert!(stderr(&output).contains("not_found"), "{}", stderr(&output));
}

#[test]
fn shell_runs_a_terminal_from_piped_input_and_exits_with_its_code() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .args(["shell", "--", "sh"])
        .env("TERM", "xterm-test")
        .stdin("echo $((6*7)); echo TERM=$TERM\nexit 4\n")
        .assert_code(4);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("42"), "{stdout}");
    assert!(stdout.contains("TERM=xterm-test"), "{stdout}");
}

#[test]
fn shell_sees_end_of_input_as_end_of_file() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .args(["shell", "--", "sh"])
        .stdin("echo no-exit-command\n")
        .deadline(Duration::from_secs(20))
        .assert_code(0);
    assert!(String::from_utf8_lossy(&output.stdout).contains("no-exit-command"));
}

#[test]
fn attach_replays_a_running_terminal_and_follows_it() {
    let agent = TestAgent::start();
    // A terminal opened by the library, left running.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pid = runtime.block_on(async {
        let client = agent.client().await;
        let pid = client
            .pty_open(sandbox_protocol::PtyOpenRequest {
                spec: sandbox_tests::argv(&["sh"]),
                size: sandbox_protocol::WindowSize { rows: 24, cols: 80 },
            })
            .await
            .unwrap();
        client
            .pty_input(pid, b"echo first-$((2*3))\n".to_vec())
            .await
            .unwrap();
        pid
    });
    let output = agent
        .sandboxctl()
        .args(["attach", &pid.to_string()])
        .stdin("echo second-$((3*3)); exit 6\n")
        .assert_code(6);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("first-6"), "no replay: {stdout}");
    assert!(stdout.contains("second-9"), "no live output: {stdout}");
}

#[test]
fn info_prints_text_and_json() {
    let agent = TestAgent::start();
    let text = agent.sandboxctl().args(["info"]).stdout_ok();
    assert!(text.contains("agent version"), "{text}");
    assert!(text.contains("boot id"), "{text}");
    let json = agent.sandboxctl().args(["info", "--json"]).stdout_ok();
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["protocol_version"], 1);
    assert!(value["boot_id"].as_str().is_some_and(|id| !id.is_empty()));
}

#[test]
fn tool_errors_exit_1_with_the_cause_chain() {
    let agent = TestAgent::start();
    let output = agent.sandboxctl().args(["logs", "999999"]).assert_code(1);
    assert!(stderr(&output).contains("not_found"), "{}", stderr(&output));

    let mut bad = TestCommand::new_sandboxctl();
    let output = bad
        .args(["--agent", "tcp://1.2.3.4:5", "ps"])
        .assert_code(1);
    assert!(
        stderr(&output).contains("Unknown scheme"),
        "{}",
        stderr(&output)
    );

    let missing = agent.dir().join("nothing-here.sock");
    let mut gone = TestCommand::new_sandboxctl();
    let output = gone
        .args(["--agent", &format!("unix://{}", missing.display()), "ps"])
        .assert_code(1);
    assert!(
        stderr(&output).contains("Cannot connect"),
        "{}",
        stderr(&output)
    );

    let mut none = TestCommand::new_sandboxctl();
    let output = none.args(["ps"]).assert_code(1);
    assert!(
        stderr(&output).contains("SANDBOX_AGENT"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn agent_and_token_come_from_the_environment() {
    let agent = TestAgent::start_with(AgentOptions {
        token: Some("tok".into()),
        ..AgentOptions::default()
    });
    let mut from_env = TestCommand::new_sandboxctl();
    let stdout = from_env
        .env("SANDBOX_AGENT", &agent.url())
        .env("SANDBOX_TOKEN", "tok")
        .args(["sh", "echo via-env"])
        .stdout_ok();
    assert_eq!(stdout, "via-env\n");

    let mut wrong = TestCommand::new_sandboxctl();
    let output = wrong
        .env("SANDBOX_AGENT", &agent.url())
        .env("SANDBOX_TOKEN", "nope")
        .args(["ps"])
        .assert_code(1);
    assert!(stderr(&output).contains("token"), "{}", stderr(&output));
    assert!(binaries().sandboxctl.is_file());
}

#[test]
fn file_commands_move_files_both_ways_and_report_errors() {
    let agent = TestAgent::start();
    let dir = agent.dir().join("files");
    std::fs::create_dir(&dir).unwrap();
    let remote = dir.join("copy.bin");
    let local = agent.dir().join("local.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&local, &data).unwrap();

    agent
        .sandboxctl()
        .arg_path("put", &local)
        .arg_path("--mode", std::path::Path::new("600"))
        .args([remote.to_str().unwrap()])
        .assert_code(0);
    let back = agent.dir().join("back.bin");
    agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), back.to_str().unwrap()])
        .assert_code(0);
    assert_eq!(std::fs::read(&back).unwrap(), data);

    agent
        .sandboxctl()
        .args(["write", dir.join("note").to_str().unwrap()])
        .stdin("hello\n")
        .assert_code(0);
    let cat = agent
        .sandboxctl()
        .args(["cat", dir.join("note").to_str().unwrap()])
        .stdout_ok();
    assert_eq!(cat, "hello\n");
    let ls = agent
        .sandboxctl()
        .args(["ls", "--json", dir.to_str().unwrap()])
        .stdout_ok();
    let entries: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(entries[0]["name"], "copy.bin");
    assert_eq!(entries[0]["size"], 300_000);
    let stat = agent
        .sandboxctl()
        .args(["stat", "--json", remote.to_str().unwrap()])
        .stdout_ok();
    let stat: serde_json::Value = serde_json::from_str(&stat).unwrap();
    assert_eq!(stat["mode"], "0600");

    agent
        .sandboxctl()
        .args(["mkdir", "-p", dir.join("a/b").to_str().unwrap()])
        .assert_code(0);
    agent
        .sandboxctl()
        .args(["rm", "-r", dir.join("a").to_str().unwrap()])
        .assert_code(0);
    let output = agent
        .sandboxctl()
        .args(["cat", dir.to_str().unwrap()])
        .assert_code(1);
    assert!(
        stderr(&output).contains("is a directory"),
        "{}",
        stderr(&output)
    );
    // resume touches the whole machine: only an agent that is init does it.
    let output = agent.sandboxctl().args(["resume"]).assert_code(1);
    assert!(
        stderr(&output).contains("permission_denied"),
        "{}",
        stderr(&output)
    );
}

/// Runs `sandboxctl ARGS` with stdout a pipe, reads one byte of it, closes it (what
/// `| head -c 1` does), and returns how sandboxctl ended.
fn read_one_byte_then_close(agent: &TestAgent, args: &[&str]) -> std::process::Output {
    use std::io::Read;
    use std::process::{Command, Stdio};

    let mut command = Command::new(&binaries().sandboxctl);
    command
        .arg("--agent")
        .arg(agent.url())
        .args(args)
        .env_remove("SANDBOX_TOKEN")
        .env_remove("SANDBOX_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = agent.options().token {
        command.arg("--token").arg(token);
    }
    let mut child = command.spawn().expect("cannot start sandboxctl");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut first = [0u8; 1];
    stdout
        .read_exact(&mut first)
        .expect("no output before the close");
    drop(stdout);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("cannot poll sandboxctl").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("sandboxctl {args:?} kept running after its reader left");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("cannot collect sandboxctl")
}

// Regression: a reader that stops early (`sandboxctl cat big | head -c 1`) made
// sandboxctl print "Broken pipe" (or panic in println!) and exit non-zero.
#[test]
fn a_reader_that_stops_early_ends_the_run_quietly() {
    let agent = TestAgent::start();
    let big = agent.dir().join("big.bin");
    // Far more than a pipe holds (64 KiB): the write is still going when the reader leaves.
    std::fs::write(&big, vec![b'x'; 1 << 20]).unwrap();
    let output = read_one_byte_then_close(&agent, &["cat", big.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stderr(&output), "");

    // A follow of a process that went quiet ends too, without waiting for more output.
    let pid = agent
        .sandboxctl()
        .args(["spawn", "--", "sh", "-c", "echo one; exec sleep 60"])
        .stdout_ok();
    let output = read_one_byte_then_close(&agent, &["logs", "-f", pid.trim()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stderr(&output), "");
}

// Regression: tracing output carried colour escape codes into files and pipes.
#[test]
fn logging_goes_to_stderr_without_colour_when_it_is_not_a_terminal() {
    let agent = TestAgent::start();
    let output = agent
        .sandboxctl()
        .env("SANDBOX_LOG", "debug")
        .args(["exec", "--", "true"])
        .assert_code(0);
    let text = stderr(&output);
    assert!(text.contains("DEBUG"), "no debug event on stderr: {text}");
    assert!(!text.contains('\u{1b}'), "escape codes on stderr: {text:?}");
}

#[test]
fn special_files_are_written_into_or_refused_never_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let agent = TestAgent::start();
    let remote = agent.dir().join("remote.bin");
    std::fs::write(&remote, vec![5u8; 200_000]).unwrap();

    // get into the host's /dev/null: written into, still a character device.
    agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), "/dev/null"])
        .assert_code(0);
    let null = std::fs::metadata("/dev/null").unwrap();
    assert!(null.file_type().is_char_device(), "/dev/null was replaced");

    // get into a FIFO with a reader on the other end: the reader gets the bytes.
    let fifo = agent.dir().join("out.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(fifo).unwrap()
    });
    agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), fifo.to_str().unwrap()])
        .assert_code(0);
    assert_eq!(reader.join().unwrap().len(), 200_000);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());

    // put and write onto a FIFO on the agent's side: refused, the FIFO stays.
    let local = agent.dir().join("local.bin");
    std::fs::write(&local, b"data").unwrap();
    let output = agent
        .sandboxctl()
        .arg_path("put", &local)
        .args([fifo.to_str().unwrap()])
        .assert_code(1);
    assert!(stderr(&output).contains("FIFO"), "{}", stderr(&output));
    let output = agent
        .sandboxctl()
        .args(["write", fifo.to_str().unwrap()])
        .stdin("x")
        .assert_code(1);
    assert!(
        stderr(&output).contains("regular files"),
        "{}",
        stderr(&output)
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn a_file_rewritten_while_it_is_read_fails_the_get() {
    let agent = TestAgent::start();
    let remote = agent.dir().join("growing.log");
    std::fs::write(&remote, vec![b'x'; 8 << 20]).unwrap();
    // A writer that keeps appending while the get reads.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (remote, stop) = (remote.clone(), stop.clone());
        move || {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(remote)
                .unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file.write_all(&[b'y'; 4096]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    });
    // Start once the writer has appended: a get that finished before its first
    // append would see an unchanged file (a wait on the condition, not a sleep).
    while std::fs::metadata(&remote).unwrap().len() <= 8 << 20 {
        std::thread::yield_now();
    }
    let back = agent.dir().join("back.log");
    let output = agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), back.to_str().unwrap()])
        .assert_code(1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        stderr(&output).contains("changed while it was read"),
        "{}",
        stderr(&output)
    );
    assert!(!back.exists(), "a torn copy was left behind");
    // /proc files (size 0, with content) still come through.
    agent
        .sandboxctl()
        .args(["get", "/proc/self/status", back.to_str().unwrap()])
        .assert_code(0);
    assert!(std::fs::read_to_string(&back).unwrap().contains("Pid:"));
}

#[test]
fn get_never_makes_a_setuid_file_and_honours_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let agent = TestAgent::start();
    let remote = agent.dir().join("tool");
    std::fs::write(&remote, b"#!/bin/sh\nid\n").unwrap();
    std::fs::set_permissions(&remote, std::fs::Permissions::from_mode(0o6777)).unwrap();
    let local = agent.dir().join("fetched");
    agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), local.to_str().unwrap()])
        .assert_code(0);
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    nix::sys::stat::umask(umask);
    let mode = std::fs::metadata(&local).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o777 & !umask.bits(), "{mode:o}");
    // A get onto a directory fails and leaves no temporary file behind.
    let dir = agent.dir().join("a-dir");
    std::fs::create_dir(&dir).unwrap();
    agent
        .sandboxctl()
        .args(["get", remote.to_str().unwrap(), dir.to_str().unwrap()])
        .assert_code(1);
    let leftovers: Vec<_> = std::fs::read_dir(agent.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
