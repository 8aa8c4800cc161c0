//! `net: egress` in real microVMs. These hosts reach nothing outside, so each test
//! starts its own HTTP servers on the host's loopback (on 127.0.0.2 and 127.0.0.3,
//! not 127.0.0.1: the guest's `no_proxy` rightly keeps 127.0.0.1 for the guest's own
//! loopback), allows one and not the other, and checks from the guest:
//! - programs find the proxy with no setup: busybox `wget` in the default template,
//!   Python's `urllib` in the python template (in a fresh process and in the
//!   template's warm session, which started before egress was on); the denied server is never connected
//!   to, the program gets a 403 with the reason, and the egress log has both;
//! - a name the allowlist lists but that resolves to the host's loopback (DNS
//!   rebinding) is refused: the address dialled is what is checked;
//! - a request that is not HTTP gets a 400, is logged as refused, and the sandbox
//!   lives on;
//! - `net: none` has no proxy, no variables and no route at all;
//! - a forked child has egress through its own relay and its own log, and so does a
//!   VM woken from hibernation;
//! - `sandboxctl vm start --net egress --allow` and `vm egress-log`;
//! - the throughput of a 100 MiB download through the proxy, next to the same
//!   download on the host (printed; run with `--nocapture`).

#![allow(clippy::unwrap_used)] // Tests fail by panicking, with the error in the message.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_tests::scenarios::eval::{clean, python};
use sandbox_tests::vm::{
    block_on, default_template, python_template, python_template_missing, vm_main, TestVm, VmHost,
    VmTest, READY_TIMEOUT_SECS,
};
use sandbox_tests::{binaries, exec_sh, within};
use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::egress::{Allowlist, EgressRecord, Net, Policy, Verdict};
use sandbox_vmm::launcher::snapshot::BranchSpec;
use sandbox_vmm::launcher::{BootSpec, TemplateRef};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The download of the throughput figure.
const BIG_BYTES: usize = 100 * 1024 * 1024;

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "wget_reaches_the_allowed_server_and_the_denied_one_is_refused_and_logged",
            run: || block_on(wget_allowed_and_denied()),
        },
        VmTest {
            name: "python_urllib_reaches_the_allowed_server_with_no_setup",
            run: || block_on(python_urllib()),
        },
        VmTest {
            name: "a_request_that_is_not_http_is_refused_and_logged_and_the_sandbox_lives_on",
            run: || block_on(not_http()),
        },
        VmTest {
            name: "net_none_has_no_proxy_and_no_route",
            run: || block_on(net_none()),
        },
        VmTest {
            name: "a_forked_child_and_a_woken_vm_have_egress_each_with_its_own_log",
            run: || block_on(fork_and_hibernate()),
        },
        VmTest {
            name: "sandboxctl_vm_start_net_egress_and_egress_log",
            run: sandboxctl_egress,
        },
        VmTest {
            name: "throughput_of_a_100_mib_download_next_to_the_host",
            run: || block_on(throughput()),
        },
    ])
}

/// An HTTP/1.x server on the host: `/hello` answers `hello from PORT`, `/big` sends
/// [`BIG_BYTES`]. Counts the connections it accepted.
struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Server {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .unwrap_or_else(|e| {
                panic!("cannot listen on {ip} (the host's loopback is 127.0.0.0/8): {e}")
            });
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, addr.port()));
            }
        });
        Self { addr, connections }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn entry(&self) -> String {
        self.addr.to_string()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: tokio::net::TcpStream, port: u16) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
    if path == "/big" {
        let header =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG_BYTES}\r\nConnection: close\r\n\r\n");
        let _ = stream.write_all(header.as_bytes()).await;
        let chunk = vec![b'x'; 256 * 1024];
        for _ in 0..BIG_BYTES / chunk.len() {
            if stream.write_all(&chunk).await.is_err() {
                return;
            }
        }
    } else {
        let body = format!("hello from {port} path {path}\n");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
    }
    let _ = stream.shutdown().await;
}

