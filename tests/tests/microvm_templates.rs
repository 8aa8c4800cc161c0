//! Templates built by `sandbox-rootfs` from other bases, booted in real microVMs: one
//! from a directory, one from a `docker save` image tarball whose second layer
//! deletes (whiteout) and replaces files of the first, and one from an OCI layout
//! whose config's `Env`, `WorkingDir` and `User` become every process's defaults,
//! and one pulled from a real registry on loopback (`--base oci://…`, the builder's
//! registry harness), whose config does the same.
//! Each of these builds its template into a folder of its own, boots it once, checks
//! it through the agent, and removes the template. (The `python` template that
//! `scripts/test.sh` builds is booted by a target of its own, `microvm_python`.)
//!
//! Needs what `sandbox_tests::vm` needs, plus the host's static busybox (Debian's
//! `busybox-static`, which the default template uses too), and for the registry test
//! `docker-registry`, `skopeo` and `htpasswd` (`scripts/setup.sh` installs them);
//! `SANDBOX_SKIP_VM_TESTS=1`
//! marks them ignored (this target runs on `libtest-mimic`).

// Helpers unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sandbox_protocol::{ExecRequest, FileKind, ImageConfig, User};
use sandbox_tests::suite::{block_on, vm_main, VmTest};
use sandbox_tests::vm::{build_template, build_template_with, TestVm, VmHost};
use sandbox_tests::{exec_sh, sh, TempDir};
use sandbox_vmm::client::Client;
use sandbox_vmm::launcher::{Template, TemplateRef};
use sha2::{Digest, Sha256};

/// A registry on loopback and OCI layouts to push to it, shared with the builder's
/// own registry tests.
#[path = "../../rootfs/tests/support/registry.rs"]
mod registry;

/// The static busybox every test base is made of.
const BUSYBOX: &str = "/bin/busybox";

/// The applets the test bases link; nothing else is in their `/bin`.
const APPLETS: [&str; 4] = ["sh", "cat", "env", "id"];

fn busybox() -> Vec<u8> {
    std::fs::read(BUSYBOX).unwrap_or_else(|e| {
        panic!(
            "cannot read {BUSYBOX} ({e}): install busybox-static (scripts/setup.sh does), \
             or set SANDBOX_SKIP_VM_TESTS=1 to skip the microVM tests"
        )
    })
}

