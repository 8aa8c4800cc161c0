//! The agent as PID 1, fast: in fresh user, pid, mount, UTS and network namespaces
//! (`unshare`, with a /proc of the new pid namespace), where it knows it is init,
//! sets the hostname, reaps orphans with its one reaper, and turns SIGTERM into the
//! shutdown path; and, as init, `reidentify` changes the hostname (of the UTS
//! namespace, and `/etc/hostname` on an overlay private to the mount namespace).
//! What needs a kernel of its own (the mounts, devtmpfs, modules, the OOM score,
//! loopback, the real poweroff) is covered by the microVM tests; here the namespace
//! refuses some of those steps and the agent must carry on.

use std::os::unix::net::UnixStream as StdUnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_protocol::{ErrorKind, Pid, ProcessState, ReidentifyRequest};
use sandbox_tests::{binaries, sh, wait_child, wait_until_gone};
use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};

/// An agent that is PID 1 of its own namespaces.
struct NamespacedInit {
    child: Child,
    url: String,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
}

/// Makes `/etc` writable inside the mount namespace only: an overlay whose upper
/// layer is a tmpfs at `$SBX_ETC_LAYERS` (unprivileged overlayfs, Linux 5.11+), so
/// what the agent writes there never reaches the host's `/etc`.
const PRIVATE_ETC: &str = "mount -t tmpfs tmpfs \"$SBX_ETC_LAYERS\" && \
     mkdir \"$SBX_ETC_LAYERS/upper\" \"$SBX_ETC_LAYERS/work\" && \
     mount -t overlay overlay \
       -o \"lowerdir=/etc,upperdir=$SBX_ETC_LAYERS/upper,workdir=$SBX_ETC_LAYERS/work\" /etc && ";

