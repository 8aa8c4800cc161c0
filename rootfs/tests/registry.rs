//! Registry bases against a real registry: Debian's `docker-registry` (the CNCF
//! distribution server) on loopback with htpasswd auth, started by each test, and
//! images pushed to it by `skopeo` from OCI layouts the test writes (a busybox root,
//! two images sharing a layer, whiteouts, a multi-arch index). Pulls go through the
//! library ([`registry::pull`]) into a fresh cache, so downloads and cache hits can be
//! counted; the last test drives the `sandbox-rootfs` binary end to end (a template
//! that records its source, and failures that leave nothing behind).
//!
//! Needs `docker-registry`, `skopeo` and `htpasswd` (apache2-utils), which
//! `scripts/setup.sh` installs; a missing one fails the test, naming it.

// Helpers unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use sandbox_rootfs::base::registry::auth::{AuthSource, BasicAuth};
use sandbox_rootfs::base::registry::reference::ImageRef;
use sandbox_rootfs::base::registry::{self, Pulled, RegistryError, RegistryOptions};
use serde_json::{json, Value};

#[path = "support/registry.rs"]
mod support;
use support::{busybox_layer, digest, gzip, Layer, OciLayout, Registry, PASSWORD, USER};

/// What only these tests ask of a registry: references and options for the library.
trait ForLibrary {
    fn image(&self, repo_tag: &str) -> ImageRef;
    fn options(&self) -> RegistryOptions;
}

impl ForLibrary for Registry {
    fn image(&self, repo_tag: &str) -> ImageRef {
        format!("oci://{}/{repo_tag}", self.host).parse().unwrap()
    }

    fn options(&self) -> RegistryOptions {
        RegistryOptions {
            auth: AuthSource {
                explicit: Some(BasicAuth {
                    user: USER.into(),
                    password: PASSWORD.into(),
                }),
                docker_config: None,
            },
            insecure: vec![self.host.clone()],
            ..RegistryOptions::default()
        }
    }
}

fn run_config() -> Value {
    json!({"Env": ["PATH=/bin", "GREETING=from the registry"], "WorkingDir": "/srv/app",
           "User": "1000:1000", "Cmd": ["/bin/sh"]})
}

/// The top layer: a whiteout, an opaque folder, a new file.
fn whiteout_layer() -> Vec<u8> {
    Layer::default()
        .dir("etc/")
        .file("etc/.wh.doomed", b"")
        .dir("opq/")
        .file("opq/.wh..wh..opq", b"")
        .file("opq/new", b"kept\n")
        .finish()
}

fn pull(
    image: &ImageRef,
    opts: &RegistryOptions,
    cache: &Path,
) -> Result<(Pulled, tempfile::TempDir), RegistryError> {
    let staging = tempfile::tempdir().unwrap();
    registry::pull(image, opts, cache, staging.path()).map(|pulled| (pulled, staging))
}