/// Names in a guest directory.
async fn names(client: &Client, dir: &str) -> BTreeSet<String> {
    client
        .list_dir(dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

/// Boots the template at `dir` and checks that it is the one built: its name, and a
/// `/bin` holding only what the test base put there.
async fn boot_and_check(host: &VmHost, dir: &Path, name: &str) -> TestVm {
    let template = Template::load(dir).unwrap();
    assert_eq!(template.name, name);
    let vm = host.boot(TemplateRef::Path(dir.to_owned())).await;
    assert_eq!(vm.vm().record().template, name);
    let bin = names(vm.client(), "/bin").await;
    let expected: BTreeSet<String> = std::iter::once("busybox")
        .chain(APPLETS)
        .map(str::to_owned)
        .collect();
    assert_eq!(bin, expected, "/bin is not the test base's");
    vm
}

fn remove_template(dir: PathBuf) {
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!dir.exists());
}

fn main() -> std::process::ExitCode {
    vm_main(&[
        VmTest {
            name: "a_template_built_from_a_directory_on_a_root_disk_boots_with_its_files",
            run: || {
                block_on(a_template_built_from_a_directory_on_a_root_disk_boots_with_its_files())
            },
        },
        VmTest {
            name: "a_template_built_from_an_image_tarball_honours_whiteouts",
            run: || block_on(a_template_built_from_an_image_tarball_honours_whiteouts()),
        },
        VmTest {
            name: "an_oci_image_config_sets_every_processs_env_cwd_and_user",
            run: || block_on(an_oci_image_config_sets_every_processs_env_cwd_and_user()),
        },
        VmTest {
            name: "a_template_pulled_from_a_registry_boots_with_its_env_cwd_and_user",
            run: || block_on(a_template_pulled_from_a_registry_boots_with_its_env_cwd_and_user()),
        },
    ])
}

async fn a_template_built_from_a_directory_on_a_root_disk_boots_with_its_files() {
    let host = VmHost::get("microvm_templates::directory").expect("run only with the gate open");
    let scratch = TempDir::new("tpl-dir");
    let base = scratch.path().join("base");
    std::fs::create_dir_all(base.join("bin")).unwrap();
    std::fs::create_dir_all(base.join("etc")).unwrap();
    std::fs::write(base.join("bin/busybox"), busybox()).unwrap();
    std::fs::set_permissions(
        base.join("bin/busybox"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", base.join("bin").join(applet)).unwrap();
    }
    let marker = format!("from a directory, test {}\n", std::process::id());
    std::fs::write(base.join("etc/marker"), &marker).unwrap();

    let name = format!("e2e-dir-{}", std::process::id());
    // On an ext4 root disk: the initramfs agent loads virtio_blk, mounts the disk and
    // switches root into it, where the agent on the disk takes over as PID 1.
    let built = build_template_with(
        &name,
        &format!("dir:{}", base.display()),
        &scratch.path().join("template"),
        &["--layout", "disk", "--disk-free-mib", "64"],
    );
    let dir = built.dir;
    let vm = boot_and_check(&host, &dir, &name).await;
    let client = vm.client();
    assert_eq!(sh(client, "cat /etc/marker").await, marker);
    assert_eq!(
        client.read_file("/etc/marker").await.unwrap(),
        marker.as_bytes()
    );
    let mounts = sh(client, "cat /proc/mounts").await;
    assert!(
        mounts.lines().any(|l| l.starts_with("/dev/vda / ext4 ")),
        "the root is not the ext4 disk:\n{mounts}"
    );
    assert!(
        client.info().await.unwrap().is_init,
        "the disk's agent is not init"
    );
    // What the builder adds on top of any base.
    let root = names(client, "/").await;
    for needed in ["dev", "proc", "sys", "tmp", "root", "init"] {
        assert!(root.contains(needed), "/{needed} missing: {root:?}");
    }
    vm.shutdown().await;
    a_vm_killed_while_put_replaces_a_file_leaves_the_old_or_the_new_one(&host, &dir, &scratch)
        .await;
    remove_template(dir);
}

/// Bytes that differ with `seed` and position, so a torn mix of two versions shows.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let [low, _, high, ..] = i.to_le_bytes();
            low.wrapping_mul(31).wrapping_add(seed) ^ high
        })
        .collect()
}

/// On a disk that outlives its VM (a persistent overlay): a put replacing a file is
/// cut by killing QEMU outright at several points; after a reboot from the same disk
/// the file holds the old content or the new one, never a mix or a truncation.
async fn a_vm_killed_while_put_replaces_a_file_leaves_the_old_or_the_new_one(
    host: &VmHost,
    template: &Path,
    scratch: &TempDir,
) {
    use sandbox_vmm::launcher::BootSpec;
    const MIB: usize = 1024 * 1024;
    let disk = scratch.path().join("persistent.qcow2");
    let spec = || BootSpec {
        persistent_disk: Some(disk.clone()),
        ..BootSpec::new(TemplateRef::Path(template.to_owned()))
    };
    let old = pattern(1, 8 * MIB);
    let new = pattern(2, 24 * MIB);
    let vm = host.boot_spec(spec()).await;
    vm.client().put("/root/data", None, &old[..]).await.unwrap();
    sh(vm.client(), "sync").await;
    vm.shutdown().await;

    // Cut while the data streams in, and (last) at once after the put returned: the
    // new content must then have been made durable, rename included.
    for cut_after_ms in [50u64, 300, 800, u64::MAX] {
        let vm = host.boot_spec(spec()).await;
        let client = vm.client().clone();
        let data = new.clone();
        let put = tokio::spawn(async move { client.put("/root/data", None, &data[..]).await });
        if cut_after_ms == u64::MAX {
            while !put.is_finished() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(cut_after_ms)).await;
        }
        let qemu = vm.vm().qemu_pid().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(qemu).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let finished = put.await.unwrap().is_ok();
        drop(vm);

        let vm = host.boot_spec(spec()).await;
        let mut now = Vec::new();
        vm.client().get("/root/data", &mut now).await.unwrap();
        let which = if now == old {
            "old"
        } else if now == new {
            "new"
        } else {
            panic!(
                "killed at {cut_after_ms} ms: the file is neither the old nor the new one ({} bytes)",
                now.len()
            )
        };
        let when = if cut_after_ms == u64::MAX {
            String::from("killed as the put returned")
        } else {
            format!("killed {cut_after_ms} ms into the put")
        };
        eprintln!(
            "{when} (the put {}): after a reboot the file is the {which} one",
            if finished { "had finished" } else { "was cut" },
        );
        if finished {
            assert_eq!(which, "new", "a put that returned was lost by a crash");
        }
        vm.shutdown().await;
    }
}

