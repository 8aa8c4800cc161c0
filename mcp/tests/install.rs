//! The README's install command and client registrations, as a user would follow
//! them: `scripts/install.sh` into a fresh prefix, then every `.mcp.json` server
//! entry and every `claude mcp add` line of README.md and mcp/README.md started
//! exactly as the client would start it (its command, looked up on a `PATH` that
//! has the prefix's `bin`, its args, its env), initialized by rmcp's MCP client,
//! and made to run a command in a real microVM: `create_sandbox` and `exec` in the
//! default profile, then a second claim and a `fork` of 3 within its limits (and a
//! refusal past them that names `--max-sandboxes`), `spawn_sandboxes` and `exec_command` with the sandbox's token in
//! the sandstorm profile. The installed `sandbox-mcp` finds the installed
//! `sandbox-relay` beside it.
//!
//! The install is a debug build (`--debug`): the same `cargo install --path
//! --locked --root` as the default release build, reusing this workspace's debug
//! artifacts instead of a release build of every crate, which would take minutes of
//! CI. Examples of attach mode (`--agent`), which need the user's own agent, and of
//! a node daemon (`-addr`, `SANDBOXD_*`, `SANDSTORM_*`), which name the user's own
//! address (`python_node.rs` drives those spellings against a real daemon), are
//! listed as not started.
//!
//! Needs what `sandbox_tests::vm::gate` checks, and the python template for the
//! sandstorm examples; `SANDBOX_SKIP_VM_TESTS=1` marks the test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use support::{assert_nothing_left, run_dir, McpServer};

/// The binaries the install puts in `PREFIX/bin`.
const INSTALLED: [&str; 4] = ["sandbox-mcp", "sandboxctl", "sandboxd", "sandbox-relay"];

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "the_install_script_and_every_readme_registration_work_as_written",
        run: || block_on(install_and_register()),
    }])
}

/// A client registration: what `.mcp.json` or `claude mcp add` tells the client
/// to start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    /// Where it was found, for messages.
    origin: String,
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Registration {
    fn profile(&self) -> &str {
        match self.args.iter().position(|arg| arg == "--profile") {
            Some(at) => self.args.get(at + 1).map_or("", String::as_str),
            None => "default",
        }
    }

    /// Whether it drives a node daemon (`--addr`, seed 000's `-addr`, or the
    /// variables of either seed): an address of the user's own network.
    fn drives_a_node(&self) -> bool {
        let flags = ["-addr", "--addr", "-token", "--token"];
        self.args.iter().any(|arg| {
            flags
                .iter()
                .any(|flag| arg == flag || arg.starts_with(&format!("{flag}=")))
        }) || self
            .env
            .iter()
            .any(|(name, _)| name.starts_with("SANDBOXD_") || name.starts_with("SANDSTORM_"))
    }

    fn flag(&self, name: &str) -> Option<&str> {
        let at = self.args.iter().position(|arg| arg == name)?;
        self.args.get(at + 1).map(String::as_str)
    }
}

