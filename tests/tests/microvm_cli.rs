//! `sandboxctl vm …` on real microVMs: the README's main job (`vm run`), and that a
//! `vm run` stopped by SIGTERM leaves no QEMU, daemon or run folder behind, and that a
//! VM whose guest powered off or panicked is reported as such, its daemon stopped.

#![allow(clippy::unwrap_used)] // Tests fail by panicking, with the error in the message.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_tests::suite::{vm_main, VmTest};
use sandbox_tests::{binaries, wait_child};

/// A private run root for one test, so its emptiness proves the cleanup.
fn run_root(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sbx-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// True while some QEMU runs a VM under `root`.
fn qemu_running_under(root: &Path) -> bool {
    let needle = root.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.starts_with("qemu-system") && cmdline.contains(&needle)
        })
    })
}

fn sandboxctl(root: &Path) -> Command {
    let mut command = Command::new(&binaries().sandboxctl);
    command
        .env("SANDBOX_RUN_DIR", root)
        .env_remove("SANDBOX_AGENT")
        .stdin(Stdio::null());
    command
}

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "vm_run_prints_the_guest_kernel_and_exits_with_the_commands_code",
            run: vm_run_prints_the_guest_kernel_and_exits_with_the_commands_code,
        },
        VmTest {
            name: "vm_run_stopped_by_sigterm_cleans_up_everything",
            run: vm_run_stopped_by_sigterm_cleans_up_everything,
        },
        VmTest {
            name: "a_vm_run_killed_outright_frees_its_ram_file",
            run: a_vm_run_killed_outright_frees_its_ram_file,
        },
        VmTest {
            name: "a_dead_vm_frees_its_ram_at_once_and_vm_ls_removes_its_folder",
            run: a_dead_vm_frees_its_ram_at_once_and_vm_ls_removes_its_folder,
        },
        VmTest {
            name: "a_guest_flooding_its_console_keeps_console_log_bounded_with_the_last_lines",
            run: a_guest_flooding_its_console_keeps_console_log_bounded_with_the_last_lines,
        },
        VmTest {
            name: "a_vm_whose_guest_powered_off_or_panicked_is_reported_as_such_with_exit_125",
            run: a_vm_whose_guest_powered_off_or_panicked_is_reported_as_such_with_exit_125,
        },
        VmTest {
            name: "port_forward_reaches_a_guest_server_of_a_local_vm_until_ctrl_c",
            run: port_forward_reaches_a_guest_server_of_a_local_vm_until_ctrl_c,
        },
    ])
}

