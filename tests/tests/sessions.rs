//! Interpreter sessions that need an agent of their own, so they cannot run in the
//! shared `suite`: the template's boot sessions (`--image-config`), and the cap on
//! live sessions, which counts every session of the agent.

// Tests fail by panicking, with the error in the message.
#![allow(clippy::unwrap_used)]

use sandbox_protocol::eval::MAX_SESSIONS;
use sandbox_protocol::{ErrorKind, EvalReply, EvalRequest, Language, ProcessKind, ProcessState};
use sandbox_tests::{wait_exit, within, AgentOptions, TempDir, TestAgent};
use sandbox_vmm::client::Client;

fn request(session: &str, language: Language, code: &str) -> EvalRequest {
    EvalRequest {
        session: session.to_owned(),
        language,
        code: code.to_owned(),
        timeout_ms: None,
        restart: false,
    }
}

async fn eval(client: &Client, session: &str, language: Language, code: &str) -> EvalReply {
    within(60, client.eval(request(session, language, code)))
        .await
        .unwrap_or_else(|error| panic!("{session}: {code:?}: {error}"))
}

#[tokio::test]
async fn boot_sessions_are_started_and_set_up_before_the_agent_listens() {
    let dir = TempDir::new("image-config");
    let image = dir.path().join("image.json");
    let config = serde_json::json!({
        "env": [["GREETING", "from the template"]],
        "cwd": dir.path(),
        "sessions": [
            // The pause is the test: the agent must not listen before it is over.
            {"name": "default", "language": "python",
             "setup": "import json, time\ntime.sleep(0.5)\nwarm = json.dumps([1, 2])"},
            {"name": "shell", "language": "sh", "setup": "WARM=yes"},
            {"name": "broken", "language": "python", "setup": "raise RuntimeError('no')"},
            {"name": "bad name", "language": "sh"},
        ],
    });
    std::fs::write(&image, config.to_string()).unwrap();
    let agent = TestAgent::start_with(AgentOptions {
        image_config: Some(image),
        ..AgentOptions::default()
    });
    let client = agent.client().await;
    // Listed before any evaluation; the invalid one was skipped.
    let mut names: Vec<String> = client
        .ps()
        .await
        .unwrap()
        .into_iter()
        .filter(|row| row.kind == ProcessKind::Session && row.state == ProcessState::Running)
        .filter_map(|row| row.argv.last().cloned())
        .collect();
    names.sort();
    assert_eq!(names, ["broken", "default", "shell"]);
    // Set up already: the first evaluation finds the setup's state, in the
    // template's environment and working directory.
    let reply = eval(&client, "default", Language::Python, "warm").await;
    assert_eq!(reply.value.as_deref(), Some("'[1, 2]'"));
    assert!(
        !reply.session.started,
        "a boot session is not started by its first use"
    );
    assert_eq!(reply.session.evaluations, 1, "the setup is not counted");
    let code = "import os\n(os.environ['GREETING'], os.getcwd())";
    let reply = eval(&client, "default", Language::Python, code).await;
    let expected = format!("('from the template', '{}')", dir.path().display());
    assert_eq!(reply.value, Some(expected));
    let reply = eval(
        &client,
        "shell",
        Language::Shell,
        "echo \"$WARM $GREETING\"",
    )
    .await;
    assert_eq!(reply.stdout, b"yes from the template\n");
    // A setup that raised is logged, and its session stays.
    let reply = eval(&client, "broken", Language::Python, "1 + 1").await;
    assert_eq!(reply.value.as_deref(), Some("2"));
    assert!(
        agent.log().contains("boot session setup raised"),
        "{}",
        agent.log()
    );
    assert!(agent.log().contains("invalid name"), "{}", agent.log());
}

#[tokio::test]
async fn live_sessions_are_capped_and_dead_or_closed_ones_make_room() {
    let agent = TestAgent::start();
    let client = agent.client().await;
    let mut pids = Vec::new();
    for n in 0..MAX_SESSIONS {
        let reply = eval(&client, &format!("s{n}"), Language::Shell, "true").await;
        pids.push(reply.session.pid);
    }
    let busy = |name: &'static str| {
        let client = client.clone();
        async move {
            let error = within(20, client.eval(request(name, Language::Shell, "true")))
                .await
                .unwrap_err();
            assert_eq!(error.wire_kind(), Some(ErrorKind::Busy), "{error}");
        }
    };
    busy("one-more").await;
    // A session that died frees its place; its name is remembered as dead.
    client.kill(pids[0], libc::SIGKILL).await.unwrap();
    wait_exit(&client, pids[0]).await;
    eval(&client, "one-more", Language::Shell, "true").await;
    let error = within(20, client.eval(request("s0", Language::Shell, "true")))
        .await
        .unwrap_err();
    assert_eq!(error.wire_kind(), Some(ErrorKind::NotFound), "{error}");
    busy("two-more").await;
    within(20, client.close_session("s1")).await.unwrap();
    eval(&client, "two-more", Language::Shell, "true").await;
    // Existing sessions are still served at the cap.
    let reply = eval(&client, "s2", Language::Shell, "echo still").await;
    assert_eq!(reply.stdout, b"still\n");
}

#[tokio::test]
async fn an_interpreter_that_does_not_load_the_driver_is_reported_with_what_it_printed() {
    // A `python3` that is not Python (the template's PATH finds it first).
    let dir = TempDir::new("fake-python");
    let fake = dir.path().join("python3");
    std::fs::write(&fake, "#!/bin/sh\necho 'this is not python' >&2\nexit 2\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let image = dir.path().join("image.json");
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    std::fs::write(
        &image,
        serde_json::json!({"env": [["PATH", path]]}).to_string(),
    )
    .unwrap();
    let agent = TestAgent::start_with(AgentOptions {
        image_config: Some(image),
        ..AgentOptions::default()
    });
    let client = agent.client().await;
    let error = within(60, client.eval(request("fake", Language::Python, "1")))
        .await
        .unwrap_err();
    assert_eq!(error.wire_kind(), Some(ErrorKind::Internal), "{error}");
    let message = error.to_string();
    assert!(message.contains("did not load its driver"), "{message}");
    assert!(message.contains("exited with code 2"), "{message}");
    assert!(message.contains("this is not python"), "{message}");
    // The agent is fine, and sh sessions work in the same environment.
    let reply = eval(&client, "sh", Language::Shell, "echo ok").await;
    assert_eq!(reply.stdout, b"ok\n");
}