fn egress(entries: &[String]) -> Net {
    Net::Egress(Policy::new(Allowlist::parse(entries).unwrap()))
}

async fn boot(host: &VmHost, template: TemplateRef, net: Net) -> TestVm {
    let mut spec = BootSpec::new(template);
    spec.net = net;
    host.boot_spec(spec).await
}

/// Runs `script`: (exit code, stdout, stderr).
async fn run(client: &Client, script: &str) -> (i32, String, String) {
    let reply = within(120, client.exec(exec_sh(script)))
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    (
        reply.exit.and_then(|s| s.code).unwrap_or(-1),
        String::from_utf8_lossy(&reply.stdout).into_owned(),
        String::from_utf8_lossy(&reply.stderr).into_owned(),
    )
}

/// The VM's egress log, waiting up to 10 s for `until` to hold (an allowed
/// connection is written when it closes).
async fn log_until(vm: &TestVm, until: impl Fn(&[EgressRecord]) -> bool) -> Vec<EgressRecord> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let records = vm.launcher().egress_log(vm.vm().id(), 1000).unwrap();
        if until(&records) || Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wget_allowed_and_denied() {
    let Some(host) = VmHost::get("microvm_egress::wget") else {
        return;
    };
    let allowed = Server::start("127.0.0.2").await;
    let denied = Server::start("127.0.0.3").await;
    let vm = boot(
        &host,
        default_template(),
        egress(&[allowed.entry(), "localhost".into()]),
    )
    .await;
    let c = vm.client();
    // Every process gets the proxy variables, with no setup of its own.
    let (_, env, _) = run(c, "env | grep -i _proxy | sort").await;
    assert!(env.contains("http_proxy=http://127.0.0.1:3128"), "{env}");
    assert!(env.contains("HTTPS_PROXY=http://127.0.0.1:3128"), "{env}");
    assert!(env.contains("no_proxy=localhost,127.0.0.1,::1"), "{env}");

    let (code, out, err) = run(c, &format!("wget -q -O - {}", allowed.url("/hello?x=1"))).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out,
        format!("hello from {} path /hello?x=1\n", allowed.addr.port())
    );

    let (code, out, err) = run(c, &format!("wget -q -O - {}", denied.url("/hello"))).await;
    assert_ne!(code, 0, "the denied server answered: {out}");
    assert!(
        err.contains("403"),
        "wget did not report the refusal: {err}"
    );
    // The reason reaches the program too.
    let (_, body, _) = run(c, &format!("wget -O - {} 2>/dev/null; nc 127.0.0.1 3128 </dev/null >/dev/null 2>&1; printf 'GET {} HTTP/1.0\\r\\n\\r\\n' | nc 127.0.0.1 3128", denied.url("/x"), denied.url("/x"))).await;
    assert!(
        body.contains("403 Forbidden") && body.contains("is not in the allowlist"),
        "{body}"
    );
    assert_eq!(
        denied.connections(),
        0,
        "the host dialled the denied server"
    );

    // `localhost` is listed by name, but it resolves to the host's loopback, which no
    // address entry covers: refused at the address actually dialled.
    let (code, _, err) = run(
        c,
        &format!(
            "no_proxy= wget -q -O - http://localhost:{}/hello",
            allowed.addr.port()
        ),
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("403"), "{err}");

    let records = log_until(&vm, |r| r.iter().any(|r| r.verdict == Verdict::Allowed)).await;
    eprintln!("egress log: {records:#?}");
    let ok = records
        .iter()
        .find(|r| r.verdict == Verdict::Allowed)
        .unwrap_or_else(|| panic!("no allowed record: {records:?}"));
    assert_eq!(
        (ok.host.as_str(), ok.port),
        ("127.0.0.2", allowed.addr.port())
    );
    assert_eq!(ok.address.as_deref(), Some(allowed.entry().as_str()));
    assert!(ok.bytes_in > 20 && ok.bytes_out > 20, "{ok:?}");
    let no = records
        .iter()
        .find(|r| r.verdict == Verdict::Denied && r.host == "127.0.0.3")
        .unwrap_or_else(|| panic!("no denied record: {records:?}"));
    assert!(
        no.reason
            .as_deref()
            .unwrap()
            .contains("not in the allowlist"),
        "{no:?}"
    );
    let rebound = records
        .iter()
        .find(|r| r.host == "localhost")
        .unwrap_or_else(|| panic!("no record of localhost: {records:?}"));
    assert_eq!(rebound.verdict, Verdict::Denied);
    assert!(
        rebound.reason.as_deref().unwrap().contains("127.0.0.1"),
        "{rebound:?}"
    );
}

