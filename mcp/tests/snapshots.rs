//! The snapshot tools of `sandbox-mcp` on real QEMU microVMs, driven by rmcp's MCP
//! client: a fork into four children that diverge (each sees only its own file and
//! draws its own random bytes, the parent sees none); a hibernated sandbox woken by
//! the next `exec` with its spawned process still running under the same pid; a
//! promoted sandbox that `create_sandbox` starts from; a checkpoint that outlives its
//! source and its server and is branched by a new server process without listing;
//! a checkpoint that a hibernated and woken branch backs onto, refused for deletion
//! while the branch lives (the python template: a disk); and the bad inputs (fork
//! counts out of range or past capacity, unknown ids, a checkpoint in use, a template
//! promote must not replace), each an `isError` whose hint names the tool to call. After each session no QEMU, relay or run folder is
//! left, and the forks' own checkpoints are gone.
//!
//! Checkpoints go to a folder of the test (`SANDBOX_CHECKPOINT_DIR`); the promoted
//! template to `SANDBOX_HOME/templates`, removed at the end. Timings are printed; run
//! with `--nocapture` to see them.
//!
//! Needs what `sandbox_tests::vm::gate` checks; `SANDBOX_SKIP_VM_TESTS=1` marks the
//! tests ignored.

// Test code: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_vmm::launcher::{Launcher, LauncherConfig, TemplateRef};
use serde_json::{json, Value};
use support::{assert_nothing_left, eventually, processes_mentioning, Folders, McpServer};

/// How long the first warm VM may take (TCG on a busy 2-core host is slow).
const WARM_WITHIN: Duration = Duration::from_secs(180);

/// How many children the fork test makes.
const CHILDREN: usize = 4;

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "fork_hibernate_and_promote_in_one_session_and_their_bad_inputs",
            run: || block_on(fork_hibernate_and_promote()),
        },
        VmTest {
            name: "a_checkpoint_outlives_its_source_and_server_and_branches_in_the_next",
            run: || block_on(a_checkpoint_outlives_its_server()),
        },
        VmTest {
            name: "a_checkpoint_a_woken_branch_backs_onto_is_not_deleted",
            run: || block_on(a_checkpoint_under_a_woken_branch_stays()),
        },
    ])
}

/// A template folder removed when the test ends, however it ends.
struct TemplateGuard(PathBuf);

impl Drop for TemplateGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn id_of(value: &Value) -> String {
    value["sandbox_id"].as_str().unwrap().to_owned()
}

async fn sh(server: &McpServer, sandbox: &str, command: &str) -> String {
    let run = server
        .ok("exec", json!({"sandbox_id": sandbox, "command": command}))
        .await;
    assert_eq!(run["exit_code"], 0, "{command}: {run}");
    run["stdout"].as_str().unwrap().to_owned()
}

/// The names under /tmp that start with `mine-`.
async fn own_files(server: &McpServer, sandbox: &str) -> Vec<String> {
    let listing = server
        .ok("list_dir", json!({"sandbox_id": sandbox, "path": "/tmp"}))
        .await;
    listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .filter(|name| name.starts_with("mine-"))
        .map(str::to_owned)
        .collect()
}