#[test]
fn pulls_by_tag_and_digest_apply_whiteouts_and_share_cached_layers() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let base = busybox_layer("marker v1\n");
    let a = layout.image(
        &[base.clone(), whiteout_layer()],
        run_config(),
        "amd64",
        true,
    );
    let b = layout.image(
        &[
            base.clone(),
            Layer::default().file("etc/b", b"only in b\n").finish(),
        ],
        json!({}),
        "amd64",
        true,
    );
    registry.push(layout.tag(a.clone(), "v1"), "v1", "test/a");
    registry.push(layout.tag(b, "v1"), "v1", "test/b");
    let cache = tempfile::tempdir().unwrap();
    let opts = registry.options();

    // By tag: manifest, config and both layers downloaded.
    let (pulled, root) = pull(&registry.image("test/a:v1"), &opts, cache.path()).unwrap();
    assert_eq!((pulled.stats.downloaded, pulled.stats.cached), (4, 0));
    assert_eq!(pulled.source.manifest_digest, a["digest"].as_str().unwrap());
    assert_eq!(pulled.source.index_digest, None);
    assert_eq!(
        pulled.source.reference,
        format!("oci://{}/test/a:v1", registry.host)
    );
    let read = |p: &str| std::fs::read_to_string(root.path().join(p)).ok();
    assert_eq!(read("etc/marker").as_deref(), Some("marker v1\n"));
    assert_eq!(read("etc/doomed"), None, "the whiteout was not applied");
    assert_eq!(read("opq/old"), None, "the opaque folder kept a lower file");
    assert_eq!(read("opq/new").as_deref(), Some("kept\n"));
    assert!(!root.path().join("etc/.wh.doomed").exists());
    assert!(root.path().join("bin/busybox").is_file());
    assert_eq!(
        pulled.config.env,
        vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("GREETING".to_owned(), "from the registry".to_owned())
        ]
    );
    assert_eq!(pulled.config.cwd.as_deref(), Some("/srv/app"));
    assert_eq!(pulled.config.user.as_deref(), Some("1000:1000"));

    // A second image sharing the busybox layer downloads only what it adds.
    let (pulled_b, root_b) = pull(&registry.image("test/b:v1"), &opts, cache.path()).unwrap();
    assert_eq!((pulled_b.stats.downloaded, pulled_b.stats.cached), (3, 1));
    assert!(
        pulled_b.stats.downloaded_bytes < gzip(&base).len() as u64,
        "the shared layer was downloaded again: {:?}",
        pulled_b.stats
    );
    assert!(root_b.path().join("etc/doomed").is_file());
    assert!(root_b.path().join("etc/b").is_file());

    // By digest: everything from the cache.
    let by_digest = registry.image(&format!("test/a@{}", pulled.source.manifest_digest));
    let (again, root) = pull(&by_digest, &opts, cache.path()).unwrap();
    assert_eq!((again.stats.downloaded, again.stats.cached), (0, 4));
    assert_eq!(again.source.manifest_digest, pulled.source.manifest_digest);
    assert_eq!(read_in(&root, "opq/new").as_deref(), Some("kept\n"));

    // The tag moves: without --refresh the pinned digest is used, with it the new one.
    let a2 = layout.image(&[busybox_layer("marker v2\n")], json!({}), "amd64", false);
    registry.push(layout.tag(a2, "v1"), "v1", "test/a");
    let (pinned, root) = pull(&registry.image("test/a:v1"), &opts, cache.path()).unwrap();
    assert_eq!(pinned.source.manifest_digest, pulled.source.manifest_digest);
    assert_eq!(
        pinned.stats.downloaded, 0,
        "a pinned tag asked the registry"
    );
    assert_eq!(read_in(&root, "etc/marker").as_deref(), Some("marker v1\n"));
    let refresh = RegistryOptions {
        refresh: true,
        ..opts.clone()
    };
    let (moved, root) = pull(&registry.image("test/a:v1"), &refresh, cache.path()).unwrap();
    assert_eq!(
        moved.source.manifest_digest,
        registry.served_digest("test/a:v1")
    );
    assert_ne!(moved.source.manifest_digest, pulled.source.manifest_digest);
    assert_eq!(read_in(&root, "etc/marker").as_deref(), Some("marker v2\n"));
    // And the pin now follows the refreshed digest.
    let (after, _) = pull(&registry.image("test/a:v1"), &opts, cache.path()).unwrap();
    assert_eq!(after.source.manifest_digest, moved.source.manifest_digest);
}

fn read_in(root: &tempfile::TempDir, path: &str) -> Option<String> {
    std::fs::read_to_string(root.path().join(path)).ok()
}