async fn python_urllib() {
    let Some(host) = VmHost::get("microvm_egress::python") else {
        return;
    };
    if let Some(missing) = python_template_missing() {
        panic!("{missing}");
    }
    let allowed = Server::start("127.0.0.2").await;
    let denied = Server::start("127.0.0.3").await;
    let vm = boot(&host, python_template(), egress(&[allowed.entry()])).await;
    let script = |url: String| {
        format!(
            "python3 -c \"import urllib.request, urllib.error\ntry:\n    print(urllib.request.urlopen('{url}', timeout=30).read().decode(), end='')\nexcept urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode(), end='')\""
        )
    };
    let (code, out, err) = run(vm.client(), &script(allowed.url("/py"))).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out,
        format!("hello from {} path /py\n", allowed.addr.port())
    );
    let (_, out, err) = run(vm.client(), &script(denied.url("/py"))).await;
    assert!(
        out.starts_with("HTTP 403") && out.contains("not in the allowlist"),
        "{out}{err}"
    );
    assert_eq!(denied.connections(), 0);
    // The template's warm session started before this VM had egress: it got the
    // variables with its reseed, so urllib in it goes through the proxy too.
    let code = format!(
        "import urllib.request\nurllib.request.urlopen('{}', timeout=30).read().decode()",
        allowed.url("/warm")
    );
    let reply = clean(vm.client(), python("default", &code)).await;
    assert!(!reply.session.started, "the warm session was started anew");
    assert_eq!(
        reply.value.as_deref(),
        Some(format!("'hello from {} path /warm\\n'", allowed.addr.port()).as_str())
    );
}

async fn not_http() {
    let Some(host) = VmHost::get("microvm_egress::not_http") else {
        return;
    };
    let allowed = Server::start("127.0.0.2").await;
    let vm = boot(&host, default_template(), egress(&[allowed.entry()])).await;
    let c = vm.client();
    // A TLS ClientHello's first bytes, and a SOCKS5 greeting, sent to the proxy.
    for (what, bytes) in [
        ("tls", "\\026\\003\\001\\002\\000\\001"),
        ("socks", "\\005\\001\\000"),
    ] {
        let (_, out, err) = run(c, &format!("printf '{bytes}' | nc 127.0.0.1 3128")).await;
        assert!(
            out.contains("400 Bad Request") && out.contains("Not an HTTP proxy request"),
            "{what}: {out}{err}"
        );
    }
    // An origin-form request is not a proxy request either.
    let (_, out, _) = run(
        c,
        "printf 'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' | nc 127.0.0.1 3128",
    )
    .await;
    assert!(
        out.contains("400 Bad Request") && out.contains("Only CONNECT and absolute"),
        "{out}"
    );
    // The sandbox lives on, egress included.
    let (code, out, err) = run(c, &format!("wget -q -O - {}", allowed.url("/after"))).await;
    assert_eq!(code, 0, "{out}{err}");
    let records = log_until(&vm, |r| {
        r.iter().filter(|r| r.verdict == Verdict::Refused).count() >= 3
    })
    .await;
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r.verdict == Verdict::Refused)
        .collect();
    assert_eq!(refused.len(), 3, "{records:?}");
    assert!(
        refused[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("Not an HTTP proxy request"),
        "{refused:?}"
    );
}