/// A `docker save` tarball: `manifest.json`, a config, and one `layer.tar` per layer.
fn docker_save(path: &Path, layers: &[Vec<u8>]) {
    let mut outer = tar::Builder::new(std::fs::File::create(path).unwrap());
    let names: Vec<String> = (0..layers.len())
        .map(|i| format!("{i:064x}/layer.tar"))
        .collect();
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": ["sandbox-e2e:latest"],
        "Layers": names,
    }]);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": []},
    });
    append_file(
        &mut outer,
        "config.json",
        config.to_string().as_bytes(),
        0o644,
    );
    for (name, layer) in names.iter().zip(layers) {
        append_file(&mut outer, name, layer, 0o644);
    }
    append_file(
        &mut outer,
        "manifest.json",
        manifest.to_string().as_bytes(),
        0o644,
    );
    outer.into_inner().unwrap();
}

/// A header with every numeric field set, as `docker save` writes them (an empty
/// uid field, say, is not a number and makes unpacking the entry fail).
fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header
}

fn append_file<W: std::io::Write>(tar: &mut tar::Builder<W>, path: &str, data: &[u8], mode: u32) {
    let mut header = header(tar::EntryType::Regular, data.len() as u64, mode);
    tar.append_data(&mut header, path, data).unwrap();
}

fn append_dir<W: std::io::Write>(tar: &mut tar::Builder<W>, path: &str) {
    let mut header = header(tar::EntryType::Directory, 0, 0o755);
    tar.append_data(&mut header, path, std::io::empty())
        .unwrap();
}

fn append_symlink<W: std::io::Write>(tar: &mut tar::Builder<W>, path: &str, target: &str) {
    let mut header = header(tar::EntryType::Symlink, 0, 0o777);
    tar.append_link(&mut header, path, target).unwrap();
}

async fn a_template_built_from_an_image_tarball_honours_whiteouts() {
    let host = VmHost::get("microvm_templates::image").expect("run only with the gate open");
    let scratch = TempDir::new("tpl-img");
    let marker = format!("from an image, test {}\n", std::process::id());

    // Layer 1: busybox, its links, the marker, and two files layer 2 changes.
    let mut lower = tar::Builder::new(Vec::new());
    append_dir(&mut lower, "bin/");
    append_dir(&mut lower, "etc/");
    append_file(&mut lower, "bin/busybox", &busybox(), 0o755);
    for applet in APPLETS {
        append_symlink(&mut lower, &format!("bin/{applet}"), "busybox");
    }
    append_file(&mut lower, "etc/marker", marker.as_bytes(), 0o644);
    append_file(&mut lower, "etc/doomed", b"deleted by layer 2\n", 0o644);
    append_file(&mut lower, "etc/replaced", b"layer 1\n", 0o644);
    // Layer 2: a whiteout for etc/doomed, and a new etc/replaced.
    let mut upper = tar::Builder::new(Vec::new());
    append_dir(&mut upper, "etc/");
    append_file(&mut upper, "etc/.wh.doomed", b"", 0o644);
    append_file(&mut upper, "etc/replaced", b"layer 2\n", 0o600);
    let image = scratch.path().join("image.tar");
    docker_save(
        &image,
        &[lower.into_inner().unwrap(), upper.into_inner().unwrap()],
    );

    let name = format!("e2e-image-{}", std::process::id());
    let built = build_template(
        &name,
        &format!("image:{}", image.display()),
        &scratch.path().join("template"),
    );
    // The builder carries on past an entry it cannot unpack; this image has none.
    let skipped: Vec<&str> = built
        .log
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("entry"))
        .collect();
    assert!(skipped.is_empty(), "image entries skipped: {skipped:#?}");
    let dir = built.dir;
    let vm = boot_and_check(&host, &dir, &name).await;
    let client = vm.client();
    assert_eq!(sh(client, "cat /etc/marker").await, marker);
    let etc = names(client, "/etc").await;
    assert!(!etc.contains("doomed"), "the whiteout was ignored: {etc:?}");
    assert!(
        !etc.iter().any(|n| n.starts_with(".wh.")),
        "a whiteout entry reached the guest: {etc:?}"
    );
    let probe = "[ -e /etc/doomed ] && echo present || echo gone";
    assert_eq!(sh(client, probe).await, "gone\n");
    assert_eq!(
        client.read_file("/etc/replaced").await.unwrap(),
        b"layer 2\n"
    );
    // Modes come from the layers.
    let stat = client.stat("/etc/replaced").await.unwrap();
    assert_eq!((stat.kind, stat.mode), (FileKind::File, 0o600));
    let stat = client.stat("/bin/busybox").await.unwrap();
    assert_eq!((stat.kind, stat.mode), (FileKind::File, 0o755));
    vm.shutdown().await;
    remove_template(dir);
}

