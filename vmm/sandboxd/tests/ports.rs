//! Ports on real QEMU microVMs through a `sandboxd` on loopback: a busybox `httpd`
//! in the guest reached by `Client::dial_port` over the node's data plane (with a
//! half close), by `sandboxctl --node ... port-forward`, and by a preview URL
//! fetched with a plain HTTP client (refused without its secret, with a wrong one,
//! and after the claim ends, all with the same 404), and a WebSocket through a preview
//! URL (the guest's handshake answer, then frames both ways); a port with nothing listening is
//! the typed `NotListening` error (and a 502 through a preview); the agent's cap on
//! port connections answers `Busy` and frees its slots when they close. Then
//! `sandboxd stop-all` leaves no QEMU, relay or run folder.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use sandbox_protocol::port::MAX_PORT_CONNECTIONS;
use sandbox_protocol::ErrorKind;
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_tests::{argv, eventually, sh};
use serde_json::{json, Value};
use support::{test_dir, Daemon, StopAllOnDrop};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How long the first claim may take (TCG on a busy 2-core host is slow).
const CLAIM_WITHIN: Duration = Duration::from_secs(240);

/// The guest port of the test's server.
const GUEST_PORT: u16 = 8000;

/// What the guest server serves.
const PAGE: &str = "hello from the guest port";

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "a_guest_server_is_reached_by_dial_port_port_forward_and_a_preview_url",
        run: || block_on(ports_end_to_end()),
    }])
}

