//! The QEMU command line and the guest kernel command line.
//!
//! The machine is QEMU's `microvm`: no PCI, no firmware, virtio-mmio devices described
//! by ACPI, and a PVH entry straight into an uncompressed `vmlinux`. Guest RAM is a
//! memfd with `share=on`, which vhost-user needs to map it into `vhost-device-vsock`
//! (without it the vsock device is silently dead). The serial console goes to a file;
//! QEMU's own output goes to the log the caller chose. `-no-reboot` turns a guest
//! reboot or panic into a QEMU exit, so a dead guest is never mistaken for a slow one.
//!
//! The CPU model is `host` under KVM and `max` under TCG (every feature TCG emulates)
//! rather than TCG's default `qemu64`, for two reasons: RDRAND lets the guest kernel
//! seed its RNG at once (with `qemu64` the agent's first `getrandom` blocked about a
//! second until the entropy pool filled, measured: boot-to-ready median 3.3 s → 2.3 s
//! on a loaded 2-core host), and userlands built for x86-64-v2 and later (SSE4.2,
//! POPCNT, AVX2) run.
//!
//! Pure functions only: building arguments needs no process and is unit-tested.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use super::accel::Accel;
use super::size::Size;

/// The chardev id of the vhost-user socket.
const VSOCK_CHARDEV: &str = "vsock0";
/// The chardev id of the agent's virtio-serial port.
const SERIAL_CHARDEV: &str = "agent0";
/// The name the guest finds the agent's port by (`sandbox.serial=` tells the agent).
pub const SERIAL_PORT_NAME: &str = "sandbox.agent";
/// The chardev id of the serial console.
const CONSOLE_CHARDEV: &str = "console0";
/// The block device id of the root disk overlay.
const DISK_ID: &str = "disk0";

/// Everything that varies between two QEMU invocations.
#[derive(Debug, Clone)]
pub(crate) struct QemuSpec<'a> {
    /// `-name`: how `ps` and the run-folder bookkeeping recognise this QEMU.
    pub name: &'a str,
    pub accel: Accel,
    pub size: Size,
    pub kernel: &'a Path,
    pub initramfs: Option<&'a Path>,
    /// The full kernel command line (see [`kernel_cmdline`]).
    pub cmdline: &'a str,
    /// The `vhost-device-vsock` control socket; `None` boots without vsock.
    pub vhost_socket: Option<&'a Path>,
    /// The socket QEMU listens on for the agent's virtio-serial port (the link);
    /// `None` boots without it.
    pub serial_socket: Option<&'a Path>,
    /// Guest RAM in this file instead of a memfd: `(path, shared)`. Shared RAM on a
    /// tmpfs is what checkpoints copy; a VM restored from a checkpoint maps the
    /// checkpoint's file private (copy-on-write).
    pub ram_file: Option<(&'a Path, bool)>,
    /// Wait for an incoming migration (`-incoming defer`) instead of booting.
    pub incoming: bool,
    /// QEMU's monitor (QMP) socket, for checkpoints and restores.
    pub qmp_socket: Option<&'a Path>,
    /// A qcow2 overlay attached as virtio-blk (`/dev/vda`).
    pub disk: Option<&'a Path>,
    /// Where the serial console is written.
    pub console_log: &'a Path,
    /// A socket QEMU serves the console on instead (the relay reads it into a
    /// bounded `console_log`): QEMU's own file chardev has no cap, and a guest
    /// writing to `/dev/ttyS0` grew it 7.2 MB in 10 s.
    pub console_socket: Option<&'a Path>,
}

/// The `-cpu` model. Under TCG, `max` without ERMS: with it the guest kernel copies
/// every buffer with `rep movsb`, which TCG runs a byte per iteration (a 20 MiB `get`
/// over the link took 1.3-1.5 s with it, 0.95-1.0 s without). The instruction still
/// works in a guest that booted with the flag (a checkpoint taken before).
pub(crate) fn cpu_model(accel: Accel) -> &'static str {
    match accel {
        Accel::Tcg => "max,erms=off",
        Accel::Kvm => "host",
    }
}