#[test]
fn a_multi_arch_index_resolves_to_amd64_and_an_arm64_only_image_is_refused() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let amd64 = layout.image(&[busybox_layer("amd64\n")], json!({}), "amd64", true);
    let arm64 = layout.image(
        &[Layer::default().file("etc/marker", b"arm64\n").finish()],
        json!({}),
        "arm64",
        true,
    );
    let index = layout.index(&[arm64.clone(), amd64.clone()]);
    registry.push(layout.tag(index.clone(), "multi"), "multi", "test/multi");
    let arm_only = layout.index(std::slice::from_ref(&arm64));
    registry.push(layout.tag(arm_only, "arm"), "arm", "test/multi");
    registry.push(layout.tag(arm64, "arm-single"), "arm-single", "test/multi");
    let cache = tempfile::tempdir().unwrap();
    let opts = registry.options();

    let (pulled, root) = pull(&registry.image("test/multi:multi"), &opts, cache.path()).unwrap();
    assert_eq!(
        pulled.source.manifest_digest,
        amd64["digest"].as_str().unwrap()
    );
    assert_eq!(
        pulled.source.index_digest.as_deref(),
        Some(index["digest"].as_str().unwrap())
    );
    assert_eq!(read_in(&root, "etc/marker").as_deref(), Some("amd64\n"));

    for tag in ["arm", "arm-single"] {
        let error = pull(
            &registry.image(&format!("test/multi:{tag}")),
            &opts,
            cache.path(),
        )
        .unwrap_err();
        match &error {
            RegistryError::WrongPlatform { available, .. } => {
                assert_eq!(available, &["linux/arm64"], "{tag}")
            }
            other => panic!("{tag}: {other}"),
        }
        assert!(
            error.to_string().contains("no linux/amd64 image"),
            "{error}"
        );
    }
}

#[test]
fn wrong_credentials_missing_tags_and_plain_http_are_refused() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let image = layout.image(&[busybox_layer("x\n")], json!({}), "amd64", true);
    registry.push(layout.tag(image, "v1"), "v1", "test/auth");
    let cache = tempfile::tempdir().unwrap();
    let good = registry.options();

    let wrong = RegistryOptions {
        auth: AuthSource {
            explicit: Some(BasicAuth {
                user: USER.into(),
                password: "wrong".into(),
            }),
            docker_config: None,
        },
        ..good.clone()
    };
    let error = pull(&registry.image("test/auth:v1"), &wrong, cache.path()).unwrap_err();
    assert!(
        matches!(
            error,
            RegistryError::Unauthorized {
                anonymous: false,
                ..
            }
        ),
        "{error}"
    );
    let anonymous = RegistryOptions {
        auth: AuthSource::default(),
        ..good.clone()
    };
    let error = pull(&registry.image("test/auth:v1"), &anonymous, cache.path()).unwrap_err();
    assert!(
        matches!(
            error,
            RegistryError::Unauthorized {
                anonymous: true,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("--registry-auth"), "{error}");

    let error = pull(&registry.image("test/auth:nope"), &good, cache.path()).unwrap_err();
    assert!(matches!(error, RegistryError::NotFound { .. }), "{error}");
    let error = pull(&registry.image("test/nothing:v1"), &good, cache.path()).unwrap_err();
    assert!(matches!(error, RegistryError::NotFound { .. }), "{error}");

    // Not named insecure: HTTPS only, which this plain-HTTP registry cannot speak.
    let https = RegistryOptions {
        insecure: Vec::new(),
        ..good.clone()
    };
    let error = pull(&registry.image("test/auth:v1"), &https, cache.path()).unwrap_err();
    assert!(matches!(error, RegistryError::Registry { .. }), "{error}");

    // Credentials from docker's config.json.
    let config = tempfile::NamedTempFile::new().unwrap();
    let auth = base64_encode(format!("{USER}:{PASSWORD}").as_bytes());
    let entry = json!({"auths": {(format!("http://{}", registry.host)): {"auth": auth}}});
    std::fs::write(config.path(), entry.to_string()).unwrap();
    let from_config = RegistryOptions {
        auth: AuthSource {
            explicit: None,
            docker_config: Some(config.path().to_owned()),
        },
        ..good
    };
    let (pulled, _) = pull(&registry.image("test/auth:v1"), &from_config, cache.path()).unwrap();
    assert_eq!(
        pulled.stats.downloaded + pulled.stats.cached,
        3,
        "{:?}",
        pulled.stats
    );
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[test]
fn tampered_blobs_and_manifests_are_refused_and_never_cached() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let layer = gzip(&busybox_layer("x\n"));
    let image = layout.image(&[busybox_layer("x\n")], json!({}), "amd64", true);
    registry.push(layout.tag(image, "v1"), "v1", "test/tamper");
    // Same length, one byte changed, on the registry's disk.
    let stored = registry.blob_file(&digest(&layer));
    let mut bytes = std::fs::read(&stored).unwrap();
    assert_eq!(bytes, layer);
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&stored, &bytes).unwrap();

    let cache = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let error = registry::pull(
        &registry.image("test/tamper:v1"),
        &registry.options(),
        cache.path(),
        staging.path(),
    )
    .unwrap_err();
    match &error {
        RegistryError::DigestMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &digest(&layer));
            assert_eq!(actual, &digest(&bytes));
        }
        other => panic!("not a digest mismatch: {other}"),
    }
    let blobs = cache.path().join("oci/blobs/sha256");
    assert!(
        !blobs.join(&digest(&layer)[7..]).exists(),
        "tampered blob cached"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "partial downloads left: {leftovers:?}"
    );
    assert_eq!(std::fs::read_dir(staging.path()).unwrap().count(), 0);

    // A manifest changed on the registry's disk, asked for by tag (the registry's
    // digest header no longer matches) and by digest.
    let image = layout.image(&[busybox_layer("y\n")], json!({}), "amd64", true);
    registry.push(layout.tag(image, "v2"), "v2", "test/tamper");
    let served = registry.served_digest("test/tamper:v2");
    let stored = registry.blob_file(&served);
    let text = std::fs::read_to_string(&stored).unwrap();
    let tampered = text.replacen("\"schemaVersion\":2", "\"schemaVersion\": 2", 1);
    assert_ne!(text, tampered);
    std::fs::write(&stored, tampered).unwrap();
    for reference in ["test/tamper:v2".to_owned(), format!("test/tamper@{served}")] {
        let error = pull(
            &registry.image(&reference),
            &registry.options(),
            cache.path(),
        )
        .unwrap_err();
        assert!(
            matches!(&error, RegistryError::DigestMismatch { what, .. } if what == "the manifest"),
            "{reference}: {error}"
        );
        assert!(!cache
            .path()
            .join("oci/blobs/sha256")
            .join(&served[7..])
            .exists());
    }
}

