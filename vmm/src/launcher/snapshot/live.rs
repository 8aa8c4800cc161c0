//! Live capture: a checkpoint whose pause does not grow with the memory the guest
//! has used.
//!
//! The paused capture ([`super::capture`]) stops the VM, saves its device state and
//! copies the RAM file while it is stopped: about 0.5 ms per MiB in use under TCG, so
//! a guest with 4 GiB in use would stop for two seconds. Here QEMU's
//! `background-snapshot` stops the guest only to save its device state and to
//! write-protect its RAM with userfaultfd, then lets it run while every page goes,
//! once, into a *sink*: a second QEMU of the same machine started with `-S
//! -incoming`, whose RAM is a shared file on the RAM tmpfs ([`SinkImage`]). A page
//! the guest writes meanwhile faults in the host kernel and is sent before the write
//! lands, so the image is the guest's RAM at the stop, exactly, whatever the
//! accelerator (TCG's stores and KVM's both go through the host's page tables). The
//! sink never runs a vCPU. Once the stream has arrived, the sink saves its device
//! state with `x-ignore-shared` exactly as a paused capture saves the source's, and
//! its RAM file is copied sparsely into the checkpoint (or compared with its base,
//! see `diff`): children and wakes restore from it unchanged, mapping the image
//! copy-on-write. The sink's RAM was first a file in the checkpoint folder itself,
//! but every page the stream stored then went through the disk filesystem's
//! page-fault path: a live capture with 256 MiB dirtied took 2.2-2.7 s, most of it
//! there.
//!
//! Why not the alternatives (measured on this kind of host, QEMU 7.2 under TCG):
//! - QEMU's pre-copy migration into the same sink (built first): under TCG its dirty
//!   bitmap missed writes made through cached TLB entries (18-36 stale pages of
//!   131072 on a guest writing all along, enough to crash a child), and comparing
//!   the image with the stopped source to find them kept the pause at 250-420 ms.
//! - The host kernel's soft-dirty bits (track writes to the RAM file ourselves) are
//!   not built into every kernel (`CONFIG_MEM_SOFT_DIRTY`; not into this one).
//! - A reflink copy of the RAM file needs a filesystem with reflinks; tmpfs has none.
//!
//! What it costs: a second QEMU for the length of the call, room on the RAM tmpfs
//! for its image, and a call several times longer than a paused capture's (every
//! page crosses a socket once). QEMU 7.2 reads
//! every page before it protects RAM, and a read of a tmpfs hole allocates it: the
//! source's RAM file is then allocated whole ([`prepare`] allocates it up front, so
//! that happens while the guest runs). So `auto` captures live only once the guest
//! uses enough RAM for a paused copy to stop it noticeably.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::process::Command;

use super::SnapshotError;
use crate::launcher::process::{ChildProcess, Lifetime};
use crate::launcher::qemu::{qemu_args, QemuSpec};
use crate::launcher::qmp::{MigrationStatus, Qmp, QmpError, RunState};
use crate::launcher::start::MachineSpec;

/// The sink's files, in the source's run folder (short names: a Unix socket's path
/// has at most 107 bytes, and the run folder's path is already long).
const SINK_QMP: &str = "live-qmp.sock";
const SINK_INCOMING: &str = "live-in.sock";
const SINK_PORT: &str = "live-port.sock";
const SINK_DISK: &str = "live-disk.qcow2";
const SINK_LOG: &str = "live-qemu.log";
const SINK_CONSOLE: &str = "live-console.log";

/// How long the sink's monitor may take to answer (a QEMU start under TCG).
const SINK_QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the whole stream may take to load.
const STREAM_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the sink may take to exit after `quit`.
const SINK_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// No bandwidth cap: the stream stays on this host.
const MAX_BANDWIDTH: u64 = 64 << 30;

/// A QEMU waiting for a checkpoint's RAM, and its files.
pub(crate) struct Sink {
    qemu: ChildProcess,
    qmp: Qmp,
    incoming: PathBuf,
    /// Its RAM file, the image, on the RAM tmpfs.
    image: SinkImage,
    /// The sink's files in the run folder, removed when the sink goes (its QEMU,
    /// owned, is killed by its own drop).
    _files: SinkFiles,
}

/// The RAM image a sink filled, on the RAM tmpfs: removed on drop, once it has been
/// copied (or compared) into the checkpoint.
pub(crate) struct SinkImage(PathBuf);