/// The arguments after the program name.
pub(crate) fn qemu_args(spec: &QemuSpec<'_>) -> Vec<OsString> {
    let mib = spec.size.memory_mib;
    let mut args = Args::default();
    args.push(["-name", spec.name]);
    let accel = spec.accel.to_string();
    args.push(["-accel", &accel, "-cpu", cpu_model(spec.accel)]);
    args.push(["-M", "microvm,memory-backend=mem,acpi=on"]);
    args.push(["-m".to_owned(), format!("{mib}M")]);
    match spec.ram_file {
        None => args.push([
            "-object".to_owned(),
            format!("memory-backend-memfd,id=mem,size={mib}M,share=on"),
        ]),
        Some((path, shared)) => {
            let share = if shared { "on" } else { "off" };
            args.push([
                OsString::from("-object"),
                option_with_path(
                    &format!("memory-backend-file,id=mem,size={mib}M,mem-path="),
                    path,
                    &format!(",share={share}"),
                ),
            ]);
        }
    }
    args.push(["-smp".to_owned(), spec.size.vcpus.to_string()]);
    args.push([OsStr::new("-kernel"), spec.kernel.as_os_str()]);
    if let Some(initramfs) = spec.initramfs {
        args.push([OsStr::new("-initrd"), initramfs.as_os_str()]);
    }
    args.push(["-append", spec.cmdline]);
    if let Some(socket) = spec.vhost_socket {
        args.push([
            OsString::from("-chardev"),
            option_with_path(&format!("socket,id={VSOCK_CHARDEV},path="), socket, ""),
        ]);
        args.push([
            "-device".to_owned(),
            format!("vhost-user-vsock-device,chardev={VSOCK_CHARDEV}"),
        ]);
    }
    if let Some(socket) = spec.serial_socket {
        args.push(["-device", "virtio-serial-device"]);
        args.push([
            OsString::from("-chardev"),
            option_with_path(
                &format!("socket,id={SERIAL_CHARDEV},path="),
                socket,
                ",server=on,wait=off",
            ),
        ]);
        args.push([
            "-device".to_owned(),
            format!("virtserialport,chardev={SERIAL_CHARDEV},name={SERIAL_PORT_NAME}"),
        ]);
    }
    if let Some(disk) = spec.disk {
        args.push([
            OsString::from("-drive"),
            option_with_path(
                "file=",
                disk,
                &format!(",if=none,id={DISK_ID},format=qcow2"),
            ),
        ]);
        args.push([
            "-device".to_owned(),
            format!("virtio-blk-device,drive={DISK_ID}"),
        ]);
    }
    args.push([
        OsString::from("-chardev"),
        match spec.console_socket {
            // Nobody connected: QEMU drops the output, the guest never blocks on it.
            Some(socket) => option_with_path(
                &format!("socket,id={CONSOLE_CHARDEV},path="),
                socket,
                ",server=on,wait=off",
            ),
            None => option_with_path(
                &format!("file,id={CONSOLE_CHARDEV},path="),
                spec.console_log,
                "",
            ),
        },
    ]);
    args.push(["-serial".to_owned(), format!("chardev:{CONSOLE_CHARDEV}")]);
    args.push(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    if let Some(socket) = spec.qmp_socket {
        args.push([
            OsString::from("-qmp"),
            option_with_path("unix:", socket, ",server=on,wait=off"),
        ]);
    }
    if spec.incoming {
        args.push(["-incoming", "defer"]);
    }
    args.0
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push<S: AsRef<OsStr>, const N: usize>(&mut self, parts: [S; N]) {
        self.0
            .extend(parts.iter().map(|p| p.as_ref().to_os_string()));
    }
}

/// `prefix`, then `path` with commas doubled (QEMU's escape inside `a=b,c=d`), then
/// `suffix`.
fn option_with_path(prefix: &str, path: &Path, suffix: &str) -> OsString {
    let mut bytes = prefix.as_bytes().to_vec();
    for &b in path.as_os_str().as_bytes() {
        bytes.push(b);
        if b == b',' {
            bytes.push(b',');
        }
    }
    bytes.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(bytes)
}

/// The guest kernel command line: the template's, then what the launcher needs unless
/// already set (`console=ttyS0` for the console log, `panic=-1` so a panic ends QEMU at
/// once, `tsc_early_khz` because microvm has no HPET or ACPI PM timer and TSC
/// calibration under TCG otherwise fails now and then, hanging the boot), then the
/// caller's `extra`. Arguments after a `--` (for init) stay after it.
pub fn kernel_cmdline(template: &str, extra: &str, tsc_khz: Option<u32>) -> String {
    let (template_kernel, template_init) = split_init_args(template);
    let (extra_kernel, extra_init) = split_init_args(extra);
    let has = |key: &str| {
        [template_kernel, extra_kernel]
            .iter()
            .flat_map(|s| s.split_whitespace())
            .any(|word| word.starts_with(key))
    };
    let mut kernel: Vec<String> = vec![template_kernel.to_owned()];
    if !has("console=") {
        kernel.push("console=ttyS0".into());
    }
    if !has("panic=") {
        kernel.push("panic=-1".into());
    }
    if let Some(khz) = tsc_khz.filter(|_| !has("tsc_early_khz=")) {
        kernel.push(format!("tsc_early_khz={khz}"));
    }
    kernel.push(extra_kernel.to_owned());
    let mut line = join_words(&kernel);
    let init = join_words(&[template_init.to_owned(), extra_init.to_owned()]);
    if !init.is_empty() {
        line.push_str(" -- ");
        line.push_str(&init);
    }
    line
}

/// Splits at the first standalone `--`: (kernel part, init part).
fn split_init_args(line: &str) -> (&str, &str) {
    let mut offset = 0;
    for word in line.split_inclusive(char::is_whitespace) {
        if word.trim_end() == "--" {
            return (&line[..offset], &line[offset + word.len()..]);
        }
        offset += word.len();
    }
    (line, "")
}

fn join_words(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host's TSC frequency in kHz: the guest's TSC runs at the host rate under both
/// TCG and KVM. From `tsc_freq_khz` where the kernel exports it, else `cpu MHz`.
pub fn host_tsc_khz() -> Option<u32> {
    if let Ok(text) = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/tsc_freq_khz") {
        if let Ok(khz) = text.trim().parse() {
            return Some(khz);
        }
    }
    parse_cpuinfo_khz(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// The first `cpu MHz : 2999.998` line as kHz (2999998), without floating point.
fn parse_cpuinfo_khz(cpuinfo: &str) -> Option<u32> {
    let value = cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split_once(':')?
        .1
        .trim();
    let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
    let mut khz: u32 = whole.parse::<u32>().ok()?.checked_mul(1000)?;
    let digits: String = frac.chars().chain("000".chars()).take(3).collect();
    khz = khz.checked_add(digits.parse::<u32>().ok()?)?;
    (khz > 0).then_some(khz)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn spec<'a>(accel: Accel) -> QemuSpec<'a> {
        QemuSpec {
            name: "sandbox-abc",
            accel,
            size: Size::MEDIUM,
            kernel: Path::new("/t/vmlinux"),
            initramfs: Some(Path::new("/t/initramfs.cpio")),
            cmdline: "console=ttyS0 quiet",
            vhost_socket: Some(Path::new("/run/abc/vhost.sock")),
            serial_socket: None,
            ram_file: None,
            incoming: false,
            qmp_socket: None,
            disk: None,
            console_log: Path::new("/run/abc/console.log"),
            console_socket: None,
        }
    }

    #[test]
    fn tcg_microvm_with_shared_memfd_vsock_and_console_file() {
        let args = strings(&qemu_args(&spec(Accel::Tcg)));
        let expected = [
            "-name",
            "sandbox-abc",
            "-accel",
            "tcg",
            "-cpu",
            "max,erms=off",
            "-M",
            "microvm,memory-backend=mem,acpi=on",
            "-m",
            "1024M",
            "-object",
            "memory-backend-memfd,id=mem,size=1024M,share=on",
            "-smp",
            "2",
            "-kernel",
            "/t/vmlinux",
            "-initrd",
            "/t/initramfs.cpio",
            "-append",
            "console=ttyS0 quiet",
            "-chardev",
            "socket,id=vsock0,path=/run/abc/vhost.sock",
            "-device",
            "vhost-user-vsock-device,chardev=vsock0",
            "-chardev",
            "file,id=console0,path=/run/abc/console.log",
            "-serial",
            "chardev:console0",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-no-reboot",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn a_serial_vm_has_file_ram_a_named_port_and_no_vsock() {
        let mut s = spec(Accel::Tcg);
        s.vhost_socket = None;
        s.serial_socket = Some(Path::new("/run/abc/serial.sock"));
        s.ram_file = Some((Path::new("/dev/shm/a,b.ram"), true));
        s.incoming = true;
        s.qmp_socket = Some(Path::new("/run/abc/qmp.sock"));
        let args = strings(&qemu_args(&s));
        let joined = args.join(" ");
        assert!(joined.contains(
            "-object memory-backend-file,id=mem,size=1024M,mem-path=/dev/shm/a,,b.ram,share=on"
        ));
        assert!(joined.contains(
            "-device virtio-serial-device -chardev socket,id=agent0,path=/run/abc/serial.sock,server=on,wait=off -device virtserialport,chardev=agent0,name=sandbox.agent"
        ));
        assert!(!joined.contains("vhost-user"));
        assert!(joined.ends_with(
            "-no-reboot -qmp unix:/run/abc/qmp.sock,server=on,wait=off -incoming defer"
        ));
        s.ram_file = Some((Path::new("/ckpt/ram"), false));
        assert!(strings(&qemu_args(&s)).contains(
            &"memory-backend-file,id=mem,size=1024M,mem-path=/ckpt/ram,share=off".to_owned()
        ));
    }

    #[test]
    fn kvm_uses_the_host_cpu() {
        let args = strings(&qemu_args(&spec(Accel::Kvm)));
        assert_eq!(args[2..6], ["-accel", "kvm", "-cpu", "host"]);
    }

    #[test]
    fn a_disk_overlay_becomes_a_virtio_blk_device_and_commas_are_escaped() {
        let mut s = spec(Accel::Tcg);
        s.disk = Some(Path::new("/run/a,b/overlay.qcow2"));
        s.vhost_socket = None;
        s.initramfs = None;
        let args = strings(&qemu_args(&s));
        let drive = args.iter().position(|a| a == "-drive").unwrap();
        assert_eq!(
            args[drive + 1],
            "file=/run/a,,b/overlay.qcow2,if=none,id=disk0,format=qcow2"
        );
        assert_eq!(
            args[drive + 2..drive + 4],
            ["-device", "virtio-blk-device,drive=disk0"]
        );
        assert!(!args.iter().any(|a| a.contains("vhost-user")));
        assert!(!args.iter().any(|a| a == "-initrd"));
    }

    #[test]
    fn cmdline_adds_what_is_missing_and_keeps_what_is_set() {
        assert_eq!(
            kernel_cmdline("quiet", "", Some(2_999_998)),
            "quiet console=ttyS0 panic=-1 tsc_early_khz=2999998"
        );
        assert_eq!(
            kernel_cmdline(
                "console=hvc0 panic=5 tsc_early_khz=1",
                "loglevel=7",
                Some(3)
            ),
            "console=hvc0 panic=5 tsc_early_khz=1 loglevel=7"
        );
        assert_eq!(kernel_cmdline("", "", None), "console=ttyS0 panic=-1");
    }

    #[test]
    fn cmdline_keeps_init_arguments_after_the_separator() {
        assert_eq!(
            kernel_cmdline("quiet -- --agent-port 1024", "debug -- --verbose", None),
            "quiet console=ttyS0 panic=-1 debug -- --agent-port 1024 --verbose"
        );
        // A `--` inside a word is not a separator.
        assert_eq!(
            kernel_cmdline("a--b", "", None),
            "a--b console=ttyS0 panic=-1"
        );
    }

    #[test]
    fn cpuinfo_mhz_becomes_khz_without_rounding_errors() {
        let info = "processor\t: 0\ncpu MHz\t\t: 2999.998\ncpu MHz\t\t: 1.0\n";
        assert_eq!(parse_cpuinfo_khz(info), Some(2_999_998));
        assert_eq!(parse_cpuinfo_khz("cpu MHz : 2100\n"), Some(2_100_000));
        assert_eq!(parse_cpuinfo_khz("cpu MHz : 1996.2494\n"), Some(1_996_249));
        assert_eq!(parse_cpuinfo_khz("model name : x\n"), None);
    }
}