async fn running_pids(server: &McpServer, sandbox: &str) -> Vec<i64> {
    let ps = server.ok("ps", json!({"sandbox_id": sandbox})).await;
    ps["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["state"] == "running")
        .filter_map(|row| row["pid"].as_i64())
        .collect()
}

async fn fork_hibernate_and_promote() {
    let Some(folders) = Folders::new("snapshots", "snap") else {
        return;
    };
    let server = folders
        .server(&["--pool", "1", "--max-sandboxes", "8"])
        .await;
    eventually(WARM_WITHIN, "a warm VM", || async {
        let info = server.ok("node_info", json!({})).await;
        (info["pool"]["warm"] == 1).then_some(())
    })
    .await;
    let parent = id_of(&server.ok("create_sandbox", json!({})).await);
    server
        .ok(
            "write_file",
            json!({"sandbox_id": parent, "path": "/tmp/base", "content": "base\n"}),
        )
        .await;
    let sleeper = server
        .ok(
            "spawn",
            json!({"sandbox_id": parent, "command": "sleep 600"}),
        )
        .await["pid"]
        .as_i64()
        .unwrap();

    // Bad inputs: refused before anything is paused or evicted.
    let zero = server
        .err("fork", json!({"sandbox_id": parent, "count": 0}))
        .await;
    assert!(
        zero.contains("between 1 and 16") && zero.contains("fork"),
        "{zero}"
    );
    let many = server
        .err("fork", json!({"sandbox_id": parent, "count": 17}))
        .await;
    assert!(many.contains("between 1 and 16"), "{many}");
    let no_room = server
        .err("fork", json!({"sandbox_id": parent, "count": 16}))
        .await;
    assert!(
        no_room.contains("room") && no_room.contains("release"),
        "{no_room}"
    );
    let info = server.ok("node_info", json!({})).await;
    let pool = &info["pool"];
    assert_eq!(
        pool["warm"].as_u64().unwrap() + pool["booting"].as_u64().unwrap(),
        1,
        "a refused fork evicted the pool's VM: {info}"
    );
    let unknown = server
        .err("fork", json!({"sandbox_id": "sbx-nope", "count": 1}))
        .await;
    assert!(unknown.starts_with("Unknown sandbox_id"), "{unknown}");
    let unknown = server
        .err("hibernate", json!({"sandbox_id": "sbx-nope"}))
        .await;
    assert!(
        unknown.starts_with("Unknown sandbox_id") && unknown.contains("create_sandbox"),
        "{unknown}"
    );
    let unknown = server
        .err(
            "branch_checkpoint",
            json!({"checkpoint_id": "no-such-checkpoint"}),
        )
        .await;
    assert!(
        unknown.starts_with("Unknown checkpoint_id") && unknown.contains("list_checkpoints"),
        "{unknown}"
    );

    // Fork: four children, all at once, the parent still running.
    let started = Instant::now();
    let forked = server
        .ok("fork", json!({"sandbox_id": parent, "count": CHILDREN}))
        .await;
    let fork_took = started.elapsed();
    let children: Vec<String> = forked["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(children.len(), CHILDREN, "{forked}");
    assert!(!children.contains(&parent));
    assert_eq!(forked["children"][0]["ttl_seconds"], 3600);
    for (i, child) in children.iter().enumerate() {
        server
            .ok(
                "write_file",
                json!({"sandbox_id": child, "path": format!("/tmp/mine-{i}"), "content": format!("{i}\n")}),
            )
            .await;
    }
    let mut draws = HashSet::new();
    for (i, child) in children.iter().enumerate() {
        assert_eq!(own_files(&server, child).await, [format!("mine-{i}")]);
        assert_eq!(sh(&server, child, "cat /tmp/base").await, "base\n");
        assert!(
            running_pids(&server, child).await.contains(&sleeper),
            "child {child} lost the parent's process"
        );
        draws.insert(sh(&server, child, "od -An -N16 -tx1 /dev/urandom").await);
    }
    assert!(
        own_files(&server, &parent).await.is_empty(),
        "the parent changed"
    );
    draws.insert(sh(&server, &parent, "od -An -N16 -tx1 /dev/urandom").await);
    assert_eq!(draws.len(), CHILDREN + 1, "random draws repeat: {draws:?}");

    // Hibernate the parent; the next exec wakes it with its process and files.
    let hibernated = server.ok("hibernate", json!({"sandbox_id": parent})).await;
    assert_eq!(hibernated["hibernated_now"], true, "{hibernated}");
    let again = server.ok("hibernate", json!({"sandbox_id": parent})).await;
    assert_eq!(again["hibernated_now"], false, "{again}");
    let vm_id = parent.trim_start_matches("sbx-");
    assert!(
        processes_mentioning(&format!("sandbox-{vm_id}")).is_empty(),
        "the hibernated parent's QEMU still runs"
    );
    let started = Instant::now();
    let alive = sh(
        &server,
        &parent,
        &format!("kill -0 {sleeper} && echo alive"),
    )
    .await;
    let wake_took = started.elapsed();
    assert_eq!(alive, "alive\n");
    let started = Instant::now();
    sh(&server, &parent, "true").await;
    let exec_took = started.elapsed();
    assert!(running_pids(&server, &parent).await.contains(&sleeper));
    let read = server
        .ok(
            "read_file",
            json!({"sandbox_id": parent, "path": "/tmp/base"}),
        )
        .await;
    assert_eq!(read["content"], "base\n");

    // Promote a child, then the parent under the same name: create_sandbox starts
    // from the parent's state, its files and processes.
    let name = format!("mcp-snap-{}", std::process::id());
    let launcher = LauncherConfig::from_env().unwrap();
    let _template = TemplateGuard(launcher.templates_root().join(&name));
    let refused = server
        .err(
            "promote",
            json!({"sandbox_id": children[1], "template": "default"}),
        )
        .await;
    assert!(
        refused.contains("default") && refused.contains("promote"),
        "{refused}"
    );
    let from_child = server
        .ok(
            "promote",
            json!({"sandbox_id": children[1], "template": name}),
        )
        .await;
    assert_eq!(from_child["replaced"], false, "{from_child}");
    let promoted = server
        .ok("promote", json!({"sandbox_id": parent, "template": name}))
        .await;
    assert_eq!(promoted["replaced"], true, "{promoted}");
    let info = server.ok("node_info", json!({})).await;
    assert!(
        info["templates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == name.as_str()),
        "{info}"
    );
    let made = server.ok("create_sandbox", json!({"template": name})).await;
    let from_template = id_of(&made);
    assert_eq!(made["template"], name.as_str());
    assert!(own_files(&server, &from_template).await.is_empty());
    assert_eq!(sh(&server, &from_template, "cat /tmp/base").await, "base\n");
    assert!(running_pids(&server, &from_template)
        .await
        .contains(&sleeper));
    // Regression: the claim chose an accelerator first, running the KVM quick boot
    // (5 s where KVM cannot boot) of a kernel a restore never boots.
    let accel = std::fs::read_to_string(launcher.accel_cache_file()).unwrap_or_default();
    assert!(
        !accel.contains(&name),
        "the claim probed the promoted template's kernel: {accel}"
    );

    eprintln!(
        "fork of {CHILDREN} through MCP: {fork_took:?} (server: {} ms, parent paused {} ms); \
         hibernate: {} ms; first exec after hibernate (wake + exec): {wake_took:?}, next exec: \
         {exec_took:?}; promote of a fork child: {} ms, of the parent: {} ms; create_sandbox \
         from the promoted template: {} ms",
        forked["fork_ms"],
        forked["pause_ms"],
        hibernated["took_ms"],
        from_child["took_ms"],
        promoted["took_ms"],
        made["claim_ms"]
    );

    let status = server.disconnect(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    assert_nothing_left(&folders.run);
    assert_eq!(
        folders.checkpoints_left(),
        Vec::<String>::new(),
        "the fork's checkpoint outlived the session"
    );
    assert!(
        launcher
            .templates_root()
            .join(&name)
            .join("template.json")
            .is_file(),
        "the promoted template went with the session"
    );
}

async fn a_checkpoint_outlives_its_server() {
    let Some(folders) = Folders::new("snapshots", "ckpt") else {
        return;
    };
    let boot_timeout = WARM_WITHIN.as_secs().to_string();
    let args = [
        "--pool",
        "0",
        "--max-sandboxes",
        "2",
        "--boot-timeout",
        &boot_timeout,
    ];
    let name = format!("mcp-test-{}", std::process::id());

    // Server A: checkpoint a sandbox, release the sandbox, and go.
    let a = folders.server(&args).await;
    let source = id_of(&a.ok("create_sandbox", json!({})).await);
    a.ok(
        "write_file",
        json!({"sandbox_id": source, "path": "/tmp/state", "content": "from A\n"}),
    )
    .await;
    let sleeper = a
        .ok(
            "spawn",
            json!({"sandbox_id": source, "command": "sleep 600"}),
        )
        .await["pid"]
        .as_i64()
        .unwrap();
    let taken = a
        .ok("checkpoint", json!({"sandbox_id": source, "name": name}))
        .await;
    let checkpoint = taken["checkpoint_id"].as_str().unwrap().to_owned();
    assert_eq!(taken["name"], name.as_str());
    let taken_twice = a
        .err("checkpoint", json!({"sandbox_id": source, "name": name}))
        .await;
    assert!(
        taken_twice.contains("exists already") && taken_twice.contains("list_checkpoints"),
        "{taken_twice}"
    );
    a.ok("release", json!({"sandbox_id": source})).await;
    let listed = a.ok("list_checkpoints", json!({})).await;
    let row = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["checkpoint_id"] == checkpoint.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{checkpoint} not listed: {listed}"));
    assert_eq!(row["source_sandbox_id"], source.as_str());
    assert_eq!(row["in_use_by"], json!([]));
    let status = a.disconnect(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    assert_nothing_left(&folders.run);

    // Server B, a new process: branch the id it never listed.
    let b = folders.server(&args).await;
    let started = Instant::now();
    let branched = b
        .ok("branch_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    let branch_took = started.elapsed();
    let branch = id_of(&branched);
    assert_ne!(branch, source);
    assert_eq!(branched["ttl_seconds"], 3600);
    let state = b
        .ok(
            "read_file",
            json!({"sandbox_id": branch, "path": "/tmp/state"}),
        )
        .await;
    assert_eq!(state["content"], "from A\n");
    assert!(running_pids(&b, &branch).await.contains(&sleeper));
    // By name too, and again: a checkpoint branches any number of times.
    let second = id_of(
        &b.ok("branch_checkpoint", json!({"checkpoint_id": name}))
            .await,
    );
    assert_eq!(sh(&b, &second, "cat /tmp/state").await, "from A\n");
    b.ok("release", json!({"sandbox_id": second})).await;

    let in_use = b
        .err("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    assert!(
        in_use.contains("in use") && in_use.contains(&branch) && in_use.contains("release"),
        "{in_use}"
    );
    b.ok("release", json!({"sandbox_id": branch})).await;
    let deleted = b
        .ok("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    assert_eq!(deleted["checkpoint_id"], checkpoint.as_str());
    let gone = b
        .err("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    assert!(gone.starts_with("Unknown checkpoint_id"), "{gone}");
    eprintln!(
        "checkpoint: {} ms (paused {} ms); branch_checkpoint in a new server: {branch_took:?} \
         (server: {} ms)",
        taken["took_ms"], taken["pause_ms"], branched["branch_ms"]
    );
    let status = b.disconnect(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    assert_nothing_left(&folders.run);
    assert_eq!(folders.checkpoints_left(), Vec::<String>::new());
}

/// The template with a disk: its branches' disks are overlays on the checkpoint's.
const DISK_TEMPLATE: &str = "python";

/// Regression (issue 22, item 1): on a template with a disk, a branch B of
/// checkpoint C that was hibernated and woken no longer counted as C's user (the
/// hibernation had recorded its own image in place of C), so `delete_checkpoint`
/// freed C under B, whose disk chain ends in C's `disk.qcow2`: B's next hibernate and
/// wake failed for good. C is refused while B lives, awake or asleep, with B named.
async fn a_checkpoint_under_a_woken_branch_stays() {
    let Some(folders) = Folders::new("snapshots", "woken") else {
        return;
    };
    let launcher = Launcher::new(LauncherConfig::from_env().unwrap());
    if let Err(error) = launcher.template(&TemplateRef::Name(DISK_TEMPLATE.to_owned())) {
        panic!(
            "no {DISK_TEMPLATE} template ({}): build it as scripts/test.sh does, or set \
             SANDBOX_SKIP_VM_TESTS=1 to skip the microVM tests",
            sandbox_vmm::error_chain(&error)
        );
    }
    let boot_timeout = WARM_WITHIN.as_secs().to_string();
    let server = folders
        .server(&[
            "--template",
            DISK_TEMPLATE,
            "--pool",
            "0",
            "--max-sandboxes",
            "2",
            "--boot-timeout",
            &boot_timeout,
        ])
        .await;
    let source = id_of(&server.ok("create_sandbox", json!({})).await);
    sh(&server, &source, "echo on-disk > /root/state && sync").await;
    let checkpoint = server.ok("checkpoint", json!({"sandbox_id": source})).await["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let branch = id_of(
        &server
            .ok("branch_checkpoint", json!({"checkpoint_id": checkpoint}))
            .await,
    );
    let refused = |error: &str, state: &str| {
        assert!(
            error.contains("in use") && error.contains(&branch),
            "{state}: the delete was not refused naming {branch}: {error}"
        );
    };
    server.ok("hibernate", json!({"sandbox_id": branch})).await;
    // Woken by its next exec.
    assert_eq!(sh(&server, &branch, "cat /root/state").await, "on-disk\n");
    server.ok("release", json!({"sandbox_id": source})).await;

    let in_use = server
        .err("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    refused(&in_use, "woken");
    let listed = server.ok("list_checkpoints", json!({})).await;
    let row = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["checkpoint_id"] == checkpoint.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{checkpoint} not listed: {listed}"));
    assert_eq!(
        row["in_use_by"],
        json!([format!("sandbox {branch}")]),
        "{row}"
    );

    // Asleep again, it still backs onto C; and it sleeps and wakes as often as asked.
    server.ok("hibernate", json!({"sandbox_id": branch})).await;
    let asleep = server
        .err("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    refused(&asleep, "hibernated");
    sh(&server, &branch, "echo again >> /root/state").await;
    server.ok("hibernate", json!({"sandbox_id": branch})).await;
    assert_eq!(
        sh(&server, &branch, "cat /root/state").await,
        "on-disk\nagain\n"
    );

    server.ok("release", json!({"sandbox_id": branch})).await;
    server
        .ok("delete_checkpoint", json!({"checkpoint_id": checkpoint}))
        .await;
    let status = server.disconnect(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");
    assert_nothing_left(&folders.run);
    assert_eq!(folders.checkpoints_left(), Vec::<String>::new());
}