impl SinkImage {
    /// Creates it, empty and owner-only (it will hold the guest's memory).
    pub(crate) fn create(path: PathBuf) -> Result<Self, SnapshotError> {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|error| write_error(&path, error))?;
        Ok(Self(path))
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SinkImage {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

impl Sink {
    /// Starts the sink for the VM in `run` (its machine `machine`), its RAM the
    /// shared file `image`, and makes it listen for the stream. `disk_size`: the
    /// virtual size of the VM's disk, if it has one (the sink gets a blank image of
    /// that size: migration carries no disk contents, and the source's images are
    /// locked by the source).
    pub(crate) async fn start(
        qemu_path: &Path,
        qemu_img_path: &Path,
        machine: &MachineSpec,
        run: &Path,
        image: SinkImage,
        disk_size: Option<u64>,
    ) -> Result<Self, SnapshotError> {
        let file = |name: &str| run.join(name);
        let mut scratch = vec![
            file(SINK_QMP),
            file(SINK_INCOMING),
            file(SINK_PORT),
            file(SINK_LOG),
            file(SINK_CONSOLE),
        ];
        for stale in &scratch {
            let _ = fs::remove_file(stale);
        }
        let disk = match disk_size {
            Some(size) => {
                let disk = file(SINK_DISK);
                let _ = fs::remove_file(&disk);
                blank_disk(qemu_img_path, &disk, size).await?;
                scratch.push(disk.clone());
                Some(disk)
            }
            None => None,
        };
        let qmp_socket = file(SINK_QMP);
        let port_socket = file(SINK_PORT);
        let console = file(SINK_CONSOLE);
        let spec = QemuSpec {
            name: "sandbox-capture",
            accel: machine.accel,
            size: machine.size,
            kernel: &machine.kernel,
            initramfs: machine.initramfs.as_deref(),
            cmdline: &machine.cmdline,
            vhost_socket: None,
            serial_socket: Some(&port_socket),
            ram_file: Some((image.path(), true)),
            incoming: true,
            qmp_socket: Some(&qmp_socket),
            disk: disk.as_deref(),
            console_log: &console,
            console_socket: None,
        };
        let log = fs::File::create(file(SINK_LOG)).map_err(|e| write_error(run, e))?;
        let log_err = log.try_clone().map_err(|e| write_error(run, e))?;
        let mut command = Command::new(qemu_path);
        // `-S`: the sink ends `paused` whatever the source was, and never runs.
        command
            .args(qemu_args(&spec))
            .arg("-S")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let qemu = ChildProcess::spawn("qemu", command, Lifetime::Owned)
            .await
            .map_err(|error| write_error(qemu_path, error))?;
        let files = SinkFiles(scratch);
        // A failed connect drops the QEMU (killed) and the files with it.
        let qmp = Qmp::connect(&qmp_socket, SINK_QMP_TIMEOUT)
            .await
            .map_err(qemu_error("start the capture QEMU"))?;
        let mut sink = Self {
            qemu,
            qmp,
            incoming: file(SINK_INCOMING),
            image,
            _files: files,
        };
        sink.listen().await?;
        Ok(sink)
    }

    async fn listen(&mut self) -> Result<(), SnapshotError> {
        self.qmp
            .set_migration_capabilities(&[("x-ignore-shared", false)])
            .await
            .map_err(qemu_error("set the capture QEMU's capabilities"))?;
        let uri = format!("unix:{}", self.incoming.display());
        self.qmp
            .migrate_incoming(&uri)
            .await
            .map_err(qemu_error("make the capture QEMU listen"))
    }

    /// Where the source sends its stream.
    pub(crate) fn uri(&self) -> String {
        format!("unix:{}", self.incoming.display())
    }

    /// Once the source's migration has completed: waits until the sink has loaded
    /// all of it (the sink then is `paused`, its RAM file the whole image).
    pub(crate) async fn wait_loaded(&mut self) -> Result<(), SnapshotError> {
        let loaded = self
            .qmp
            .wait_incoming(STREAM_TIMEOUT)
            .await
            .map_err(qemu_error("load the stream into the capture QEMU"))?;
        if matches!(loaded, RunState::Paused | RunState::Prelaunch) {
            Ok(())
        } else {
            Err(SnapshotError::Qemu {
                step: "load the stream into the capture QEMU",
                error: QmpError::MigrationFailed {
                    desc: format!("the capture QEMU ended the stream {loaded}, not paused"),
                },
            })
        }
    }

    /// Saves the loaded sink's device state (RAM stays in its file) to `state`, and
    /// ends the sink. Returns the state's size in bytes and the RAM image.
    pub(crate) async fn save(mut self, state: &Path) -> Result<(u64, SinkImage), SnapshotError> {
        self.qmp
            .set_migration_capabilities(&[("x-ignore-shared", true)])
            .await
            .map_err(qemu_error("set the capture QEMU's capabilities"))?;
        self.qmp
            .set_max_bandwidth(MAX_BANDWIDTH)
            .await
            .map_err(qemu_error("raise the capture QEMU's bandwidth"))?;
        let file = std::fs::File::create(state).map_err(|error| write_error(state, error))?;
        self.qmp
            .migrate_to_file(&file)
            .await
            .map_err(qemu_error("start saving the device state"))?;
        drop(file);
        let stats = self
            .qmp
            .wait_migration(STREAM_TIMEOUT)
            .await
            .map_err(qemu_error("save the device state"))?;
        if stats.status != MigrationStatus::Completed {
            return Err(write_error(
                state,
                std::io::Error::other(format!("the save ended {}", stats.status)),
            ));
        }
        let Self {
            mut qemu,
            qmp,
            image,
            _files,
            ..
        } = self;
        let _ = qmp.quit().await;
        match tokio::time::timeout(SINK_EXIT_TIMEOUT, qemu.wait()).await {
            Ok(Ok(_)) => {}
            _ => qemu.kill_and_reap(),
        }
        Ok((fs::metadata(state).map(|m| m.len()).unwrap_or(0), image))
    }
}

/// Removes the sink's files once the sink is gone.
struct SinkFiles(Vec<PathBuf>);

impl Drop for SinkFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

/// Sets the source up for a live capture, while the guest still runs. First the
/// capability: QEMU checks there that userfaultfd can write-protect this RAM (Linux
/// with `CONFIG_PTE_MARKER_UFFD_WP` for a shared file), and an error leaves the VM
/// and its RAM file as they were. Then every hole of the RAM file is allocated:
/// QEMU 7.2 reads every page before it protects RAM, and a read of a tmpfs hole
/// allocates it (done in the pause, that took ~230 ms for a 512 MiB guest); but only
/// if its filesystem has room for that and [`RAM_HEADROOM_BYTES`] more, so a capture
/// never fills the tmpfs that the other VMs' RAM lives on.
pub(crate) async fn prepare(source: &mut Qmp, source_ram: &Path) -> Result<(), SnapshotError> {
    source
        .set_migration_capabilities(&[
            ("x-ignore-shared", false),
            ("pause-before-switchover", false),
            ("background-snapshot", true),
        ])
        .await
        .map_err(qemu_error("turn on the background snapshot"))?;
    source
        .set_max_bandwidth(MAX_BANDWIDTH)
        .await
        .map_err(qemu_error("raise the migration bandwidth"))?;
    let ram = source_ram.to_owned();
    tokio::task::spawn_blocking(move || allocate_holes(&ram))
        .await
        .map_err(std::io::Error::other)
        .and_then(|allocated| allocated)
        .map_err(|error| write_error(source_ram, error))
}

/// What a live capture leaves free on the RAM files' filesystem, at least.
pub(crate) const RAM_HEADROOM_BYTES: u64 = 512 << 20;

/// Allocates every hole of a RAM file (`fallocate`, which keeps what is written),
/// if its filesystem keeps [`RAM_HEADROOM_BYTES`] free after that and after the
/// sink's image, which goes on the same tmpfs and is as large as the file at most.
fn allocate_holes(ram: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let file = fs::OpenOptions::new().write(true).open(ram)?;
    let meta = file.metadata()?;
    let len = meta.len();
    let holes = len.saturating_sub(meta.blocks().saturating_mul(512));
    let needed = holes.saturating_add(len);
    let stats = nix::sys::statvfs::fstatvfs(&file).map_err(std::io::Error::from)?;
    #[allow(clippy::useless_conversion)] // The field types differ between libcs.
    let free = u64::from(stats.blocks_available()).saturating_mul(u64::from(stats.fragment_size()));
    if free < needed.saturating_add(RAM_HEADROOM_BYTES) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!(
                "allocating the RAM file's holes and the capture's image ({} MiB) would leave less than {} MiB free on its filesystem ({} MiB free)",
                needed >> 20,
                RAM_HEADROOM_BYTES >> 20,
                free >> 20
            ),
        ));
    }
    let len = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    nix::fcntl::fallocate(
        file.as_raw_fd(),
        nix::fcntl::FallocateFlags::empty(),
        0,
        len,
    )
    .map_err(std::io::Error::from)
}