/// `sha256:HEX` of `data`, as OCI names blobs.
fn digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// An OCI image layout packed as a tar (what `skopeo copy … oci-archive:` writes):
/// `oci-layout`, `index.json`, and the manifest, config and layers as blobs.
fn oci_archive(path: &Path, layers: &[Vec<u8>], run_config: serde_json::Value) {
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": run_config,
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| digest(l)).collect::<Vec<_>>()},
    })
    .to_string();
    let descriptor = |media_type: &str, data: &[u8]| serde_json::json!({"mediaType": media_type, "digest": digest(data), "size": data.len()});
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config.as_bytes()),
        "layers": layers
            .iter()
            .map(|l| descriptor("application/vnd.oci.image.layer.v1.tar", l))
            .collect::<Vec<_>>(),
    })
    .to_string();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [descriptor("application/vnd.oci.image.manifest.v1+json", manifest.as_bytes())],
    });
    let mut outer = tar::Builder::new(std::fs::File::create(path).unwrap());
    append_file(
        &mut outer,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    );
    append_file(
        &mut outer,
        "index.json",
        index.to_string().as_bytes(),
        0o644,
    );
    let blobs = std::iter::once(manifest.into_bytes())
        .chain(std::iter::once(config.into_bytes()))
        .chain(layers.iter().cloned());
    append_dir(&mut outer, "blobs/");
    append_dir(&mut outer, "blobs/sha256/");
    for blob in blobs {
        let name = digest(&blob).replace(':', "/");
        append_file(&mut outer, &format!("blobs/{name}"), &blob, 0o644);
    }
    outer.into_inner().unwrap();
}

