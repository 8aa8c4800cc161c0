//! `create_sandbox` with `net: "egress"` through a real `sandbox-mcp` and real
//! microVMs: the operator's allowlist (`--egress-allow`) narrowed by a sandbox's own
//! `allow` (never widened), a bad entry refused with a clear error, `egress_log`
//! listing what was allowed and denied, a forked child with egress and its own log,
//! and a default sandbox with no proxy at all.
//! The destinations are HTTP servers this test starts on the host's loopback.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::json;
use support::Folders;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "create_sandbox_net_egress_narrows_the_servers_allowlist_and_logs_each_attempt",
        run: || block_on(egress()),
    }])
}

/// A one-answer HTTP server on `ip`, counting its connections.
async fn server(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!("served by {}\n", addr.port());
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (addr, count)
}

async fn egress() {
    let Some(folders) = Folders::new("egress", "allow") else {
        return;
    };
    let (a, _) = server("127.0.0.2").await;
    let (b, b_count) = server("127.0.0.3").await;
    let (c, c_count) = server("127.0.0.4").await;
    // The operator allows a and b; c is nowhere in its list.
    let operator = format!("--egress-allow={a},{b}");
    let server = folders
        .server(&["--pool", "0", "--max-sandboxes", "3", &operator])
        .await;

    let bad = server
        .err(
            "create_sandbox",
            json!({"net": "egress", "allow": ["10.0.0.1/8"]}),
        )
        .await;
    assert!(
        bad.contains("Bad allowlist entry \"10.0.0.1/8\"") && bad.contains("CIDR"),
        "{bad}"
    );
    let stray = server
        .err("create_sandbox", json!({"allow": [a.to_string()]}))
        .await;
    assert!(stray.contains("net \"egress\""), "{stray}");

    // The sandbox narrows the list to a, and tries to add c: it gets a only.
    let created = server
        .ok(
            "create_sandbox",
            json!({"net": "egress", "allow": [a.to_string(), c.to_string()]}),
        )
        .await;
    let id = created["sandbox_id"].as_str().unwrap().to_owned();
    let wget = |addr: SocketAddr| json!({"sandbox_id": id, "command": format!("wget -q -O - http://{addr}/ 2>&1")});
    let ok = server.ok("exec", wget(a)).await;
    assert_eq!(ok["exit_code"], 0, "{ok}");
    assert_eq!(ok["stdout"], format!("served by {}\n", a.port()));
    for (denied, count) in [(b, &b_count), (c, &c_count)] {
        let refused = server.ok("exec", wget(denied)).await;
        assert_ne!(refused["exit_code"], 0, "{refused}");
        assert!(
            refused["stdout"].as_str().unwrap().contains("403"),
            "{refused}"
        );
        assert_eq!(count.load(Ordering::SeqCst), 0, "{denied} was dialled");
    }

    let log = support::eventually(
        std::time::Duration::from_secs(10),
        "the allowed connection's record",
        || async {
            let log = server.ok("egress_log", json!({"sandbox_id": id})).await;
            let records = log["records"].as_array().unwrap().clone();
            records
                .iter()
                .any(|r| r["verdict"] == "allowed")
                .then_some(log)
        },
    )
    .await;
    let records = log["records"].as_array().unwrap();
    assert_eq!(
        log["server_allowlist"],
        json!([a.to_string(), b.to_string()])
    );
    let allowed: Vec<_> = records
        .iter()
        .filter(|r| r["verdict"] == "allowed")
        .collect();
    assert_eq!(allowed.len(), 1, "{log}");
    assert_eq!(allowed[0]["destination"], a.to_string());
    assert!(allowed[0]["bytes_in"].as_u64().unwrap() > 0, "{log}");
    let denied: Vec<_> = records
        .iter()
        .filter(|r| r["verdict"] == "denied")
        .collect();
    assert_eq!(denied.len(), 2, "{log}");
    for (record, addr) in denied.iter().zip([b, c]) {
        assert_eq!(record["destination"], addr.to_string());
        assert!(
            record["reason"]
                .as_str()
                .unwrap()
                .contains("not in the allowlist"),
            "{record}"
        );
    }

    // A forked child has the same egress, through its own relay, in its own log.
    let fork = server
        .ok("fork", json!({"sandbox_id": id, "count": 1}))
        .await;
    let child = fork["children"][0]["sandbox_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let from_child = server
        .ok(
            "exec",
            json!({"sandbox_id": child, "command": format!("wget -q -O - http://{a}/ 2>&1")}),
        )
        .await;
    assert_eq!(
        from_child["stdout"],
        format!("served by {}\n", a.port()),
        "{from_child}"
    );
    let child_log = support::eventually(
        std::time::Duration::from_secs(10),
        "the child's record",
        || async {
            let log = server.ok("egress_log", json!({"sandbox_id": child})).await;
            (!log["records"].as_array().unwrap().is_empty()).then_some(log)
        },
    )
    .await;
    let child_records = child_log["records"].as_array().unwrap();
    assert_eq!(child_records.len(), 1, "{child_log}");
    assert_eq!(child_records[0]["verdict"], "allowed");
    server.ok("release", json!({"sandbox_id": child})).await;

    // A default sandbox has no proxy and nothing in its log.
    let plain = server.ok("create_sandbox", json!({})).await;
    let plain_id = plain["sandbox_id"].as_str().unwrap();
    let env = server
        .ok(
            "exec",
            json!({"sandbox_id": plain_id, "command": "env | grep -ci _proxy || true"}),
        )
        .await;
    assert_eq!(env["stdout"], "0\n", "{env}");
    let empty = server
        .ok("egress_log", json!({"sandbox_id": plain_id}))
        .await;
    assert_eq!(empty["records"], json!([]), "{empty}");
}
