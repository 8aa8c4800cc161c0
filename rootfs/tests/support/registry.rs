//! A real OCI registry for tests, and images to push to it: Debian's
//! `docker-registry` (the CNCF distribution server) on a free loopback port with
//! htpasswd (bcrypt) auth, started per test and stopped on drop; OCI image layouts
//! written by hand ([`OciLayout`], with tar layers made entry by entry, [`Layer`], so
//! a test can write what `tar::Builder` would refuse) and pushed with `skopeo`.
//!
//! Shared by the builder's registry tests (`rootfs/tests/registry.rs`) and the
//! microVM test that boots a template pulled from a registry
//! (`tests/tests/microvm_templates.rs`), which include this file by path.
//! Needs `docker-registry`, `skopeo` and `htpasswd` (apache2-utils), which
//! `scripts/setup.sh` installs; a missing one fails the test, naming its package.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// The registry's user.
pub const USER: &str = "tester";
/// Its password.
pub const PASSWORD: &str = "s3cret-pw";
/// The static busybox the test roots are made of.
pub const BUSYBOX: &str = "/bin/busybox";
/// The applets linked in `/bin`.
pub const APPLETS: [&str; 3] = ["sh", "cat", "ls"];

pub fn need(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{program} is missing: install {package} (scripts/setup.sh does)"
    );
}

/// A registry serving on a free loopback port, stopped on drop.
pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub host: String,
}

impl Registry {
    /// A registry with htpasswd (Basic) auth.
    pub fn start() -> Self {
        need("htpasswd", "apache2-utils");
        let dir = tempfile::tempdir().unwrap();
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .unwrap();
        assert!(htpasswd.status.success());
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).unwrap();
        let auth = format!(
            "{{ htpasswd: {{ realm: test-realm, path: {} }} }}",
            dir.path().join("htpasswd").display()
        );
        Self::start_with(dir, &auth)
    }

    /// A registry whose `auth:` section is `auth` (YAML flow style), e.g. a token
    /// server's realm, with its files in `dir`.
    pub fn start_with(dir: tempfile::TempDir, auth: &str) -> Self {
        need("docker-registry", "docker-registry");
        need("skopeo", "skopeo");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog: {{ level: warn }}\n\
             storage: {{ filesystem: {{ rootdirectory: {root} }} }}\n\
             http: {{ addr: {host}, secret: test-secret }}\n\
             auth: {auth}\n",
            root = dir.path().join("storage").display(),
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let registry = Self { child, dir, host };
        registry.wait_ready();
        registry
    }

    /// Polls `GET /v2/` until the server answers (401: auth is on).
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut stream) = TcpStream::connect(&self.host) {
                let request = format!("GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.host);
                let mut answer = String::new();
                if stream.write_all(request.as_bytes()).is_ok()
                    && stream.read_to_string(&mut answer).is_ok()
                    && answer.starts_with("HTTP/1.")
                    && answer.contains(" 401 ")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the registry did not start: {}",
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Pushes the layout's `tag` to `repo:tag` (`--all`: an index with every image).
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) {
        let output = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--all", "--quiet"])
            .args(["--dest-tls-verify=false", "--dest-creds"])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.host))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The digest of the manifest the registry serves for `repo:tag` (skopeo
    /// compresses plain layers on the way, which rewrites their manifest).
    pub fn served_digest(&self, repo_tag: &str) -> String {
        let output = Command::new("skopeo")
            .args([
                "--insecure-policy",
                "inspect",
                "--raw",
                "--tls-verify=false",
                "--creds",
            ])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg(format!("docker://{}/{repo_tag}", self.host))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        digest(&output.stdout)
    }

    /// Where the registry keeps a blob's bytes.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn digest(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Tar entries made by hand, so a test can write what `tar::Builder` would refuse.
#[derive(Default)]
pub struct Layer(Vec<u8>);

impl Layer {
    pub fn entry(&mut self, kind: tar::EntryType, path: &str, link: &str, data: &[u8], mode: u32) {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        self.0.extend_from_slice(header.as_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().div_ceil(512) * 512, 0);
    }
    pub fn dir(mut self, path: &str) -> Self {
        self.entry(tar::EntryType::Directory, path, "", b"", 0o755);
        self
    }
    pub fn file(mut self, path: &str, data: &[u8]) -> Self {
        self.entry(tar::EntryType::Regular, path, "", data, 0o644);
        self
    }
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.entry(tar::EntryType::Symlink, path, target, b"", 0o777);
        self
    }
    pub fn hard_link(mut self, path: &str, target: &str) -> Self {
        self.entry(tar::EntryType::Link, path, target, b"", 0o644);
        self
    }
    pub fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0; 1024]);
        self.0
    }
}