#[test]
fn layers_that_escape_the_root_or_the_size_limit_are_refused() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    // An absolute symlink in a lower layer, and an upper layer acting through it.
    let link = Layer::default().symlink("up", "/").finish();
    let evil = [
        (
            "dotdot",
            vec![Layer::default().file("../escaped", b"x").finish()],
            "escaped",
        ),
        (
            "symlink",
            vec![Layer::default()
                .symlink("up", "/")
                .file("up/escaped", b"x")
                .finish()],
            "up/escaped",
        ),
        (
            "hardlink",
            vec![Layer::default()
                .hard_link("passwd", "../../../../etc/passwd")
                .finish()],
            "passwd",
        ),
        (
            "whiteout",
            vec![
                link.clone(),
                Layer::default().file("up/etc/.wh.hostname", b"").finish(),
            ],
            "up/etc/.wh.hostname",
        ),
        (
            "opaque",
            vec![
                link,
                Layer::default().file("up/tmp/.wh..wh..opq", b"").finish(),
            ],
            "up/tmp/.wh..wh..opq",
        ),
    ];
    for (tag, layers, _) in &evil {
        let image = layout.image(layers, json!({}), "amd64", false);
        registry.push(layout.tag(image, tag), tag, "test/evil");
    }
    let cache = tempfile::tempdir().unwrap();
    for (tag, _, path) in &evil {
        let parent = tempfile::tempdir().unwrap();
        let staging = parent.path().join("root");
        std::fs::create_dir(&staging).unwrap();
        let error = registry::pull(
            &registry.image(&format!("test/evil:{tag}")),
            &registry.options(),
            cache.path(),
            &staging,
        )
        .unwrap_err();
        match &error {
            RegistryError::Escaping { path: entry, .. } => {
                assert!(entry.ends_with(path), "{tag}: {error}")
            }
            other => panic!("{tag}: not refused as escaping: {other}"),
        }
        assert!(!parent.path().join("escaped").exists(), "{tag} escaped");
    }

    // The limit: the layers' declared size, before any download, and the unpacked size
    // (a layer that compresses well).
    let big = Layer::default().file("zeros", &vec![0u8; 3 << 20]).finish();
    let image = layout.image(&[big], json!({}), "amd64", true);
    registry.push(layout.tag(image, "big"), "big", "test/big");
    let image = layout.image(&[busybox_layer("x\n")], json!({}), "amd64", false);
    registry.push(layout.tag(image, "plain"), "plain", "test/big");
    let limited = RegistryOptions {
        max_bytes: 1 << 20,
        ..registry.options()
    };
    let error = pull(&registry.image("test/big:plain"), &limited, cache.path()).unwrap_err();
    assert!(matches!(error, RegistryError::TooLarge { .. }), "{error}");
    let error = pull(&registry.image("test/big:big"), &limited, cache.path()).unwrap_err();
    match &error {
        RegistryError::TooLarge { what, .. } => assert!(what.contains("unpacked"), "{error}"),
        other => panic!("not refused as too large: {other}"),
    }
}