fn field(value: &Value, name: &str) -> String {
    value[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {value}"))
        .to_owned()
}

/// `GET /` over `stream` (HTTP/1.0, then a half close) and the whole answer.
async fn get_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    path: &str,
) -> String {
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    // A half close: the server reads its end of stream and still answers.
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
        .await
        .expect("no answer within 60 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

async fn ports_end_to_end() {
    let dir = test_dir("ports");
    let _cleanup = StopAllOnDrop(dir.clone());
    let daemon = Daemon::start(&dir, &["--pool", "0", "--max-sandboxes", "2"], &[]).await;
    let claimed = tokio::time::timeout(
        CLAIM_WITHIN,
        daemon.post("/v1/claim", &json!({"ttl_seconds": 900})),
    )
    .await
    .expect("no claim in time");
    assert_eq!(claimed.status, 201, "{claimed:?}\n{}", daemon.log());
    let id = field(&claimed.json, "id");
    let token = field(&claimed.json, "token");
    let client = daemon.agent(&id, &token).await.unwrap();

    // A port with nothing listening: a typed error naming the port, at once.
    let refused = client.dial_port(GUEST_PORT).await.unwrap_err();
    assert_eq!(
        refused.wire_kind(),
        Some(ErrorKind::NotListening),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains("nothing is listening on guest port 8000"),
        "{refused}"
    );

    // busybox httpd on the guest's loopback.
    sh(
        &client,
        &format!("mkdir -p /tmp/www && echo '{PAGE}' > /tmp/www/index.html"),
    )
    .await;
    client
        .spawn(argv(&[
            "httpd",
            "-f",
            "-p",
            &format!("127.0.0.1:{GUEST_PORT}"),
            "-h",
            "/tmp/www",
        ]))
        .await
        .unwrap();
    let stream = eventually(Duration::from_secs(30), "httpd to listen", || async {
        client.dial_port(GUEST_PORT).await.ok()
    })
    .await;

    // dial_port through the node's data plane.
    let answer = get_over(stream, "/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(PAGE), "{answer}");

    // The cap: MAX_PORT_CONNECTIONS pipes held open, then one more is Busy...
    let mut held = Vec::new();
    for _ in 0..MAX_PORT_CONNECTIONS {
        held.push(client.dial_port(GUEST_PORT).await.unwrap());
    }
    let busy = client.dial_port(GUEST_PORT).await.unwrap_err();
    assert_eq!(busy.wire_kind(), Some(ErrorKind::Busy), "{busy}");
    // ...and closing them gives the slots back.
    drop(held);
    let again = eventually(Duration::from_secs(30), "a free port slot", || async {
        client.dial_port(GUEST_PORT).await.ok()
    })
    .await;
    assert!(get_over(again, "/").await.contains(PAGE));

    port_forward_through_the_node(&daemon, &id, &token).await;
    let url = preview_urls(&daemon, &id, &token).await;
    preview_websocket(&daemon, &client, &id, &token).await;

    // The claim ends: its preview URL with it.
    drop(client);
    let released = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/release"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(released.status, 200, "{released:?}");
    let gone = daemon.call("GET", &url, None, None).await;
    assert_eq!(gone.status, 404, "{gone:?}");

    let run = dir.join("run");
    support::stop_all(&dir);
    eventually(Duration::from_secs(30), "every VM to be gone", || async {
        let left = std::fs::read_dir(&run).map_or(0, |d| d.count());
        let processes = sandbox_tests::processes_mentioning(&run.display().to_string());
        (left == 0 && processes.is_empty()).then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sandboxctl --node ADDR --token T port-forward ID :8000`: prints its address,
/// serves a plain TCP client, ends with exit 0 on SIGINT (Ctrl-C).
async fn port_forward_through_the_node(daemon: &Daemon, id: &str, token: &str) {
    let mut child = tokio::process::Command::new(&sandbox_tests::binaries().sandboxctl)
        .args(["--node", &daemon.addr, "--token", token, "port-forward", id])
        .arg(format!(":{GUEST_PORT}"))
        .env_remove("SANDBOX_AGENT")
        .env_remove("SANDBOXD_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("port-forward printed nothing in 30 s")
        .unwrap()
        .unwrap();
    // "Forwarding from 127.0.0.1:PORT -> 8000"
    let local = line
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.strip_suffix(&format!(" -> {GUEST_PORT}")))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(local.starts_with("127.0.0.1:"), "{local}");
    for _ in 0..3 {
        let stream = tokio::net::TcpStream::connect(&local).await.unwrap();
        let answer = get_over(stream, "/").await;
        assert!(answer.contains(PAGE), "{answer}");
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("port-forward did not end on SIGINT")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Mints a preview URL as seed 000's SDK does (the token in the body, no Bearer),
/// fetches it with a plain client, and checks the refusals. Returns the URL's path.
async fn preview_urls(daemon: &Daemon, id: &str, token: &str) -> String {
    let path = format!("/v1/sandboxes/{id}/preview");
    let minted = daemon
        .call(
            "POST",
            &path,
            None,
            Some(&json!({"token": token, "port": GUEST_PORT})),
        )
        .await;
    assert_eq!(minted.status, 200, "{minted:?}\n{}", daemon.log());
    assert_eq!(minted.json["port"], GUEST_PORT);
    assert!(!field(&minted.json, "expires_at").is_empty(), "{minted:?}");
    let url = field(&minted.json, "url");
    let prefix = format!("http://{}", daemon.addr);
    let url_path = url
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{url} is not on {prefix}"))
        .to_owned();
    assert!(url_path.starts_with("/preview/") && url_path.ends_with('/'));

    // A plain HTTP client, no Bearer: the secret in the path is the credential.
    let page = daemon.call("GET", &url_path, None, None).await;
    assert_eq!(page.status, 200, "{page:?}\n{}", daemon.log());
    assert!(page.text.contains(PAGE), "{page:?}");
    let file = daemon
        .call("GET", &format!("{url_path}index.html?x=1"), None, None)
        .await;
    assert_eq!(file.status, 200, "{file:?}");
    assert!(file.text.contains(PAGE), "{file:?}");

    // Without the secret, with a wrong one: the same 404, saying nothing more.
    let none = daemon.call("GET", "/preview/", None, None).await;
    let wrong = daemon
        .call("GET", &format!("/preview/{}/", "0".repeat(64)), None, None)
        .await;
    assert_eq!(none.status, 404, "{none:?}");
    assert_eq!(wrong.status, 404, "{wrong:?}");
    assert_eq!(wrong.json["error"], "No such preview", "{wrong:?}");
    // Minting needs the sandbox's token (or the operator's).
    let anonymous = daemon
        .call("POST", &path, None, Some(&json!({"port": GUEST_PORT})))
        .await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");

    // A link to a port with nothing on it: 502, the reason named.
    let closed = daemon
        .call(
            "POST",
            &path,
            Some(token),
            Some(&json!({"port": 8001, "ttl_seconds": 60})),
        )
        .await;
    assert_eq!(closed.status, 200, "{closed:?}");
    let closed_url = field(&closed.json, "url");
    let closed_path = closed_url.strip_prefix(&prefix).unwrap();
    let bad_gateway = daemon.call("GET", closed_path, None, None).await;
    assert_eq!(bad_gateway.status, 502, "{bad_gateway:?}");
    assert!(
        bad_gateway
            .text
            .contains("nothing is listening on guest port 8001"),
        "{bad_gateway:?}"
    );
    url_path
}

/// The guest port of the WebSocket server.
const WEBSOCKET_PORT: u16 = 8002;

/// A WebSocket handshake in busybox sh (run per connection by `nc -ll -e`): reads
/// the request's headers (header names as any case: the node's proxy sends them
/// lower-cased), answers `101` with the key's `Sec-WebSocket-Accept`, then echoes
/// every byte back (`cat`), frames included.
const WEBSOCKET_SERVER: &str = r#"#!/bin/sh
key=
while IFS= read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in [Ss]ec-[Ww]eb[Ss]ocket-[Kk]ey:*) key=$(printf '%s' "${line#*:}" | tr -d ' ');; esac
done
accept=$(printf '%s' "${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11" | sha1sum | cut -d' ' -f1 | xxd -r -p | base64)
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' "$accept"
exec cat
"#;

/// A WebSocket through a preview URL: the client's upgrade reaches the guest server,
/// its `101` and accept key come back, and then bytes flow both ways (a masked text
/// frame out, the same frame echoed back) over the joined connections.
async fn preview_websocket(daemon: &Daemon, client: &sandbox_vmm::Client, id: &str, token: &str) {
    sh(
        client,
        &format!("cat > /tmp/ws.sh <<'EOF'\n{WEBSOCKET_SERVER}EOF\nchmod +x /tmp/ws.sh"),
    )
    .await;
    client
        .spawn(argv(&[
            "nc",
            "-ll",
            "-p",
            &WEBSOCKET_PORT.to_string(),
            "-e",
            "/tmp/ws.sh",
        ]))
        .await
        .unwrap();
    let minted = daemon
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/preview"),
            Some(token),
            Some(&json!({"port": WEBSOCKET_PORT})),
        )
        .await;
    assert_eq!(minted.status, 200, "{minted:?}");
    let url = field(&minted.json, "url");
    let path = url
        .strip_prefix(&format!("http://{}", daemon.addr))
        .unwrap()
        .to_owned();
    // RFC 6455's own example key and its accept value.
    let request = format!(
        "GET {path}chat HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        daemon.addr
    );
    let mut stream = eventually(Duration::from_secs(30), "the WebSocket server", || async {
        let mut stream = tokio::net::TcpStream::connect(&daemon.addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let head = read_head(&mut stream).await?;
        head.starts_with("HTTP/1.1 101").then_some((stream, head))
    })
    .await;
    let head = &stream.1;
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    // A masked text frame "hello" (RFC 6455 5.7), echoed byte for byte.
    let frame = [
        0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    for _ in 0..3 {
        stream.0.write_all(&frame).await.unwrap();
        let mut echoed = [0u8; 11];
        tokio::time::timeout(Duration::from_secs(30), stream.0.read_exact(&mut echoed))
            .await
            .expect("no echo within 30 s")
            .unwrap();
        assert_eq!(echoed, frame);
    }
}

/// An HTTP answer's head (up to the blank line), read byte by byte so nothing after
/// it is consumed; `None` if the connection ends first.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut byte))
            .await
            .ok()?
            .ok()?;
        if read == 0 || head.len() > 16 * 1024 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}
