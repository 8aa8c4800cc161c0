//! `doctor`: what is present or missing to build templates and boot microVMs here,
//! each line with what to do about a missing piece.

use std::path::Path;
use std::process::Command;

use sandbox_vmm::launcher::{accel, Launcher, LauncherConfig, TemplateRef};

use crate::output;

/// One check: what, whether it is fine, and the detail or the remedy.
struct Check {
    what: &'static str,
    ok: bool,
    detail: String,
}

fn version_of(program: &Path, arg: &str) -> Option<String> {
    let output = Command::new(program).arg(arg).output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_owned();
    (output.status.success() || !line.is_empty()).then_some(line)
}

pub(crate) async fn doctor() -> anyhow::Result<u8> {
    let config = LauncherConfig::from_env()?;
    let mut checks = Vec::new();
    let program = |what, path: &Path, arg, remedy: &str| {
        let version = version_of(path, arg);
        Check {
            what,
            ok: version.is_some(),
            detail: version.unwrap_or_else(|| remedy.to_owned()),
        }
    };
    checks.push(program(
        "qemu",
        &config.qemu_path,
        "--version",
        "missing: apt-get install qemu-system-x86 (or set SANDBOX_QEMU)",
    ));
    checks.push(program(
        "qemu-img",
        &config.qemu_img_path,
        "--version",
        "missing: apt-get install qemu-utils (or set SANDBOX_QEMU_IMG)",
    ));
    checks.push(program(
        "vhost-device-vsock",
        &config.vhost_path,
        "--version",
        "missing: cargo install --locked vhost-device-vsock (or set SANDBOX_VHOST_VSOCK)",
    ));
    let musl = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("x86_64-unknown-linux-musl"))
        .unwrap_or(false);
    checks.push(Check {
        what: "musl target",
        ok: musl,
        detail: if musl {
            "x86_64-unknown-linux-musl installed".into()
        } else {
            "missing: rustup target add x86_64-unknown-linux-musl (to build the agent)".into()
        },
    });
    let launcher = Launcher::new(config.clone());
    let template = launcher.template(&TemplateRef::default());
    checks.push(Check {
        what: "default template",
        ok: template.is_ok(),
        detail: match &template {
            Ok(t) => format!("{} (kernel {})", t.dir.display(), t.kernel.display()),
            Err(error) => format!("{error:#}: build it with `sandbox-rootfs build`"),
        },
    });
    let kvm = accel::kvm_preflight(&config.kvm_device);
    checks.push(Check {
        what: "kvm preflight",
        ok: true,
        detail: match &kvm {
            Ok(()) => format!(
                "{} opens, API and capabilities fine",
                config.kvm_device.display()
            ),
            Err(error) => format!("unusable ({error}); TCG will be used"),
        },
    });
    if let Ok(template) = &template {
        let decision = launcher.accel_for(&template.kernel).await;
        checks.push(Check {
            what: "accelerator",
            ok: decision.is_ok(),
            detail: match decision {
                Ok(decision) => format!("{:?}: {}", decision.accel, decision.reason),
                Err(error) => format!("{error:#}"),
            },
        });
    }
    let mut all_ok = true;
    let mut report = String::new();
    for check in &checks {
        all_ok &= check.ok;
        report.push_str(&format!(
            "{:<4}{:<20}{}\n",
            if check.ok { "ok" } else { "--" },
            check.what,
            check.detail
        ));
    }
    output::print(&report)?;
    Ok(if all_ok { 0 } else { 1 })
}