impl NamespacedInit {
    /// The agent as init of fresh namespaces, in a test directory named after `tag`;
    /// with `private_etc`, over an `/etc` of its own ([`PRIVATE_ETC`]).
    fn start(tag: &str, private_etc: bool) -> Self {
        // As init the agent mounts a fresh tmpfs on /tmp and /run when they are not
        // mount points, which would hide a socket there (the checkout may well live
        // under /tmp). So they are bind-mounted onto themselves in the namespace first.
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pid1-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cannot create the test dir");
        let socket = dir.join("agent.sock");
        let log = dir.join("agent.log");
        let log_file = std::fs::File::create(&log).expect("cannot create the log");
        let layers = dir.join("etc-layers");
        std::fs::create_dir_all(&layers).expect("cannot create the /etc layers dir");
        let script = format!(
            "{}mount --bind /tmp /tmp && mount --bind /run /run && exec \"$0\" \"$@\"",
            if private_etc { PRIVATE_ETC } else { "" }
        );
        let child = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                // If the test fails early and kills unshare, the namespace goes too.
                "--kill-child",
                "--mount-proc",
                "--mount",
                "--uts",
                "--net",
                "sh",
                "-c",
                &script,
            ])
            .arg(&binaries().agent)
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .env("SBX_ETC_LAYERS", &layers)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("cannot dup the log"))
            .stderr(log_file)
            .spawn()
            .expect("cannot run unshare (util-linux) to start the agent as PID 1");
        let mut init = Self {
            child,
            url: format!("unix://{}", socket.display()),
            log,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while StdUnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = init.child.try_wait() {
                panic!("the namespaced agent exited with {status}:\n{}", init.log());
            }
            assert!(
                Instant::now() < deadline,
                "the namespaced agent never listened:\n{}",
                init.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        init
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn client(&self) -> Client {
        self.connect(None).await.expect("cannot connect")
    }

    async fn connect(&self, token: Option<&str>) -> Result<Client, ClientError> {
        let url: AgentUrl = self.url.parse().expect("bad url");
        let options = ConnectOptions {
            token: token.map(str::to_owned),
            ..ConnectOptions::default()
        };
        Client::connect(&url, &options).await
    }
}

impl Drop for NamespacedInit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn init_duties_run_and_orphans_are_reaped_and_sigterm_ends_the_namespace() {
    let mut init = NamespacedInit::start("duties", false);
    let client = init.client().await;

    let info = client.info().await.expect("info");
    assert!(info.is_init, "the agent does not know it is init");
    // PID 1 of the namespace is the agent, and it mounted a /proc for that namespace.
    assert_eq!(
        sh(&client, "cat /proc/1/comm").await.trim(),
        "sandbox-agent"
    );
    // Its own UTS namespace got the default hostname.
    assert_eq!(
        sh(&client, "cat /proc/sys/kernel/hostname").await.trim(),
        "sandbox"
    );

    // A double fork leaves an orphan that the kernel re-parents to PID 1; the agent's
    // one reaper must collect it, leaving no zombie.
    let orphan: i32 = sh(&client, "sh -c 'sleep 0.3 & echo $!'")
        .await
        .trim()
        .parse()
        .expect("orphan pid");
    let parent = sh(
        &client,
        &format!("awk '/^PPid/ {{print $2}}' /proc/{orphan}/status"),
    )
    .await;
    assert_eq!(
        parent.trim(),
        "1",
        "the orphan was not re-parented to the agent"
    );
    wait_until_gone(&client, orphan, "the orphan's exit and PID 1's reaping").await;
    let gone = sh(
        &client,
        &format!("test -e /proc/{orphan} && cat /proc/{orphan}/stat || echo gone"),
    )
    .await;
    assert_eq!(gone.trim(), "gone", "the orphan was not reaped: {gone}");
    // Orphans are not tracked processes.
    assert!(client
        .ps()
        .await
        .expect("ps")
        .iter()
        .all(|p| p.pid != Pid(orphan)));

    // A spawned child in flight when SIGTERM arrives is stopped by the shutdown.
    let pid = client
        .spawn(sandbox_tests::shell("sleep 600"))
        .await
        .expect("spawn");
    assert!(matches!(
        client
            .ps()
            .await
            .expect("ps")
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.state),
        Some(ProcessState::Running)
    ));
    let unshare_child = nix::unistd::Pid::from_raw(
        std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            init.child.id(),
            init.child.id()
        ))
        .expect("children of unshare")
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the namespaced agent's host pid"),
    );
    nix::sys::signal::kill(unshare_child, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    // reboot(2) in a pid namespace ends the namespace's init, and unshare with it.
    let ended = wait_child(&mut init.child, Duration::from_secs(15));
    assert!(
        ended.is_some(),
        "the namespace did not end after SIGTERM:\n{}",
        init.log()
    );
    let log = init.log();
    assert!(
        log.contains("SIGTERM") && log.contains("shutting down"),
        "{log}"
    );
}

#[tokio::test]
async fn as_init_reidentify_sets_the_hostname_and_the_token() {
    let init = NamespacedInit::start("reidentify", true);
    let client = init.client().await;
    let hostname = |client: Client| async move {
        sh(&client, "cat /proc/sys/kernel/hostname; cat /etc/hostname").await
    };
    assert_eq!(
        hostname(client.clone()).await.lines().next(),
        Some("sandbox")
    );

    // A bad name is refused before anything changes, also for init.
    let bad = ReidentifyRequest {
        hostname: Some("bad_name!".into()),
        token: Some("fresh".into()),
    };
    let err = client.reidentify(bad).await.unwrap_err();
    assert_eq!(err.wire_kind(), Some(ErrorKind::BadRequest), "{err}");
    init.connect(None)
        .await
        .expect("the token changed with a refused request");

    let request = ReidentifyRequest {
        hostname: Some("fork-1".into()),
        token: Some("fresh".into()),
    };
    client
        .reidentify(request)
        .await
        .unwrap_or_else(|e| panic!("reidentify: {e}\n{}", init.log()));
    // The kernel's hostname and /etc/hostname, read through the old connection.
    assert_eq!(hostname(client.clone()).await, "fork-1\nfork-1\n");
    // The agent had no token; now new connections need one.
    let err = init.connect(None).await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized(_)), "{err:?}");
    let fresh = init.connect(Some("fresh")).await.expect("the new token");
    assert_eq!(
        sh(&fresh, "cat /proc/sys/kernel/hostname").await.trim(),
        "fork-1"
    );
}