/// Starts the background snapshot of the (stopped) source into the sink: QEMU saves
/// the device state, write-protects RAM with userfaultfd and resumes the guest
/// itself, then sends every page once (a page the guest is about to write goes
/// first, and is written only once it has been sent).
pub(crate) async fn begin(source: &mut Qmp, sink: &Sink) -> Result<(), SnapshotError> {
    source
        .migrate(&sink.uri())
        .await
        .map_err(qemu_error("start the background snapshot"))
}

/// Puts the source's capabilities back for a later paused capture (whose migration
/// must carry no RAM: its stream goes to a file).
pub(crate) async fn reset_capabilities(source: &mut Qmp) {
    if let Err(error) = source
        .set_migration_capabilities(&[("background-snapshot", false)])
        .await
    {
        tracing::warn!(%error, "cannot reset the migration capabilities after a live capture");
    }
}

async fn blank_disk(qemu_img: &Path, disk: &Path, size: u64) -> Result<(), SnapshotError> {
    let mut command = Command::new(qemu_img);
    command
        .args(["create", "-q", "-f", "qcow2"])
        .arg(disk)
        .arg(size.to_string())
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(std::io::Error::other)
        .and_then(|output| output)
        .map_err(|error| write_error(disk, error))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(write_error(
            disk,
            std::io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        ))
    }
}

fn write_error(path: &Path, error: std::io::Error) -> SnapshotError {
    SnapshotError::Write {
        path: path.to_owned(),
        error,
    }
}

fn qemu_error(step: &'static str) -> impl Fn(QmpError) -> SnapshotError {
    move |error| SnapshotError::Qemu { step, error }
}