/// The fenced blocks of `markdown` in `language`.
fn blocks(markdown: &str, language: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence == format!("```{language}") => current = Some(String::new()),
            Some(block) if fence.starts_with("```") => {
                found.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    found
}

/// Every server of every `mcpServers` JSON block, and every `claude mcp add` line
/// (with its `\` continuations) of the sh blocks, of `name` under `root`.
fn registrations(root: &Path, name: &str) -> Vec<Registration> {
    let markdown = std::fs::read_to_string(root.join(name)).unwrap();
    let mut found = Vec::new();
    for block in blocks(&markdown, "json") {
        let json: Value = serde_json::from_str(&block)
            .unwrap_or_else(|error| panic!("a JSON block of {name} does not parse: {error}"));
        let Some(servers) = json["mcpServers"].as_object() else {
            continue;
        };
        for (key, server) in servers {
            let strings = |value: &Value| -> Vec<String> {
                value
                    .as_array()
                    .map(|items| {
                        items
                            .iter()
                            .map(|item| item.as_str().unwrap().to_owned())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let env = server["env"]
                .as_object()
                .map(|env| {
                    env.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            found.push(Registration {
                origin: format!("{name} .mcp.json \"{key}\""),
                command: server["command"].as_str().unwrap().to_owned(),
                args: strings(&server["args"]),
                env,
            });
        }
    }
    for block in blocks(&markdown, "sh") {
        let joined = block.replace("\\\n", " ");
        for line in joined.lines() {
            let line = line.split(" #").next().unwrap_or("").trim();
            let Some(rest) = line.strip_prefix("claude mcp add ") else {
                continue;
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            let dash = words
                .iter()
                .position(|word| *word == "--")
                .unwrap_or_else(|| panic!("{name}: no -- in {line:?}"));
            let mut env = Vec::new();
            let mut options = words[..dash].iter();
            while let Some(word) = options.next() {
                if *word == "--env" || *word == "-e" {
                    let (k, v) = options.next().unwrap().split_once('=').unwrap();
                    env.push((k.to_owned(), v.to_owned()));
                }
            }
            found.push(Registration {
                origin: format!("{name} `{line}`"),
                command: words[dash + 1].to_owned(),
                args: words[dash + 2..].iter().map(|w| (*w).to_owned()).collect(),
                env,
            });
        }
    }
    found
}

async fn install_and_register() {
    if !sandbox_tests::vm::require("mcp::install") {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let prefix = run_dir("install-prefix");
    let status = Command::new("bash")
        .arg(root.join("scripts/install.sh"))
        .args(["--debug", "--prefix"])
        .arg(&prefix)
        .status()
        .expect("cannot run scripts/install.sh");
    assert!(status.success(), "scripts/install.sh failed: {status}");
    for binary in INSTALLED {
        assert!(
            prefix.join("bin").join(binary).is_file(),
            "{binary} is not in {}/bin",
            prefix.display()
        );
    }
    let path = format!(
        "{}:{}",
        prefix.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let files = ["README.md", "mcp/README.md"];
    let all: Vec<Registration> = files
        .iter()
        .flat_map(|file| registrations(&root, file))
        .collect();
    for profile in ["default", "sandstorm"] {
        for file in files {
            assert!(
                all.iter().any(|r| r.profile() == profile
                    && r.origin.starts_with(&format!("{file} .mcp.json"))),
                "{file} shows no .mcp.json for the {profile} profile"
            );
        }
        assert!(
            all.iter()
                .any(|r| r.profile() == profile && r.origin.contains("claude mcp add")),
            "no `claude mcp add` example for the {profile} profile"
        );
    }
    let mut started: Vec<(String, Vec<String>)> = Vec::new();
    for registration in &all {
        assert_eq!(
            registration.command, "sandbox-mcp",
            "{}: the command is the installed binary on PATH",
            registration.origin
        );
        if registration.flag("--agent").is_some() {
            eprintln!(
                "not started (attach mode needs the user's agent): {}",
                registration.origin
            );
            continue;
        }
        if registration.drives_a_node() {
            // Its spellings are driven against a real daemon by python_node.rs.
            eprintln!(
                "not started (it names the user's node daemon): {}",
                registration.origin
            );
            continue;
        }
        let key = (registration.command.clone(), registration.args.clone());
        if started.contains(&key) {
            eprintln!(
                "already started with the same command: {}",
                registration.origin
            );
            continue;
        }
        started.push(key);
        eprintln!("starting {}", registration.origin);
        run_registration(registration, &path).await;
    }
    let _ = std::fs::remove_dir_all(&prefix);
}

/// Starts `registration` as its client would and runs a command in a microVM.
async fn run_registration(registration: &Registration, path: &str) {
    let run = run_dir("install-run");
    let run_text = run.display().to_string();
    let log = PathBuf::from(format!("{run_text}.log"));
    let mut envs: Vec<(&str, &str)> = registration
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    envs.push(("PATH", path));
    envs.push(("SANDBOX_RUN_DIR", &run_text));
    let args: Vec<&str> = registration.args.iter().map(String::as_str).collect();
    let server = McpServer::start_program(&registration.command, &args, &envs, &log).await;
    match registration.profile() {
        "sandstorm" => {
            let tag = registration.flag("--template").unwrap_or("default");
            let spawned = server
                .ok("spawn_sandboxes", json!({"snapshot_tag": tag, "n": 1}))
                .await;
            let sandbox = &spawned["result"][0];
            let ran = server
                .ok(
                    "exec_command",
                    json!({"sandbox_id": sandbox["id"], "args": ["echo", "installed"],
                           "sandbox_token": sandbox["token"]}),
                )
                .await;
            assert_eq!(
                ran["stdout"], "installed\n",
                "{}: {ran}",
                registration.origin
            );
        }
        "default" => {
            let claim = server.ok("create_sandbox", json!({})).await;
            let ran = server
                .ok(
                    "exec",
                    json!({"sandbox_id": claim["sandbox_id"], "command": "echo installed"}),
                )
                .await;
            assert_eq!(
                ran["stdout"], "installed\n",
                "{}: {ran}",
                registration.origin
            );
            // Regression: with the registration's `--max-sandboxes 4` (and the default
            // 4) a second claim and a fork of 3 did not fit beside the warm VM.
            server.ok("create_sandbox", json!({})).await;
            let fork = server
                .ok(
                    "fork",
                    json!({"sandbox_id": claim["sandbox_id"], "count": 3}),
                )
                .await;
            assert_eq!(
                fork["children"].as_array().map(Vec::len),
                Some(3),
                "{}: {fork}",
                registration.origin
            );
            // Past the limit the refusal names the flag that raises it.
            let refused = server
                .err(
                    "fork",
                    json!({"sandbox_id": claim["sandbox_id"], "count": 16}),
                )
                .await;
            assert!(refused.contains("--max-sandboxes"), "{refused}");
        }
        other => panic!("{}: unknown profile {other}", registration.origin),
    }
    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&run);
    let _ = std::fs::remove_dir_all(&run);
    let _ = std::fs::remove_file(&log);
}