async fn net_none() {
    let Some(host) = VmHost::get("microvm_egress::none") else {
        return;
    };
    let server = Server::start("127.0.0.2").await;
    let vm = boot(&host, default_template(), Net::None).await;
    let c = vm.client();
    let (_, env, _) = run(c, "env | grep -i _proxy || true").await;
    assert!(env.is_empty(), "proxy variables without egress: {env}");
    // Only loopback: no interface, so no route.
    let (_, interfaces, _) = run(c, "ls /sys/class/net").await;
    assert_eq!(interfaces.trim(), "lo");
    // Nothing listens on the proxy port, and an outside address fails at once.
    let started = Instant::now();
    let (code, _, err) = run(
        c,
        &format!(
            "http_proxy=http://127.0.0.1:3128 wget -q -O - {}",
            server.url("/")
        ),
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.to_lowercase().contains("refused"), "{err}");
    let (code, _, err) = run(
        c,
        "nc -w 5 10.0.2.2 80 </dev/null; nc -w 5 93.184.216.34 443 </dev/null",
    )
    .await;
    assert_ne!(code, 0);
    assert_eq!(err.matches("Network is unreachable").count(), 2, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a failure took {:?}",
        started.elapsed()
    );
    assert_eq!(server.connections(), 0);
    assert!(vm
        .launcher()
        .egress_log(vm.vm().id(), 10)
        .unwrap()
        .is_empty());
}

async fn fork_and_hibernate() {
    let Some(host) = VmHost::get("microvm_egress::fork") else {
        return;
    };
    let allowed = Server::start("127.0.0.2").await;
    let vm = boot(&host, default_template(), egress(&[allowed.entry()])).await;
    let fetch = |client: &Client, tag: &'static str| {
        let url = allowed.url(&format!("/{tag}"));
        let client = client.clone();
        async move {
            let (code, out, err) = run(&client, &format!("wget -q -O - {url}")).await;
            assert_eq!(code, 0, "{tag}: {out}{err}");
            assert!(out.contains(&format!("path /{tag}")), "{tag}: {out}");
        }
    };
    fetch(vm.client(), "parent").await;
    let launcher = vm.launcher();
    let spec = BranchSpec {
        ready_timeout: Duration::from_secs(READY_TIMEOUT_SECS),
        ..BranchSpec::default()
    };
    let fork = launcher
        .fork(vm.vm().id(), 1, spec)
        .await
        .unwrap_or_else(|e| panic!("fork failed: {}", sandbox_vmm::error_chain(&e)));
    let child = &fork.children[0];
    let child_client = child.client(&ConnectOptions::default()).await.unwrap();
    fetch(&child_client, "child").await;
    // The parent goes on with its own.
    fetch(vm.client(), "parent-again").await;
    let paths = |records: &[EgressRecord]| {
        records
            .iter()
            .filter(|r| r.verdict == Verdict::Allowed)
            .count()
    };
    let child_log = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let records = launcher.egress_log(child.id(), 100).unwrap();
            if paths(&records) >= 1 || Instant::now() > deadline {
                break records;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(paths(&child_log), 1, "the child's own log: {child_log:?}");
    let parent_log = log_until(&vm, |r| paths(r) >= 2).await;
    assert_eq!(paths(&parent_log), 2, "the parent's log: {parent_log:?}");
    drop(child_client);
    drop(fork);

    // Hibernate and wake: egress comes back with the new relay.
    let mut spec = BootSpec::new(default_template());
    spec.net = egress(&[allowed.entry()]);
    spec.detached = true;
    spec.ready_timeout = Duration::from_secs(READY_TIMEOUT_SECS);
    let sleeper = launcher.boot(spec).await.unwrap();
    let id = sleeper.detach().unwrap().id;
    launcher.hibernate(&id).await.unwrap();
    let woken = launcher.wake(&id).await.unwrap();
    let token = std::fs::read_to_string(launcher.config().run_root.join(id.as_str()).join("token"))
        .unwrap();
    let options = ConnectOptions {
        token: Some(token.trim().to_owned()),
        ..ConnectOptions::default()
    };
    let woken_client = Client::connect(&woken.record.agent_url.parse().unwrap(), &options)
        .await
        .unwrap();
    fetch(&woken_client, "woken").await;
    drop(woken_client);
    launcher.stop(&id, Duration::from_secs(10)).await.unwrap();
}

