//! `wait_for_text`: a file that already holds the text, gets it by an append, by a
//! rename over it, is created later in a directory created later, or gets it in two
//! writes; a spawned process that prints it on stdout or stderr, or exits without
//! it; the deadline; every refused input; and a cancelled or disconnected wait that
//! leaves no inotify descriptor behind in the agent.
//!
//! A change meant to happen while the agent waits is made once the agent is seen
//! watching (its inotify descriptor's `fdinfo` lists the scenario's directory), so
//! no scenario depends on a pause being long enough.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_protocol::wait::{MAX_WAIT_TEXT_BYTES, WAIT_MAX_TIMEOUT_MS};
use sandbox_protocol::{
    ErrorKind, Pid, Request, Stream, TextFound, WaitForTextRequest, WaitTarget,
};
use sandbox_vmm::client::{Client, ClientError};
use tokio::task::JoinHandle;

use crate::transport::Target;
use crate::{eventually, sh, shell, within};

/// How long a scenario's waits may take in the agent (a microVM under emulation on
/// a loaded host is slow; a passing wait returns as soon as the text is there).
const WAIT: Duration = Duration::from_secs(60);

/// How long the test lets a wait take before failing, above [`WAIT`].
const WITHIN_SECS: u64 = 90;

/// The agent's descriptors (numbers, as text) holding an inotify watch on `dir`:
/// the watch list in `/proc/AGENT/fdinfo` names each watched inode. The agent is the
/// parent of every shell it runs.
async fn watchers(client: &Client, dir: &Path) -> Vec<String> {
    let script = format!(
        "hex=$(printf %x \"$(stat -c %i '{}')\"); \
         for f in /proc/$PPID/fdinfo/*; do \
           grep -q \"^inotify wd:.* ino:$hex \" \"$f\" 2>/dev/null && echo \"${{f##*/}}\"; \
         done; true",
        dir.display()
    );
    sh(client, &script)
        .await
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Waits until the agent watches `dir`; returns the descriptors that do.
async fn until_watched(client: &Client, dir: &Path) -> Vec<String> {
    let what = format!("the agent to watch {}", dir.display());
    eventually(Duration::from_secs(30), &what, || async {
        let fds = watchers(client, dir).await;
        (!fds.is_empty()).then_some(fds)
    })
    .await
}

/// Waits until nothing of the wait on `dir` is left in the agent: no descriptor
/// watches it, each descriptor `fds` that did is closed or now something else (an
/// inotify instance that lost its watches but stayed open would be a leak), and no
/// descriptor has a file under `dir` open.
async fn until_released(client: &Client, dir: &Path, fds: &[String]) {
    let mut script = String::new();
    for fd in fds {
        script.push_str(&format!(
            "[ \"$(readlink /proc/$PPID/fd/{fd} 2>/dev/null)\" = anon_inode:inotify ] && \
             ! grep -q '^inotify wd:' /proc/$PPID/fdinfo/{fd} 2>/dev/null && echo 'leaked {fd}'; "
        ));
    }
    script.push_str(&format!(
        "ls -l /proc/$PPID/fd 2>/dev/null | grep -F '{}' | sed 's/^/open /'; true",
        dir.display()
    ));
    let what = format!("the agent to drop its watch of {}", dir.display());
    eventually(Duration::from_secs(30), &what, || async {
        let left = sh(client, &script).await;
        (watchers(client, dir).await.is_empty() && left.trim().is_empty()).then_some(())
    })
    .await;
}

/// Starts waiting for `text` in `path` on a task of its own.
fn wait_file(
    client: &Client,
    path: &Path,
    text: &str,
) -> JoinHandle<Result<TextFound, ClientError>> {
    let (client, path, text) = (client.clone(), path.to_owned(), text.to_owned());
    tokio::spawn(async move { client.wait_for_file_text(&path, text, Some(WAIT)).await })
}

/// The result of a wait started with [`wait_file`].
async fn found(waiter: JoinHandle<Result<TextFound, ClientError>>) -> TextFound {
    within(WITHIN_SECS, waiter)
        .await
        .expect("the wait's task panicked")
        .unwrap_or_else(|e| panic!("the wait failed: {e}"))
}

/// Appends `data` to `path` in the agent's machine (one `write`). `data` is a
/// `printf` format: `\\n` is a newline; no `%` or `'`.
async fn append(client: &Client, path: &Path, data: &str) {
    sh(client, &format!("printf '{data}' >> '{}'", path.display())).await;
}

/// The agent's error kind and message for a wait that must fail.
async fn refused(
    client: &Client,
    target: WaitTarget,
    text: &str,
    timeout: Option<Duration>,
) -> (ErrorKind, String) {
    let error = within(WITHIN_SECS, client.wait_for_text(target, text, timeout))
        .await
        .expect_err("the wait should have failed");
    let kind = error
        .wire_kind()
        .unwrap_or_else(|| panic!("not an agent error: {error}"));
    (kind, error.to_string())
}

fn file(path: impl Into<PathBuf>) -> WaitTarget {
    WaitTarget::File(path.into().into_os_string().into_encoded_bytes())
}

pub async fn text_already_in_a_file_is_found_at_once(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-there").await;
    let path = dir.join("log");
    client
        .write_file(&path, b"booting\nserver ready on :80\n".to_vec(), None)
        .await
        .unwrap();
    let found = within(
        WITHIN_SECS,
        client.wait_for_file_text(&path, "ready", Some(WAIT)),
    )
    .await
    .unwrap();
    assert_eq!(
        found,
        TextFound {
            offset: 15,
            stream: None,
            line: "server ready on :80".into(),
            waited_ms: 0,
        }
    );
    // A zero timeout still looks once.
    let found = client
        .wait_for_file_text(&path, "booting", Some(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(found.offset, 0);
}

pub async fn text_appended_later_is_found(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-append").await;
    let path = dir.join("log");
    client
        .write_file(&path, b"starting\n".to_vec(), None)
        .await
        .unwrap();
    let waiter = wait_file(client, &path, "listening on");
    until_watched(client, &dir).await;
    append(client, &path, "noise\\n").await;
    append(client, &path, "now listening on 8080\\n").await;
    let found = found(waiter).await;
    assert_eq!(found.offset, 19);
    assert_eq!(found.line, "now listening on 8080");
    assert!(found.waited_ms > 0, "{found:?}");
}

pub async fn text_split_across_two_writes_is_found(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-split").await;
    let path = dir.join("log");
    client.write_file(&path, Vec::new(), None).await.unwrap();
    let waiter = wait_file(client, &path, "listening on");
    until_watched(client, &dir).await;
    append(client, &path, "xx listen").await;
    append(client, &path, "ing on 1\\n").await;
    let found = found(waiter).await;
    assert_eq!(
        (found.offset, found.line.as_str()),
        (3, "xx listening on 1")
    );
}

pub async fn a_file_replaced_by_a_rename_is_scanned_anew(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-rename").await;
    let path = dir.join("status");
    client
        .write_file(&path, b"state: starting, not yet\n".to_vec(), None)
        .await
        .unwrap();
    let waiter = wait_file(client, &path, "state: up");
    until_watched(client, &dir).await;
    let next = dir.join("status.next");
    client
        .write_file(&next, b"state: up\n".to_vec(), None)
        .await
        .unwrap();
    client.rename(&next, &path).await.unwrap();
    let found = found(waiter).await;
    // Offset 0 of the new file: the old one's bytes are not counted.
    assert_eq!((found.offset, found.line.as_str()), (0, "state: up"));
}

pub async fn a_file_created_later_in_a_new_directory_is_found(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-new-dir").await;
    let path = dir.join("out/logs/job.log");
    let waiter = wait_file(client, &path, "done");
    // Its directory does not exist: the nearest ancestor that does is watched.
    until_watched(client, &dir).await;
    client
        .mkdir(dir.join("out/logs"), true, None)
        .await
        .unwrap();
    append(client, &path, "job done\\n").await;
    let found = found(waiter).await;
    assert_eq!((found.offset, found.line.as_str()), (4, "job done"));
    // The waits of this scenario are over: nothing of them is left in the agent.
    until_released(client, &dir, &[]).await;
}

pub async fn a_spawned_process_output_is_found_in_its_stream(target: Target) {
    let client = target.client();
    let pid = client
        .spawn(shell(
            "echo booting; echo 'warn: listening on :8080' >&2; echo 'ready on stdout'; exec sleep 60",
        ))
        .await
        .unwrap();
    let on_stderr = within(
        WITHIN_SECS,
        client.wait_for_output_text(pid, "listening on", Some(WAIT)),
    )
    .await
    .unwrap();
    assert_eq!(on_stderr.stream, Some(Stream::Stderr));
    assert_eq!(on_stderr.line, "warn: listening on :8080");
    let on_stdout = within(
        WITHIN_SECS,
        client.wait_for_output_text(pid, "ready", Some(WAIT)),
    )
    .await
    .unwrap();
    assert_eq!(on_stdout.stream, Some(Stream::Stdout));
    assert_eq!(on_stdout.line, "ready on stdout");
    // The offsets are those logs reports.
    let logs = client.logs(pid, Some(0)).await.unwrap();
    for (found, text) in [(&on_stderr, "listening on"), (&on_stdout, "ready")] {
        let chunk = logs
            .batch
            .chunks
            .iter()
            .find(|c| c.offset <= found.offset && found.offset < c.offset + c.data.len() as u64)
            .expect("no chunk holds the offset");
        assert_eq!(chunk.stream, found.stream.unwrap());
        let at = usize::try_from(found.offset - chunk.offset).unwrap();
        assert!(chunk.data[at..].starts_with(text.as_bytes()), "{found:?}");
    }
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

pub async fn output_printed_later_by_a_server_is_waited_for(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-server").await;
    let go = dir.join("go");
    // The server prints its line once the test lets it (a file appears).
    let script = format!(
        "echo starting; while [ ! -e '{}' ]; do sleep 0.05; done; echo 'Listening on http://0.0.0.0:8000'; exec sleep 60",
        go.display()
    );
    let pid = client.spawn(shell(&script)).await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .wait_for_output_text(pid, "Listening on", Some(WAIT))
                .await
        })
    };
    client.write_file(&go, Vec::new(), None).await.unwrap();
    let found = found(waiter).await;
    assert_eq!(found.offset, 9);
    assert_eq!(found.stream, Some(Stream::Stdout));
    assert_eq!(found.line, "Listening on http://0.0.0.0:8000");
    client.kill(pid, libc::SIGKILL).await.unwrap();
}

pub async fn a_process_that_exits_without_the_text_fails_at_once(target: Target) {
    let client = target.client();
    let pid = client
        .spawn(shell("echo 'not it'; sleep 0.2; exit 3"))
        .await
        .unwrap();
    let started = Instant::now();
    let (kind, message) = refused(client, WaitTarget::Output(pid), "ready", Some(WAIT)).await;
    assert_eq!(kind, ErrorKind::NotFound);
    assert!(
        message.contains(&format!(
            "Process {pid} exited (code 3) without printing \"ready\""
        )),
        "{message}"
    );
    assert!(started.elapsed() < WAIT / 2, "it waited for the deadline");
}

pub async fn the_deadline_is_a_timed_out_error(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-deadline").await;
    let path = dir.join("log");
    client
        .write_file(&path, b"abc\n".to_vec(), None)
        .await
        .unwrap();
    let started = Instant::now();
    let (kind, message) = refused(
        client,
        file(&path),
        "never",
        Some(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(kind, ErrorKind::TimedOut);
    assert!(message.contains("Timed out after"), "{message}");
    assert!(message.contains("scanned 4 bytes"), "{message}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let pid = client.spawn(shell("exec sleep 60")).await.unwrap();
    let (kind, message) = refused(
        client,
        WaitTarget::Output(pid),
        "never",
        Some(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(kind, ErrorKind::TimedOut);
    assert!(message.contains("still running"), "{message}");
    client.kill(pid, libc::SIGKILL).await.unwrap();
    until_released(client, &dir, &[]).await;
}

pub async fn bad_input_gets_a_typed_error_each(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-bad").await;
    let fifo = dir.join("fifo");
    sh(client, &format!("mkfifo '{}'", fifo.display())).await;
    let plain = dir.join("plain");
    client.write_file(&plain, Vec::new(), None).await.unwrap();
    let ok = Some(WAIT);
    let cases: Vec<(WaitTarget, String, Option<Duration>, ErrorKind, &str)> = vec![
        (
            file(&dir),
            "x".into(),
            ok,
            ErrorKind::WrongType,
            "is a directory",
        ),
        (
            file("/dev/null"),
            "x".into(),
            ok,
            ErrorKind::WrongType,
            "is a character device",
        ),
        // Never opened: opening a FIFO would block the wait.
        (
            file(&fifo),
            "x".into(),
            ok,
            ErrorKind::WrongType,
            "is a FIFO",
        ),
        (
            file(plain.join("sub/log")),
            "x".into(),
            ok,
            ErrorKind::WrongType,
            "is not a directory",
        ),
        (
            file("relative/log"),
            "x".into(),
            ok,
            ErrorKind::BadRequest,
            "not absolute",
        ),
        (
            file(&plain),
            String::new(),
            ok,
            ErrorKind::BadRequest,
            "empty",
        ),
        (
            file(&plain),
            "x".repeat(MAX_WAIT_TEXT_BYTES + 1),
            ok,
            ErrorKind::TooLarge,
            "over the limit of 4096 bytes",
        ),
        (
            file(&plain),
            "x".into(),
            Some(Duration::from_millis(WAIT_MAX_TIMEOUT_MS + 1)),
            ErrorKind::BadRequest,
            "5-minute cap",
        ),
        (
            WaitTarget::Output(Pid(i32::MAX)),
            "x".into(),
            ok,
            ErrorKind::NotFound,
            "No tracked process",
        ),
    ];
    for (target, text, timeout, kind, says) in cases {
        let what = format!("{target:?}");
        let (got, message) = refused(client, target, &text, timeout).await;
        assert_eq!(got, kind, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message}");
    }
    // None of them left a watch behind, and the agent serves on.
    until_released(client, &dir, &[]).await;
    target.assert_serves().await;
}

pub async fn a_cancelled_or_abandoned_wait_leaves_no_descriptor_behind(target: Target) {
    let client = target.client();
    let dir = target.scratch("wait-cancel").await;
    let path = dir.join("log");
    client
        .write_file(&path, b"x\n".to_vec(), None)
        .await
        .unwrap();
    let request = || {
        Request::WaitForText(WaitForTextRequest {
            target: file(&path),
            text: "never".into(),
            timeout_ms: None,
        })
    };

    // An explicit Cancel gets the request's final frame.
    let stream = client.stream(request()).unwrap();
    let fds = until_watched(client, &dir).await;
    within(20, stream.cancel()).await.unwrap();
    until_released(client, &dir, &fds).await;

    // Dropping the future sends Cancel too.
    let waiter = wait_file(client, &path, "never");
    let fds = until_watched(client, &dir).await;
    waiter.abort();
    until_released(client, &dir, &fds).await;

    // A client that disconnects mid-wait.
    let other = target.connect().await;
    let stream = other.stream(request()).unwrap();
    let fds = until_watched(client, &dir).await;
    drop(stream);
    drop(other);
    until_released(client, &dir, &fds).await;
    target.assert_serves().await;
}