/// The `sandbox-rootfs` binary with the environment's `SANDBOX_HOME` (its kernel
/// cache) but templates written under `home`.
fn rootfs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sandbox-rootfs"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("SANDBOX_REGISTRY_AUTH")
        .env("DOCKER_CONFIG", "/nonexistent")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

#[test]
fn the_builder_records_the_source_and_leaves_nothing_when_refused() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let image = layout.image(
        &[busybox_layer("built\n"), whiteout_layer()],
        run_config(),
        "amd64",
        true,
    );
    registry.push(layout.tag(image.clone(), "v1"), "v1", "test/built");
    let home = tempfile::tempdir().unwrap();
    let templates = home.path().join("templates");
    let name = format!("oci-{}", std::process::id());
    let output = templates.join(&name);
    let base = format!("oci://{}/test/built:v1", registry.host);
    let auth = format!("{USER}:{PASSWORD}");
    let mut args = vec!["build", "--name", &name, "--base", &base];
    let out = output.to_str().unwrap();
    args.extend(["--output", out, "--insecure-registry", &registry.host]);

    // Refusals before anything is built: nothing in the templates folder.
    let wrong = format!("{USER}:wrong");
    for (extra, expected) in [
        (
            vec!["--registry-auth", wrong.as_str()],
            "refused the credentials",
        ),
        (vec![], "needs credentials"),
    ] {
        let result = rootfs(&[args.as_slice(), extra.as_slice()].concat());
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        let left: Vec<_> = std::fs::read_dir(&templates)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    let result = rootfs(&[args.as_slice(), &["--registry-auth", &auth]].concat());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(
        !stderr.contains("\r"),
        "progress drawn into a pipe:\n{stderr}"
    );
    let show = Command::new(env!("CARGO_BIN_EXE_sandbox-rootfs"))
        .args(["show", &name])
        .env("SANDBOX_HOME", home.path())
        .output()
        .unwrap();
    assert!(show.status.success());
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["image_source"]["reference"], base);
    assert_eq!(shown["image_source"]["manifest_digest"], image["digest"]);
    assert_eq!(shown["image_config"]["cwd"], "/srv/app");
    assert_eq!(shown["image_config"]["user"], "1000:1000");
}

/// A hostile registry: answers `/v2/` anonymously, announces every manifest as
/// `length` bytes on HEAD, and on a GET streams bytes until the client hangs up.
/// (docker-registry itself refuses manifests over 4 MiB on push, "request body too
/// large", so only a hostile server sends one.) Returns its `HOST:PORT` and the
/// GET requests it saw.
fn announcing_registry(length: u64) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let gets = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = gets.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut request = String::new();
                    if reader.read_line(&mut request).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                            break;
                        }
                    }
                    let manifest = request.contains("/manifests/");
                    let answer = if request.starts_with("HEAD ") && manifest {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                             Content-Length: {length}\r\nDocker-Content-Digest: sha256:{}\r\n\r\n",
                            "0".repeat(64)
                        )
                    } else if manifest {
                        seen.fetch_add(1, Ordering::SeqCst);
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                             Content-Length: {length}\r\n\r\n"
                        );
                        if stream.write_all(head.as_bytes()).is_err() {
                            return;
                        }
                        let chunk = vec![b' '; 1 << 16];
                        while stream.write_all(&chunk).is_ok() {}
                        return;
                    } else {
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                            .to_owned()
                    };
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (host, gets)
}

