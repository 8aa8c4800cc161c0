//! The host file tools (`copy_from_host`, `copy_to_host`, `list_host_dir`) on real
//! QEMU microVMs, driven by rmcp's MCP client against a server started with one
//! `--host-dir`: 20 MiB both ways with checksums, a directory as destination on
//! either side, the permission bits (never setuid on the host), and what an attacker
//! would try, each refused as an `isError` that names the next step: a path outside,
//! `..`, absolute and relative links out, a FIFO (which must not hang the server), a
//! destination directory that is a link out, an existing file, a host FIFO as
//! destination, a sandbox file over the size limit (seen by its size, and through a
//! link that hides it, cut off while streaming), a device in the sandbox, and a link
//! swapped back and forth during copies (the secret it points to never arrives, and
//! nothing is written through it). Without `--host-dir` the tools are not offered.
//! No temporary file is left behind, nor any VM after the session.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! test ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::{assert_nothing_left, Folders};

/// The server's `--host-max-bytes`: above the 20 MiB round trip, below the 30 MiB
/// sparse file.
const HOST_MAX_BYTES: u64 = 24 << 20;

/// Copies made while a link is swapped underneath them.
const SWAP_ROUNDS: usize = 12;

/// How long the swapped name stays a link, or a file or directory.
const SWAP_HOLD: Duration = Duration::from_millis(3);

fn main() -> std::process::ExitCode {
    vm_main(&[VmTest {
        name: "host_files_cross_both_ways_under_the_allowed_directory_only",
        run: || block_on(host_files()),
    }])
}

/// `copy_from_host`'s arguments.
fn in_args(id: &str, host_path: &str, path: &str) -> Value {
    json!({"sandbox_id": id, "host_path": host_path, "path": path})
}

/// `copy_to_host`'s arguments.
fn out_args(id: &str, path: &str, host_path: &str) -> Value {
    json!({"sandbox_id": id, "path": path, "host_path": host_path})
}

fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// The test's host tree: `allowed/{in,out}` (the `--host-dir`) and, beside it,
/// what must never be read or written: `secret` and `outside/`.
struct Tree {
    top: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let top = PathBuf::from(format!("/tmp/sbx-mcp-hostfiles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        for dir in ["allowed/in", "allowed/out", "outside"] {
            std::fs::create_dir_all(top.join(dir)).unwrap();
        }
        std::fs::write(top.join("secret"), b"SECRET").unwrap();
        Self { top }
    }

    fn allowed(&self) -> PathBuf {
        self.top.join("allowed")
    }

    /// A path under the allowed directory, as the client names it.
    fn at(&self, rest: &str) -> String {
        self.allowed().join(rest).display().to_string()
    }

    /// Names in `allowed/out`.
    fn out_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.allowed().join("out"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.top);
        }
    }
}