async fn an_oci_image_config_sets_every_processs_env_cwd_and_user() {
    let host = VmHost::get("microvm_templates::image_config").expect("run only with the gate open");
    let scratch = TempDir::new("tpl-oci");
    let mut layer = tar::Builder::new(Vec::new());
    append_dir(&mut layer, "bin/");
    append_file(&mut layer, "bin/busybox", &busybox(), 0o755);
    for applet in APPLETS {
        append_symlink(&mut layer, &format!("bin/{applet}"), "busybox");
    }
    // No /srv/app in the layers: the builder creates the WorkingDir, as Docker does.
    let image = scratch.path().join("image.tar");
    oci_archive(
        &image,
        &[layer.into_inner().unwrap()],
        serde_json::json!({
            "Env": ["PATH=/bin", "GREETING=hello from the image", "LANG=C"],
            "WorkingDir": "/srv/app",
            "User": "1000:1001",
            "Cmd": ["/bin/sh"],
        }),
    );
    let name = format!("e2e-oci-{}", std::process::id());
    let built = build_template_with(
        &name,
        &format!("image:{}", image.display()),
        &scratch.path().join("template"),
        &["--warm-session", "default:sh:cd /tmp"],
    );
    let dir = built.dir;
    // Recorded in the manifest, and in the image where the agent reads it.
    let recorded = Template::load(&dir).unwrap().image_config;
    assert_eq!(recorded.cwd.as_deref(), Some("/srv/app"));
    assert_eq!(recorded.user.as_deref(), Some("1000:1001"));
    assert_eq!(recorded.sessions.len(), 1);
    let vm = boot_and_check(&host, &dir, &name).await;
    let client = vm.client();
    let in_guest = client.read_file("/etc/sandbox/image.json").await.unwrap();
    assert_eq!(
        serde_json::from_slice::<ImageConfig>(&in_guest).unwrap(),
        recorded
    );

    let probe = "env; echo \"cwd=$(pwd) id=$(id -u):$(id -g)\"";
    let output = sh(client, probe).await;
    for line in [
        "PATH=/bin",
        "GREETING=hello from the image",
        "LANG=C",
        "cwd=/srv/app id=1000:1001",
    ] {
        assert!(
            output.lines().any(|l| l == line),
            "{line:?} missing:\n{output}"
        );
    }
    // What a request says wins.
    let reply = client
        .exec(ExecRequest {
            spec: sandbox_protocol::ProcessSpec {
                env: vec![("GREETING".into(), "from the request".into())],
                cwd: Some("/".into()),
                user: Some(User::Uid(0)),
                ..exec_sh(probe).spec
            },
            ..exec_sh(probe)
        })
        .await
        .unwrap();
    let output = String::from_utf8_lossy(&reply.stdout);
    for line in ["PATH=/bin", "GREETING=from the request", "cwd=/ id=0:0"] {
        assert!(
            output.lines().any(|l| l == line),
            "{line:?} missing:\n{output}"
        );
    }
    vm.shutdown().await;
    remove_template(dir);
}

async fn a_template_pulled_from_a_registry_boots_with_its_env_cwd_and_user() {
    let host = VmHost::get("microvm_templates::registry").expect("run only with the gate open");
    let registry = registry::Registry::start();
    let mut layer = registry::Layer::default().dir("bin/");
    layer.entry(
        tar::EntryType::Regular,
        "bin/busybox",
        "",
        &busybox(),
        0o755,
    );
    for applet in APPLETS {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    let mut layout = registry::OciLayout::new();
    let image = layout.image(
        &[layer.finish()],
        serde_json::json!({
            "Env": ["PATH=/bin", "GREETING=pulled from a registry"],
            "WorkingDir": "/srv/registry",
            "User": "1000:1001",
        }),
        "amd64",
        true,
    );
    registry.push(layout.tag(image, "v1"), "v1", "test/vm");

    let scratch = TempDir::new("tpl-registry");
    let name = format!("e2e-registry-{}", std::process::id());
    let base = format!("oci://{}/test/vm:v1", registry.host);
    let auth = format!("{}:{}", registry::USER, registry::PASSWORD);
    let built = build_template_with(
        &name,
        &base,
        &scratch.path().join("template"),
        &[
            "--insecure-registry",
            &registry.host,
            "--registry-auth",
            &auth,
            "--refresh",
        ],
    );
    let dir = built.dir;
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("template.json")).unwrap()).unwrap();
    assert_eq!(manifest["image_source"]["reference"], base.as_str());
    assert_eq!(
        manifest["image_source"]["manifest_digest"],
        registry.served_digest("test/vm:v1").as_str()
    );
    let vm = boot_and_check(&host, &dir, &name).await;
    let output = sh(vm.client(), "env; echo \"cwd=$(pwd) id=$(id -u):$(id -g)\"").await;
    for line in [
        "PATH=/bin",
        "GREETING=pulled from a registry",
        "cwd=/srv/registry id=1000:1001",
    ] {
        assert!(
            output.lines().any(|l| l == line),
            "{line:?} missing:\n{output}"
        );
    }
    vm.shutdown().await;
    remove_template(dir);
}