#[test]
fn a_manifest_announced_over_the_limit_is_refused_before_it_is_read() {
    let announced = 1u64 << 30;
    let (host, gets) = announcing_registry(announced);
    let image: ImageRef = format!("oci://{host}/test/huge:v1").parse().unwrap();
    let options = RegistryOptions {
        insecure: vec![host.clone()],
        ..RegistryOptions::default()
    };
    let cache = tempfile::tempdir().unwrap();
    let error = pull(&image, &options, cache.path()).unwrap_err();
    match &error {
        RegistryError::TooLarge { what, bytes, max } => {
            assert_eq!(what, registry::fetch::MANIFEST_ANNOUNCED, "{error}");
            assert_eq!(*bytes, announced);
            assert_eq!(*max, registry::fetch::DOCUMENT_MAX_BYTES);
        }
        other => panic!(
            "not refused by its announced size: {}",
            sandbox_rootfs_chain(other)
        ),
    }
    assert_eq!(
        gets.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the manifest was downloaded"
    );
}

#[test]
fn building_again_from_the_same_digest_and_options_rewrites_nothing() {
    let registry = Registry::start();
    let mut layout = OciLayout::new();
    let image = layout.image(&[busybox_layer("cached\n")], run_config(), "amd64", true);
    registry.push(layout.tag(image.clone(), "v1"), "v1", "test/rebuild");
    let home = tempfile::tempdir().unwrap();
    let output = home.path().join("templates/rebuilt");
    let base = format!("oci://{}/test/rebuild:v1", registry.host);
    let auth = format!("{USER}:{PASSWORD}");
    let args = [
        "build",
        "--name",
        "rebuilt",
        "--base",
        &base,
        "--output",
        output.to_str().unwrap(),
        "--insecure-registry",
        &registry.host,
        "--registry-auth",
        &auth,
    ];
    let first = rootfs(&args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let manifest = output.join("template.json");
    let written = std::fs::metadata(&manifest).unwrap().modified().unwrap();
    let initramfs = std::fs::metadata(output.join("initramfs.cpio"))
        .unwrap()
        .modified()
        .unwrap();

    let again = rootfs(&args);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("up to date"), "{stderr}");
    assert!(
        stderr.contains(image["digest"].as_str().unwrap()),
        "{stderr}"
    );
    assert_eq!(
        std::fs::metadata(&manifest).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(
        std::fs::metadata(output.join("initramfs.cpio"))
            .unwrap()
            .modified()
            .unwrap(),
        initramfs
    );

    // Other options (a larger default size) are a rebuild from the same digest.
    let resized = rootfs(&[args.as_slice(), &["--size", "medium"]].concat());
    let stderr = String::from_utf8_lossy(&resized.stderr);
    assert!(resized.status.success(), "{stderr}");
    assert!(!stderr.contains("up to date"), "{stderr}");
    let shown: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(shown["default_size"], "medium");
    assert_eq!(shown["image_source"]["manifest_digest"], image["digest"]);

    // The tag moved: --refresh finds the new digest and rebuilds.
    let moved = layout.image(&[busybox_layer("moved\n")], run_config(), "amd64", true);
    registry.push(layout.tag(moved.clone(), "v1"), "v1", "test/rebuild");
    let pinned = rootfs(&[args.as_slice(), &["--size", "medium"]].concat());
    assert!(String::from_utf8_lossy(&pinned.stderr).contains("up to date"));
    let refreshed = rootfs(&[args.as_slice(), &["--size", "medium", "--refresh"]].concat());
    let stderr = String::from_utf8_lossy(&refreshed.stderr);
    assert!(refreshed.status.success(), "{stderr}");
    assert!(!stderr.contains("up to date"), "{stderr}");
    let shown: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(shown["image_source"]["manifest_digest"], moved["digest"]);
}

fn sandbox_rootfs_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The service and issuer the registry expects in a token.
const TOKEN_SERVICE: &str = "test-registry";
const TOKEN_ISSUER: &str = "test-token-issuer";

/// A token server as docker's distribution trusts one (`auth: token:`): `GET
/// /token?service=…&scope=repository:NAME:ACTIONS` with Basic credentials answers a
/// JWT (ES256, its signing certificate in `x5c`, the certificate in the registry's
/// `rootcertbundle`) granting the scopes asked; wrong or no credentials get 401.
/// Returns its realm URL and the PEM certificate to trust.
fn token_server() -> (String, String) {
    use std::io::{BufRead as _, BufReader, Write as _};
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["token-issuer".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_pem = cert.pem();
    let cert_der = cert.der().to_vec();
    let rng = ring::rand::SystemRandom::new();
    let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &key.serialize_der(),
        &rng,
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let realm = format!("http://{}/token", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let mut authorized = false;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                if let Some(value) = header
                    .split_once(':')
                    .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
                    .map(|(_, value)| value.trim())
                {
                    authorized = value
                        == format!(
                            "Basic {}",
                            base64_encode(format!("{USER}:{PASSWORD}").as_bytes())
                        );
                }
            }
            let answer = if authorized {
                let target = request.split_whitespace().nth(1).unwrap_or("");
                let query = target.split_once('?').map_or("", |(_, q)| q);
                let access: Vec<Value> = query
                    .split('&')
                    .filter_map(|pair| pair.strip_prefix("scope="))
                    .map(|scope| scope.replace("%3A", ":").replace("%2C", ",").replace("%2F", "/"))
                    .filter_map(|scope| {
                        let mut parts = scope.splitn(3, ':');
                        let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
                        Some(json!({"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
                    })
                    .collect();
                let token = jwt(&signer, &rng, &cert_der, access);
                let body =
                    json!({"token": token, "access_token": token, "expires_in": 300}).to_string();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            };
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (realm, cert_pem)
}

/// A JWT granting `access`, signed ES256 with `signer`, whose certificate is `cert_der`.
fn jwt(
    signer: &ring::signature::EcdsaKeyPair,
    rng: &ring::rand::SystemRandom,
    cert_der: &[u8],
    access: Vec<Value>,
) -> String {
    use base64::Engine as _;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = json!({"alg": "ES256", "typ": "JWT", "x5c": [base64_encode(cert_der)]});
    let claims = json!({
        "iss": TOKEN_ISSUER, "sub": USER, "aud": TOKEN_SERVICE,
        "exp": now + 300, "nbf": now - 10, "iat": now - 10,
        "jti": format!("{now}-{}", std::process::id()), "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        url.encode(header.to_string()),
        url.encode(claims.to_string())
    );
    let signature = signer.sign(rng, signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", url.encode(signature.as_ref()))
}

#[test]
fn a_registry_behind_a_bearer_token_server_is_pulled_with_its_token() {
    let (realm, cert) = token_server();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("token-issuer.pem");
    std::fs::write(&bundle, cert).unwrap();
    let auth = format!(
        "{{ token: {{ realm: \"{realm}\", service: {TOKEN_SERVICE}, issuer: {TOKEN_ISSUER}, \
         rootcertbundle: {} }} }}",
        bundle.display()
    );
    let registry = Registry::start_with(dir, &auth);
    let mut layout = OciLayout::new();
    let image = layout.image(
        &[busybox_layer("behind a token\n")],
        run_config(),
        "amd64",
        true,
    );
    // skopeo pushes through the token server too (Basic to the realm, then Bearer).
    registry.push(layout.tag(image.clone(), "v1"), "v1", "test/token");

    let cache = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let pulled = registry::pull(
        &registry.image("test/token:v1"),
        &registry.options(),
        cache.path(),
        staging.path(),
    )
    .unwrap_or_else(|error| panic!("{}", sandbox_rootfs_chain(&error)));
    assert_eq!(pulled.source.manifest_digest, image["digest"]);
    assert_eq!(
        std::fs::read_to_string(staging.path().join("etc/marker")).unwrap(),
        "behind a token\n"
    );

    // The token server refuses wrong credentials: the pull says so.
    let mut wrong = registry.options();
    wrong.auth.explicit = Some(BasicAuth {
        user: USER.into(),
        password: "wrong".into(),
    });
    let error = pull(
        &registry.image("test/token:v1"),
        &wrong,
        tempfile::tempdir().unwrap().path(),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            RegistryError::Unauthorized {
                anonymous: false,
                ..
            }
        ),
        "{}",
        sandbox_rootfs_chain(&error)
    );
}