/// `sandboxctl port-forward ID LOCAL:GUEST` on a local VM: busybox `httpd` in the
/// guest answers a plain TCP client on the local port; a port with nothing on it
/// closes the client's connection and says why on stderr; SIGINT ends it with 0.
fn port_forward_reaches_a_guest_server_of_a_local_vm_until_ctrl_c() {
    use std::io::{BufRead, Read, Write};
    let root = run_root("ports");
    let id = start_detached(&root);
    let _stop = StopOnDrop(&root, id.clone());
    let served = sandboxctl(&root)
        .args(["--vm", &id, "sh"])
        // `httpd` binds after the shell returns: wait (at most 30 s) until it answers,
        // or the first forwarded connection races it and finds nothing listening.
        .arg(
            "mkdir -p /tmp/www && echo local-port-page > /tmp/www/index.html && \
             (httpd -p 127.0.0.1:8000 -h /tmp/www >/dev/null 2>&1 &) && i=0 && \
             until wget -q -O /dev/null http://127.0.0.1:8000/; do \
             i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done",
        )
        .output()
        .unwrap();
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
    let mut forward = sandboxctl(&root)
        .args(["port-forward", &id, ":8000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(forward.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line
        .trim_end()
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.strip_suffix(" -> 8000"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let get = || {
        let mut stream = std::net::TcpStream::connect(&local).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    let answer = get();
    assert!(answer.contains("local-port-page"), "{answer:?}");
    assert!(get().contains("local-port-page"));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(forward.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status =
        wait_child(&mut forward, Duration::from_secs(30)).expect("port-forward kept running");
    assert!(status.success(), "{status:?}");

    // Nothing on the port: the local connection closes, stderr says why.
    let mut refused = sandboxctl(&root)
        .args(["port-forward", &id, ":8001"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(refused.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line
        .trim_end()
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.strip_suffix(" -> 8001"))
        .unwrap()
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&local).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut nothing = Vec::new();
    let _ = stream.read_to_end(&mut nothing);
    assert!(nothing.is_empty());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(refused.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    wait_child(&mut refused, Duration::from_secs(30)).expect("port-forward kept running");
    let mut stderr = String::new();
    refused
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("nothing is listening on guest port 8001"),
        "{stderr}"
    );
    drop(_stop);
    wait_no_qemu(&root);
    let _ = std::fs::remove_dir_all(&root);
}

fn vm_run_prints_the_guest_kernel_and_exits_with_the_commands_code() {
    let root = run_root("run");
    let output = sandboxctl(&root)
        .args(["vm", "run", "--", "sh", "-c", "uname -sr; exit 3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(3),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.starts_with("Linux ") && stdout.contains("cloud-amd64"),
        "{stdout}"
    );
    assert!(
        entries(&root).is_empty(),
        "left behind: {:?}",
        entries(&root)
    );
    assert!(!qemu_running_under(&root));
    std::fs::remove_dir_all(&root).unwrap();
}

fn vm_run_stopped_by_sigterm_cleans_up_everything() {
    let root = run_root("term");
    let mut child = sandboxctl(&root)
        .args(["vm", "run", "--", "sh", "-c", "echo started; sleep 600"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the command runs in the guest.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"started\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_child(&mut child, Duration::from_secs(30))
        .expect("sandboxctl did not stop within 30 s of SIGTERM");
    assert_eq!(status.code(), Some(143));
    assert!(
        entries(&root).is_empty(),
        "left behind: {:?}",
        entries(&root)
    );
    assert!(!qemu_running_under(&root), "a QEMU outlived sandboxctl");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The RAM file the run folder `dir` links to.
fn ram_file_of(dir: &Path) -> PathBuf {
    let ram = std::fs::read_link(dir.join("ram")).unwrap();
    assert!(ram.is_file(), "{} is not a file", ram.display());
    ram
}

/// Waits until `path` is gone; panics with `what` after 30 s.
fn wait_gone(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what}: {} is still there",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Regression (issue 22, item 10): a `vm run` killed by SIGKILL takes its QEMU with
/// it (death signal), but its RAM file stayed in /dev/shm until some later boot in
/// the same home swept the folder (the test suite left 167 MB so). Its QEMU's exit
/// watcher unlinks it now.
fn a_vm_run_killed_outright_frees_its_ram_file() {
    let root = run_root("kill");
    let mut child = sandboxctl(&root)
        .args(["vm", "run", "--", "sh", "-c", "echo started; sleep 600"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"started\n");
    let folders = entries(&root);
    assert_eq!(folders.len(), 1, "{folders:?}");
    let ram = ram_file_of(&root.join(&folders[0]));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_no_qemu(&root);
    wait_gone(&ram, "the RAM file of a VM whose owner was killed");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Regression (issue 22, item 10): a detached VM whose guest powers off left its
/// RAM file (0.2-0.5 GiB of /dev/shm) and run folder until a later `vm start`
/// swept them; `vm ls` swept nothing. The RAM file goes when QEMU does, and `vm ls`
/// removes the dead VM's folder.
fn a_dead_vm_frees_its_ram_at_once_and_vm_ls_removes_its_folder() {
    let root = run_root("dead");
    let id = start_detached(&root);
    let _stop = StopOnDrop(&root, id.clone());
    let ram = ram_file_of(&root.join(&id));
    let _ = sandboxctl(&root)
        .args(["--vm", &id, "sh", "poweroff"])
        .output()
        .unwrap();
    wait_no_qemu(&root);
    wait_gone(&ram, "the RAM file of a VM that powered off");
    assert!(root.join(&id).exists(), "the folder waits for a sweep");
    let listed = sandboxctl(&root).args(["vm", "ls"]).output().unwrap();
    assert!(listed.status.success());
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(!listed.contains(&id), "{listed}");
    assert!(!root.join(&id).exists(), "vm ls left the dead VM's folder");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Regression (issue 22, item 4): QEMU's file console had no cap (a guest writing to
/// /dev/ttyS0 grew it 7.2 MB in 10 s). The relay copies it into a log rotated at
/// 1 MiB, one old file kept, the last lines current.
fn a_guest_flooding_its_console_keeps_console_log_bounded_with_the_last_lines() {
    const CAP: u64 = 1024 * 1024;
    let root = run_root("console");
    let id = start_detached(&root);
    let stop = StopOnDrop(&root, id.clone());
    let flood = "yes 0123456789012345678901234567890123456789 | head -c 3000000 > /dev/ttyS0; echo FLOOD-END > /dev/ttyS0";
    let output = sandboxctl(&root)
        .args(["--vm", &id, "sh", flood])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let console = root.join(&id).join("console.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&console)
        .unwrap_or_default()
        .contains("FLOOD-END")
    {
        assert!(
            Instant::now() < deadline,
            "the console's last line never arrived"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let current = std::fs::metadata(&console).unwrap().len();
    let old = std::fs::metadata(root.join(&id).join("console.log.1")).map_or(0, |m| m.len());
    assert!(
        current <= CAP && old <= CAP,
        "console.log {current} B, .1 {old} B"
    );
    drop(stop);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Starts a detached VM under `root` and returns its id.
fn start_detached(root: &Path) -> String {
    let mut command = sandboxctl(root);
    command.args(["vm", "start"]);
    // The template under test, as the other microVM tests use it.
    if let Some(template) = std::env::var_os(sandbox_tests::vm::TEMPLATE_ENV) {
        command.arg("--template").arg(template);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "vm start: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout.split('\t').next().unwrap().trim().to_owned()
}

/// True while `pid` is the vsock daemon of the run folder `dir` (not a zombie).
fn daemon_alive(pid: u64, dir: &Path) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    let zombie = state
        .rsplit(')')
        .next()
        .is_some_and(|rest| rest.trim_start().starts_with('Z'));
    !zombie && String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy())
}

/// Stops the detached VM `.1` under the run root `.0` when dropped.
struct StopOnDrop<'a>(&'a Path, String);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = sandboxctl(self.0).args(["vm", "stop", &self.1]).output();
    }
}

/// Waits until no QEMU runs under `root`.
fn wait_no_qemu(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while qemu_running_under(root) {
        assert!(Instant::now() < deadline, "QEMU still runs under {root:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn a_vm_whose_guest_powered_off_or_panicked_is_reported_as_such_with_exit_125() {
    let root = run_root("gone");
    let cases = [
        ("poweroff", "the guest powered off", "reboot: Power down"),
        (
            "echo c > /proc/sysrq-trigger",
            "the guest kernel panicked",
            "Kernel panic",
        ),
    ];
    for (script, end, console) in cases {
        let id = start_detached(&root);
        // Stopped however the case ends, a failed assertion included: a detached VM
        // outlives this process otherwise.
        let _stop = StopOnDrop(&root, id.clone());
        // The command that ends the guest may or may not see its own reply.
        let _ = sandboxctl(&root)
            .args(["--vm", &id, "sh", script])
            .output()
            .unwrap();
        wait_no_qemu(&root);
        // Nobody owns a detached VM, yet its daemon goes with its QEMU.
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join(&id).join("vm.json")).unwrap())
                .unwrap();
        let daemon = record["daemon_pid"].as_u64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while daemon_alive(daemon, &root.join(&id)) {
            assert!(
                Instant::now() < deadline,
                "{script}: the vsock daemon {daemon} outlived its VM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let output = sandboxctl(&root)
            .args(["--vm", &id, "sh", "echo still there"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(125), "{script}: {stderr}");
        assert!(stderr.contains(end), "{script}: {stderr}");
        assert!(stderr.contains(console), "{script}: {stderr}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}