/// A busybox root with a marker and files a later layer deletes.
pub fn busybox_layer(marker: &str) -> Vec<u8> {
    let busybox = std::fs::read(BUSYBOX).unwrap_or_else(|e| {
        panic!("cannot read {BUSYBOX} ({e}): install busybox-static (scripts/setup.sh does)")
    });
    let mut layer = Layer::default().dir("bin/").dir("etc/").dir("opq/");
    layer.entry(tar::EntryType::Regular, "bin/busybox", "", &busybox, 0o755);
    for applet in APPLETS {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    layer
        .file("etc/marker", marker.as_bytes())
        .file("etc/doomed", b"deleted by the top layer\n")
        .file("opq/old", b"hidden by the opaque marker\n")
        .finish()
}

/// An OCI image layout being written: blobs, and `index.json` naming tags.
pub struct OciLayout {
    dir: tempfile::TempDir,
    tags: Vec<Value>,
}

impl OciLayout {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        std::fs::write(
            dir.path().join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        Self {
            dir,
            tags: Vec::new(),
        }
    }

    /// Writes a blob; returns its descriptor.
    pub fn blob(&self, media_type: &str, data: &[u8]) -> Value {
        let digest = digest(data);
        let path = self.dir.path().join("blobs/sha256").join(&digest[7..]);
        std::fs::write(path, data).unwrap();
        json!({"mediaType": media_type, "digest": digest, "size": data.len()})
    }

    /// An image manifest for `architecture`; `gzip_layers` compresses the layers.
    pub fn image(
        &self,
        layers: &[Vec<u8>],
        run: Value,
        architecture: &str,
        gzip_layers: bool,
    ) -> Value {
        let config = json!({
            "architecture": architecture, "os": "linux", "config": run,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| digest(l)).collect::<Vec<_>>()},
        });
        let config = self.blob(
            "application/vnd.oci.image.config.v1+json",
            config.to_string().as_bytes(),
        );
        let layers: Vec<Value> = layers
            .iter()
            .map(|layer| match gzip_layers {
                true => self.blob("application/vnd.oci.image.layer.v1.tar+gzip", &gzip(layer)),
                false => self.blob("application/vnd.oci.image.layer.v1.tar", layer),
            })
            .collect();
        let manifest = json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config, "layers": layers,
        });
        let mut descriptor = self.blob(
            "application/vnd.oci.image.manifest.v1+json",
            manifest.to_string().as_bytes(),
        );
        descriptor["platform"] = json!({"architecture": architecture, "os": "linux"});
        descriptor
    }

    /// An index of `manifests`.
    pub fn index(&self, manifests: &[Value]) -> Value {
        let index = json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        self.blob(
            "application/vnd.oci.image.index.v1+json",
            index.to_string().as_bytes(),
        )
    }

    /// Names `descriptor` as `tag` and rewrites `index.json`.
    pub fn tag(&mut self, mut descriptor: Value, tag: &str) -> &Path {
        descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        descriptor.as_object_mut().unwrap().remove("platform");
        self.tags
            .retain(|t| t["annotations"]["org.opencontainers.image.ref.name"] != tag);
        self.tags.push(descriptor);
        let index = json!({"schemaVersion": 2, "manifests": self.tags});
        std::fs::write(self.dir.path().join("index.json"), index.to_string()).unwrap();
        self.dir.path()
    }
}