async fn host_files() {
    let Some(folders) = Folders::new("host", "host") else {
        return;
    };
    // Not offered without --host-dir.
    {
        let server = folders.server(&["--pool", "0"]).await;
        let tools = server.session().list_all_tools().await.unwrap();
        assert!(
            !tools.iter().any(|tool| tool.name.contains("host")),
            "host tools without --host-dir"
        );
        server.disconnect(Duration::from_secs(30)).await;
    }

    let tree = Tree::new();
    let data = support::noise(20 << 20);
    std::fs::write(tree.allowed().join("in/big.bin"), &data).unwrap();
    let script = tree.allowed().join("in/hello.sh");
    std::fs::write(&script, b"#!/bin/sh\necho hello from the host\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    symlink(tree.top.join("secret"), tree.allowed().join("in/abs")).unwrap();
    symlink("../../secret", tree.allowed().join("in/rel")).unwrap();
    symlink("hello.sh", tree.allowed().join("in/inside")).unwrap();
    nix::unistd::mkfifo(
        &tree.allowed().join("in/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    nix::unistd::mkfifo(
        &tree.allowed().join("out/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    symlink(tree.top.join("outside"), tree.allowed().join("out/trap")).unwrap();
    std::fs::write(tree.allowed().join("out/keep.txt"), b"keep").unwrap();

    let allowed = tree.allowed().display().to_string();
    let max = HOST_MAX_BYTES.to_string();
    let server = folders
        .server(&[
            "--pool",
            "1",
            "--max-sandboxes",
            "1",
            "--host-dir",
            &allowed,
            "--host-max-bytes",
            &max,
        ])
        .await;
    let tools = server.session().list_all_tools().await.unwrap();
    for name in ["copy_from_host", "copy_to_host", "list_host_dir"] {
        let tool = tools
            .iter()
            .find(|tool| tool.name == name)
            .unwrap_or_else(|| panic!("{name} is not offered"));
        let description = tool.description.as_deref().unwrap_or("");
        assert!(description.contains(&allowed), "{name}: {description}");
    }
    let roots = server.ok("list_host_dir", json!({})).await;
    assert_eq!(roots["entries"][0]["name"], allowed.as_str(), "{roots}");
    let listed = server
        .ok("list_host_dir", json!({"host_path": tree.at("in")}))
        .await;
    let kinds: Vec<(String, String)> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("big.bin".into(), "file".into()))
            && kinds.contains(&("abs".into(), "symlink".into()))
            && kinds.contains(&("fifo".into(), "other".into())),
        "{listed}"
    );

    let claim = server.ok("create_sandbox", json!({})).await;
    let id = claim["sandbox_id"].as_str().unwrap().to_owned();
    let exec = |command: String| {
        let server = &server;
        let id = id.clone();
        async move {
            server
                .ok("exec", json!({"sandbox_id": id, "command": command}))
                .await
        }
    };

    // 20 MiB in, checked in the sandbox; and out again, checked on the host.
    let copied = server
        .ok(
            "copy_from_host",
            in_args(&id, &tree.at("in/big.bin"), "/root/big.bin"),
        )
        .await;
    assert_eq!(copied["bytes"], data.len(), "{copied}");
    eprintln!("copy_from_host 20 MiB: {} ms", copied["ms"]);
    let sum = exec("sha256sum /root/big.bin".into()).await;
    assert!(
        sum["stdout"].as_str().unwrap().starts_with(&sha256(&data)),
        "{sum}"
    );
    let back = server
        .ok(
            "copy_to_host",
            out_args(&id, "/root/big.bin", &tree.at("out/back.bin")),
        )
        .await;
    eprintln!("copy_to_host 20 MiB: {} ms", back["ms"]);
    assert_eq!(back["bytes"], data.len(), "{back}");
    assert_eq!(
        sha256(&std::fs::read(tree.allowed().join("out/back.bin")).unwrap()),
        sha256(&data)
    );

    // A directory on either side takes the file under its own name; modes carry
    // over, a link inside the allowed directory is followed.
    let into_dir = server
        .ok(
            "copy_from_host",
            in_args(&id, &tree.at("in/inside"), "/root"),
        )
        .await;
    assert_eq!(into_dir["path"], "/root/inside", "{into_dir}");
    assert_eq!(into_dir["mode"], "750", "{into_dir}");
    let ran = exec("/root/inside".into()).await;
    assert_eq!(ran["stdout"], "hello from the host\n", "{ran}");
    exec("printf x > /root/suid && chmod 4755 /root/suid".into()).await;
    let suid = server
        .ok("copy_to_host", out_args(&id, "/root/suid", &tree.at("out")))
        .await;
    assert_eq!(suid["host_path"], tree.at("out/suid"), "{suid}");
    let mode = std::fs::metadata(tree.allowed().join("out/suid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "setuid reached the host");

    // Refusals on the way in.
    let outside = server
        .err("copy_from_host", in_args(&id, "/etc/hostname", "/root/x"))
        .await;
    assert!(
        outside.contains("not under an allowed host directory")
            && outside.contains(&allowed)
            && outside.contains("list_host_dir"),
        "{outside}"
    );
    for escape in ["in/abs", "in/rel", "../secret", "in/../../secret"] {
        let refused = server
            .err("copy_from_host", in_args(&id, &tree.at(escape), "/root/x"))
            .await;
        assert!(refused.contains("leads outside"), "{escape}: {refused}");
    }
    let fifo = server
        .err(
            "copy_from_host",
            in_args(&id, &tree.at("in/fifo"), "/root/x"),
        )
        .await;
    assert!(fifo.contains("a FIFO"), "{fifo}");
    let dir = server
        .err("copy_from_host", in_args(&id, &tree.at("in"), "/root/x"))
        .await;
    assert!(
        dir.contains("is a directory") && dir.contains("list_host_dir"),
        "{dir}"
    );
    let no_parent = server
        .err(
            "copy_from_host",
            in_args(&id, &tree.at("in/hello.sh"), "/no/such/dir/x"),
        )
        .await;
    assert!(no_parent.contains("mkdir -p"), "{no_parent}");
    let missing = exec("ls /root/x || echo none".into()).await;
    assert_eq!(missing["stdout"], "none\n", "{missing}");

    // Refusals on the way out.
    let trap = server
        .err(
            "copy_to_host",
            out_args(&id, "/root/suid", &tree.at("out/trap/x")),
        )
        .await;
    assert!(trap.contains("leads outside"), "{trap}");
    let exists = server
        .err(
            "copy_to_host",
            out_args(&id, "/root/suid", &tree.at("out/keep.txt")),
        )
        .await;
    assert!(exists.contains("overwrite: true"), "{exists}");
    assert_eq!(
        std::fs::read(tree.allowed().join("out/keep.txt")).unwrap(),
        b"keep"
    );
    server
        .ok(
            "copy_to_host",
            json!({"sandbox_id": id, "path": "/root/suid",
                   "host_path": tree.at("out/keep.txt"), "overwrite": true}),
        )
        .await;
    assert_eq!(
        std::fs::read(tree.allowed().join("out/keep.txt")).unwrap(),
        b"x"
    );
    let onto_fifo = server
        .err(
            "copy_to_host",
            json!({"sandbox_id": id, "path": "/root/suid",
                   "host_path": tree.at("out/fifo"), "overwrite": true}),
        )
        .await;
    assert!(onto_fifo.contains("a FIFO"), "{onto_fifo}");
    // Sparse: 30 MiB to read, nothing on the sandbox's disk.
    exec("truncate -s 30M /root/huge && ln -s /root/huge /root/hidden".into()).await;
    let huge = server
        .err("copy_to_host", out_args(&id, "/root/huge", &tree.at("out")))
        .await;
    assert!(
        huge.contains("over the server's limit") && huge.contains("split"),
        "{huge}"
    );
    // The link's own size passes the first check; the stream is cut at the limit.
    let hidden = server
        .err(
            "copy_to_host",
            out_args(&id, "/root/hidden", &tree.at("out")),
        )
        .await;
    assert!(hidden.contains("over the server's limit"), "{hidden}");
    let device = server
        .err("copy_to_host", out_args(&id, "/dev/zero", &tree.at("out")))
        .await;
    assert!(device.contains("regular"), "{device}");
    let sandbox_dir = server
        .err("copy_to_host", out_args(&id, "/root", &tree.at("out")))
        .await;
    assert!(sandbox_dir.contains("tar -czf"), "{sandbox_dir}");

    trees(&server, &id, &tree).await;
    swapped_links(&server, &id, &tree).await;

    // Nothing half-written, no temporary file, nothing outside.
    assert_eq!(
        tree.out_names(),
        ["back.bin", "fifo", "keep.txt", "suid", "swap", "trap", "tree"]
    );
    assert_eq!(
        std::fs::read_dir(tree.top.join("outside")).unwrap().count(),
        0,
        "something was written outside the allowed directory"
    );
    assert_eq!(std::fs::read(tree.top.join("secret")).unwrap(), b"SECRET");

    server.disconnect(Duration::from_secs(30)).await;
    assert_nothing_left(&folders.run);
}

/// `recursive: true` both ways: a host tree into the sandbox and back out, links
/// left out on either side (one pointing at the secret), an existing top refused,
/// and a tree over the size limit refused before anything is copied.
async fn trees(server: &support::McpServer, id: &str, tree: &Tree) {
    let top = tree.allowed().join("in/tree");
    std::fs::create_dir_all(top.join("sub/deeper")).unwrap();
    std::fs::write(top.join("a.txt"), b"alpha").unwrap();
    let blob = support::noise(1 << 20);
    std::fs::write(top.join("sub/deeper/blob.bin"), &blob).unwrap();
    symlink(tree.top.join("secret"), top.join("sub/secret-link")).unwrap();
    symlink("a.txt", top.join("inner-link")).unwrap();
    let mut args = in_args(id, &tree.at("in/tree"), "/root");
    args["recursive"] = true.into();
    let copied = server.ok("copy_from_host", args).await;
    assert_eq!(
        (
            copied["path"].as_str(),
            copied["files"].as_u64(),
            copied["dirs"].as_u64(),
            copied["skipped"].as_u64()
        ),
        (Some("/root/tree"), Some(2), Some(3), Some(2)),
        "{copied}"
    );
    let command = "cd /root/tree && find . | sort && sha256sum sub/deeper/blob.bin";
    let listed = server
        .ok("exec", json!({"sandbox_id": id, "command": command}))
        .await;
    let out = listed["stdout"].as_str().unwrap();
    assert!(
        out.starts_with(".\n./a.txt\n./sub\n./sub/deeper\n./sub/deeper/blob.bin\n")
            && out.contains(&sha256(&blob)),
        "{listed}"
    );

    let link = "ln -s /etc/passwd /root/tree/sub/passwd-link";
    server
        .ok("exec", json!({"sandbox_id": id, "command": link}))
        .await;
    let mut args = out_args(id, "/root/tree", &tree.at("out"));
    args["recursive"] = true.into();
    let back = server.ok("copy_to_host", args.clone()).await;
    assert_eq!(back["host_path"], tree.at("out/tree"), "{back}");
    assert_eq!(
        (back["files"].as_u64(), back["skipped"].as_u64()),
        (Some(2), Some(1))
    );
    let out = tree.allowed().join("out/tree");
    assert_eq!(std::fs::read(out.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(
        std::fs::read(out.join("sub/deeper/blob.bin")).unwrap(),
        blob
    );
    assert!(!out.join("sub/passwd-link").exists());
    let again = server.err("copy_to_host", args).await;
    assert!(again.contains("already exists"), "{again}");

    let big = "mkdir /root/bigtree && truncate -s 30M /root/bigtree/huge";
    server
        .ok("exec", json!({"sandbox_id": id, "command": big}))
        .await;
    let mut args = out_args(id, "/root/bigtree", &tree.at("out"));
    args["recursive"] = true.into();
    let refused = server.err("copy_to_host", args).await;
    assert!(refused.contains("over the server's limit"), "{refused}");
    assert!(!tree.allowed().join("out/bigtree").exists());
}

/// Copies while another thread swaps a name between a real file (or directory)
/// and a link out of the allowed directory: a copy may succeed or be refused, but
/// never reads the secret nor writes outside.
async fn swapped_links(server: &support::McpServer, id: &str, tree: &Tree) {
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let allowed = tree.allowed();
        let top = tree.top.clone();
        std::thread::spawn(move || {
            let source = allowed.join("in/swap");
            let dest = allowed.join("out/swap");
            std::fs::create_dir_all(&dest).unwrap();
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                flip(&source, &top.join("secret"), |tmp| {
                    std::fs::write(tmp, b"LEGIT").unwrap();
                });
                flip(&dest, &top.join("outside"), |tmp| {
                    std::fs::create_dir(tmp).unwrap();
                });
                flips += 1;
            }
            flips
        })
    };
    let (mut read, mut wrote) = (0, 0);
    for round in 0..SWAP_ROUNDS {
        let path = format!("/root/swap-{round}");
        let copied = server
            .call(
                "copy_from_host",
                json!({"sandbox_id": id, "host_path": tree.at("in/swap"), "path": path}),
            )
            .await;
        if copied.is_error != Some(true) {
            read += 1;
            let content = server
                .ok(
                    "exec",
                    json!({"sandbox_id": id, "command": format!("cat {path}")}),
                )
                .await;
            assert_eq!(content["stdout"], "LEGIT", "the secret was copied in");
        }
        let out = server
            .call(
                "copy_to_host",
                json!({"sandbox_id": id, "path": "/root/suid",
                       "host_path": tree.at(&format!("out/swap/f{round}"))}),
            )
            .await;
        if out.is_error != Some(true) {
            wrote += 1;
        }
        assert_eq!(
            std::fs::read_dir(tree.top.join("outside")).unwrap().count(),
            0,
            "a copy was written through the swapped link"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let flips = swapper.join().unwrap();
    eprintln!("swapped links: {flips} flips, {read} copies in and {wrote} out got through");
    // Leave a plain directory for the final listing.
    let dest = tree.allowed().join("out/swap");
    if dest.is_symlink() {
        std::fs::remove_file(&dest).unwrap();
        std::fs::create_dir(&dest).unwrap();
    }
}

/// Replaces `name` by a link to `target`, then by what `make` creates, each with
/// one rename (so the name always exists).
fn flip(name: &Path, target: &Path, make: impl Fn(&Path)) {
    let tmp = name.with_extension("tmp");
    remove_entirely(&tmp);
    symlink(target, &tmp).unwrap();
    swap_in(&tmp, name);
    // Each state lasts a moment, so copies meet both.
    std::thread::sleep(SWAP_HOLD);
    make(&tmp);
    swap_in(&tmp, name);
    std::thread::sleep(SWAP_HOLD);
}

/// Renames `tmp` over `name`; a directory `name` is exchanged, then removed.
fn swap_in(tmp: &Path, name: &Path) {
    use nix::fcntl::{renameat2, RenameFlags};
    if renameat2(None, tmp, None, name, RenameFlags::RENAME_EXCHANGE).is_err() {
        std::fs::rename(tmp, name).unwrap();
        return;
    }
    remove_entirely(tmp);
}

/// Removes whatever `path` names, retrying: the server may still be writing a
/// copy into a directory that was just swapped out (it holds the directory open),
/// so one `remove_dir_all` can meet a file created after it listed the entries.
fn remove_entirely(path: &Path) {
    for _ in 0..1000 {
        let removed = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => panic!("{}: {e}", path.display()),
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
            Ok(_) => std::fs::remove_file(path),
        };
        if removed.is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    panic!("{} could not be removed", path.display());
}