fn sandboxctl_egress() {
    let Some(_host) = VmHost::get("microvm_egress::sandboxctl") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let allowed = runtime.block_on(Server::start("127.0.0.2"));
    let root = sandbox_tests::TempDir::new("egress-cli");
    let ctl = |args: &[&str]| {
        let output = std::process::Command::new(&binaries().sandboxctl)
            .env("SANDBOX_RUN_DIR", root.path())
            .env_remove("SANDBOX_AGENT")
            .stdin(std::process::Stdio::null())
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // A bad entry is a clear error, before anything boots.
    let (code, _, err) = ctl(&["vm", "start", "--net", "egress", "--allow", "10.0.0.1/8"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("Bad allowlist entry \"10.0.0.1/8\": the block has bits set past its prefix"),
        "{err}"
    );
    let entry = allowed.entry();
    let (code, out, err) = ctl(&["vm", "start", "--net", "egress", "--allow", &entry]);
    assert_eq!(code, Some(0), "{out}{err}");
    // `ID<TAB>AGENT_URL`
    let id = out.split('\t').next().unwrap().trim().to_owned();
    let url = allowed.url("/cli");
    let (code, out, err) = ctl(&["--vm", &id, "exec", "--", "wget", "-q", "-O", "-", &url]);
    let stop = || ctl(&["vm", "stop", &id]);
    if code != Some(0) {
        stop();
        panic!("wget through sandboxctl: {out}{err}");
    }
    assert!(out.contains("path /cli"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let (_, log, _) = ctl(&["vm", "egress-log", &id]);
        if log.contains("allowed") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (_, json, _) = ctl(&["vm", "egress-log", "--json", &id]);
    stop();
    eprintln!("{log}");
    assert!(log.starts_with("TIME"), "{log}");
    assert!(log.contains("allowed") && log.contains(&entry), "{log}");
    let record: EgressRecord = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(record.verdict, Verdict::Allowed);
}

async fn throughput() {
    let Some(host) = VmHost::get("microvm_egress::throughput") else {
        return;
    };
    let server = Server::start("127.0.0.2").await;
    // On the host: the same download from the same server.
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match stream.read(&mut buf).await.unwrap() {
            0 => break,
            n => got += n,
        }
    }
    let host_time = started.elapsed();
    assert!(got > BIG_BYTES, "the host got {got} bytes");

    let vm = boot(&host, default_template(), egress(&[server.entry()])).await;
    let started = Instant::now();
    let (code, out, err) = run(
        vm.client(),
        &format!("wget -q -O - {} | wc -c", server.url("/big")),
    )
    .await;
    let guest_time = started.elapsed();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), BIG_BYTES.to_string());
    // The link's own rate in the same direction, without the proxy: a `put` of the
    // same size into the guest's tmpfs.
    let zeros = vec![b'x'; BIG_BYTES];
    let started = Instant::now();
    vm.client().put("/tmp/big", None, &zeros[..]).await.unwrap();
    let put_time = started.elapsed();
    run(vm.client(), "rm /tmp/big").await;
    let mib = |d: Duration| BIG_BYTES as f64 / 1048576.0 / d.as_secs_f64();
    println!(
        "100 MiB into the guest over the link without the proxy (put): {put_time:?} ({:.1} MiB/s); the proxied download takes {:.2}x that",
        mib(put_time),
        guest_time.as_secs_f64() / put_time.as_secs_f64()
    );
    println!(
        "100 MiB download: host {host_time:?} ({:.0} MiB/s), guest through the egress proxy {guest_time:?} ({:.1} MiB/s): the guest takes {:.1}x the host's time",
        mib(host_time),
        mib(guest_time),
        guest_time.as_secs_f64() / host_time.as_secs_f64()
    );
}
