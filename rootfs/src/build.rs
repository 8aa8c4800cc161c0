//! Building one template folder, start to finish.
//!
//! Everything happens in a work folder beside the destination
//! (`.<name>.build-<pid>`), which is renamed over the destination only when complete,
//! so a reader never sees a half-built template, and removed on any failure.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use sandbox_protocol::{ImageConfig, WarmSession};
use tracing::{info, warn};

use crate::agent::{self, AgentError, AgentSearch};
use crate::base::debian::DebianOptions;
use crate::base::registry::reference::ImageRef;
use crate::base::registry::{self, RegistryOptions};
use crate::base::{self, Base, BaseError, BaseTools};
use crate::cpio::{CpioError, CpioWriter};
use crate::disk::{self, DiskError};
use crate::guest::{self, GuestError};
use crate::image_config::{self, ImageConfigError};
use crate::kernel::{self, KernelError};
use crate::manifest::{now_rfc3339, ImageSource, ManifestError, TemplateManifest};
use crate::modules::{AGENT_MODULES, DISK_MODULES};
use crate::size::Size;
use crate::tree::{self, TreeError};

/// Kernel parameters every template boots with. `panic=-1` turns a guest panic into
/// a reboot, which the launcher (`-no-reboot`) sees as the VM ending.
pub const BASE_CMDLINE: &str = "console=ttyS0 quiet panic=-1";

/// The root disk as the guest sees it (the first virtio block device).
pub const GUEST_ROOT_DEVICE: &str = "/dev/vda";

/// Default cap for a base that goes into the initramfs.
pub const DEFAULT_INITRAMFS_MAX_BYTES: u64 = 64 << 20;

/// Default free space on a root disk.
pub const DEFAULT_DISK_FREE_BYTES: u64 = 1 << 30;

/// Where the kernel comes from.
#[derive(Debug, Clone)]
pub enum KernelSource {
    /// Debian's current cloud kernel, fetched into the cache.
    DebianCloud,
    /// A given image, with its `/lib/modules/<version>` folder if it has modules.
    Path {
        /// vmlinux or bzImage.
        image: PathBuf,
        /// Its modules folder.
        modules: Option<PathBuf>,
    },
}

/// Where the base goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Initramfs when the base is small enough, else a disk.
    Auto,
    /// Everything in the initramfs.
    Initramfs,
    /// The base on an ext4 disk; the initramfs holds the agent and modules.
    Disk,
}

/// Everything a build needs, validated by the caller.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Template name.
    pub name: String,
    /// The template folder to create or replace.
    pub output: PathBuf,
    /// Kernel downloads live in `<cache>/kernel`, bootstrapped Debian bases in
    /// `<cache>/debian`, registry blobs and tag pins in `<cache>/oci`.
    pub cache_dir: PathBuf,
    /// The base userland.
    pub base: Base,
    /// Host tools for the base.
    pub base_tools: BaseTools,
    /// Extra Debian packages (`debian` base only).
    pub packages: Vec<String>,
    /// Bootstrap a Debian base again even when a cached one matches.
    pub refresh_base: bool,
    /// How a registry base is pulled (`oci/` in the cache).
    pub registry: RegistryOptions,
    /// The kernel.
    pub kernel: KernelSource,
    /// The agent binary, or `None` to find or build it.
    pub agent: Option<PathBuf>,
    /// Where to find the workspace when `agent` is `None`.
    pub agent_search: AgentSearch,
    /// Recorded in the manifest.
    pub agent_version: String,
    /// Recorded in the manifest.
    pub default_size: Size,
    /// Initramfs or disk.
    pub layout: Layout,
    /// [`Layout::Auto`] threshold.
    pub initramfs_max_bytes: u64,
    /// Free space on a disk.
    pub disk_free_bytes: u64,
    /// Extra kernel parameters.
    pub extra_cmdline: Vec<String>,
    /// Interpreter sessions the agent starts at boot.
    pub warm_sessions: Vec<WarmSession>,
}

/// A build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Getting the kernel failed.
    #[error("Kernel")]
    Kernel(#[from] KernelError),
    /// Finding the agent failed.
    #[error("Agent")]
    Agent(#[from] AgentError),
    /// Assembling the base failed.
    #[error("Base")]
    Base(#[from] BaseError),
    /// Adding the agent, folders or modules failed.
    #[error("Guest files")]
    Guest(#[from] GuestError),
    /// Writing the agent's defaults into the image failed.
    #[error("Image config")]
    ImageConfig(#[from] ImageConfigError),
    /// A file operation failed.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// Writing the initramfs failed.
    #[error("Initramfs")]
    Cpio(#[from] CpioError),
    /// Making the disk failed.
    #[error("Root disk")]
    Disk(#[from] DiskError),
    /// Writing the manifest failed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The template name cannot be a folder name.
    #[error("Invalid template name {0:?}: use letters, digits, '-', '_' and '.'")]
    InvalidName(String),
    /// The base does not fit the initramfs that was asked for.
    #[error("The base is {bytes} bytes; more than the initramfs limit of {max} bytes")]
    TooLargeForInitramfs {
        /// Base size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
}

/// Removes the work folder however the build ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(error) = tree::remove_path(&self.0) {
            warn!(%error, "work folder not removed");
        }
    }
}

/// True for names usable as a template folder.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What [`build_template`] did.
#[derive(Debug, Clone)]
pub struct Built {
    /// The template's manifest.
    pub manifest: TemplateManifest,
    /// True when the template already held this image at the same manifest digest,
    /// built with the same options: nothing was rewritten.
    pub reused: bool,
}

/// Builds the template described by `opts` and returns its manifest.
pub fn build(opts: &BuildOptions) -> Result<TemplateManifest, BuildError> {
    build_template(opts).map(|built| built.manifest)
}

/// Builds the template described by `opts`, unless it is a registry image the
/// template already holds: the same manifest digest, built with the same options
/// ([`options_digest`]), is a cache hit that touches no file.
pub fn build_template(opts: &BuildOptions) -> Result<Built, BuildError> {
    if !valid_name(&opts.name) {
        return Err(BuildError::InvalidName(opts.name.clone()));
    }
    let options = options_digest(opts);
    if let Base::Registry(image) = &opts.base {
        if let Some(manifest) = up_to_date(opts, image, &options)? {
            return Ok(Built {
                manifest,
                reused: true,
            });
        }
    }
    let manifest = build_fresh(opts, options)?;
    Ok(Built {
        manifest,
        reused: false,
    })
}

/// A digest of everything in `opts` that shapes the template besides the base's
/// bytes: recorded with a registry image ([`ImageSource::build_options`]) so that a
/// rebuild with other options is not mistaken for a cache hit.
pub fn options_digest(opts: &BuildOptions) -> String {
    let shape = format!(
        "kernel={:?}\nagent={:?}\nagent_version={}\nsize={}\nlayout={:?}\n\
         initramfs_max={}\ndisk_free={}\ncmdline={:?}\nsessions={:?}\nmax_image={}",
        opts.kernel,
        opts.agent,
        opts.agent_version,
        opts.default_size,
        opts.layout,
        opts.initramfs_max_bytes,
        opts.disk_free_bytes,
        opts.extra_cmdline,
        opts.warm_sessions,
        opts.registry.max_bytes,
    );
    crate::base::registry::store::sha256_digest(shape.as_bytes())
}

/// The template at `opts.output` when it holds `image` at the digest the reference
/// resolves to now, built with `options`, its files all there; else `None`.
fn up_to_date(
    opts: &BuildOptions,
    image: &ImageRef,
    options: &str,
) -> Result<Option<TemplateManifest>, BuildError> {
    let Ok(existing) = TemplateManifest::load(&opts.output) else {
        return Ok(None);
    };
    let Some(source) = &existing.image_source else {
        return Ok(None);
    };
    let files = [
        Some(&existing.kernel),
        Some(&existing.initramfs),
        existing.disk.as_ref(),
    ];
    let complete = files
        .into_iter()
        .flatten()
        .all(|file| TemplateManifest::resolve(&opts.output, file).is_file());
    if source.reference != image.to_string()
        || source.build_options.as_deref() != Some(options)
        || existing.name != opts.name
        || !complete
    {
        return Ok(None);
    }
    let now = registry::resolve(image, &opts.registry, &opts.cache_dir)
        .map_err(|error| BuildError::Base(BaseError::Registry(error)))?;
    if now.manifest_digest != source.manifest_digest {
        info!(old = %source.manifest_digest, new = %now.manifest_digest,
            "the template was built from another manifest: rebuilding");
        return Ok(None);
    }
    info!(template = %opts.output.display(), digest = %now.manifest_digest,
        "cache hit: the template holds this manifest, built with the same options; nothing rewritten");
    Ok(Some(existing))
}

/// Builds the template from scratch.
fn build_fresh(opts: &BuildOptions, options: String) -> Result<TemplateManifest, BuildError> {
    let parent = opts
        .output
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    let debian = DebianOptions {
        packages: opts.packages.clone(),
        cache_dir: opts.cache_dir.join("debian"),
        refresh: opts.refresh_base,
    };
    // Before the slow steps: a mistake here should not cost a kernel download.
    base::check(&opts.base, &debian)?;
    image_config::check_sessions(&opts.warm_sessions)?;
    tree::make_dir(&parent, 0o755)?;
    let work = WorkDir(parent.join(format!(".{}.build-{}", opts.name, std::process::id())));
    tree::remove_path(&work.0)?;
    let staging = work.0.join("root");
    let out = work.0.join("template");
    tree::make_dir(&staging, 0o755)?;
    tree::make_dir(&out, 0o755)?;

    // The base first: a registry's refusal (credentials, a missing tag, another
    // platform) should not wait for a kernel download.
    info!(step = "1/5", base = ?opts.base, "base");
    let from_base = base::populate(
        &opts.base,
        &opts.base_tools,
        &debian,
        &opts.registry,
        &opts.cache_dir,
        &staging,
    )?;
    guest::add_essentials(&staging)?;
    // An image's config names no sessions: the builder's are the only ones.
    let image_config = ImageConfig {
        sessions: opts.warm_sessions.clone(),
        ..from_base.config
    };
    image_config::install(&staging, &image_config)?;
    let base_bytes = tree::tree_bytes(&staging)?;
    let use_disk = match opts.layout {
        Layout::Disk => true,
        Layout::Initramfs if base_bytes > opts.initramfs_max_bytes => {
            return Err(BuildError::TooLargeForInitramfs {
                bytes: base_bytes,
                max: opts.initramfs_max_bytes,
            })
        }
        Layout::Initramfs => false,
        Layout::Auto => base_bytes > opts.initramfs_max_bytes,
    };
    info!(
        base_mib = base_bytes >> 20,
        layout = if use_disk { "disk" } else { "initramfs" },
        "base assembled"
    );

    info!(step = "2/5", "kernel");
    let kernel = match &opts.kernel {
        KernelSource::DebianCloud => kernel::debian_cloud(&opts.cache_dir.join("kernel"))?,
        KernelSource::Path { image, modules } => kernel::user_kernel(image, modules.as_deref())?,
    };
    info!(version = %kernel.version, image = %kernel.image.display(), "kernel ready");

    info!(step = "3/5", "agent");
    let agent = agent::locate(opts.agent.as_deref(), &opts.agent_search)?;
    info!(agent = %agent.display(), "agent ready");

    info!(step = "4/5", "initramfs");
    // The initramfs tree: the whole base, or a fresh minimal one for stage one.
    let initrd_root = if use_disk {
        let root = work.0.join("initrd");
        tree::make_dir(&root, 0o755)?;
        guest::add_essentials(&root)?;
        guest::add_agent(&staging, &agent, "init")?;
        root
    } else {
        staging.clone()
    };
    guest::add_agent(&initrd_root, &agent, "init")?;
    match &kernel.modules_dir {
        Some(dir) => {
            let mut wanted: Vec<&str> = AGENT_MODULES.to_vec();
            if use_disk {
                wanted.extend(DISK_MODULES);
            }
            guest::add_modules(&initrd_root, dir, &kernel.version, &wanted)?;
        }
        None => warn!("no kernel modules folder: assuming virtio and vsock are built in"),
    }
    let initramfs_name = "initramfs.cpio";
    let initramfs_bytes = write_initramfs(&initrd_root, &out.join(initramfs_name))?;
    info!(mib = initramfs_bytes >> 20, "initramfs written");

    let disk = if use_disk {
        info!(step = "5/5", "root disk");
        let name = "rootfs.ext4";
        let size = disk::disk_bytes(base_bytes, opts.disk_free_bytes);
        disk::make_ext4(&staging, &out.join(name), size)?;
        Some(PathBuf::from(name))
    } else {
        info!(step = "5/5", "no root disk needed");
        None
    };

    let kernel_name = if kernel.is_elf { "vmlinux" } else { "vmlinuz" };
    fs::copy(&kernel.image, out.join(kernel_name)).map_err(|error| TreeError {
        op: "copy",
        path: kernel.image.clone(),
        error,
    })?;
    let mut cmdline = BASE_CMDLINE.to_owned();
    if disk.is_some() {
        cmdline.push_str(&format!(" sandbox.root={GUEST_ROOT_DEVICE}"));
    }
    for extra in &opts.extra_cmdline {
        cmdline.push(' ');
        cmdline.push_str(extra);
    }
    let manifest = TemplateManifest {
        snapshot: None,
        name: opts.name.clone(),
        kernel: PathBuf::from(kernel_name),
        initramfs: PathBuf::from(initramfs_name),
        disk,
        cmdline,
        kernel_version: kernel.version.clone(),
        agent_version: opts.agent_version.clone(),
        default_size: opts.default_size,
        created_at: now_rfc3339(),
        image_config,
        image_source: from_base.source.map(|source| ImageSource {
            build_options: Some(options),
            ..source
        }),
    };
    manifest.save(&out)?;
    replace_dir(&out, &opts.output, &work.0)?;
    info!(template = %opts.output.display(), "template ready");
    Ok(manifest)
}

/// Writes `root` as a newc archive with `/dev/console`; returns its size.
fn write_initramfs(root: &Path, path: &Path) -> Result<u64, BuildError> {
    let file = File::create(path).map_err(|error| TreeError {
        op: "create",
        path: path.to_owned(),
        error,
    })?;
    let mut writer = CpioWriter::new(BufWriter::new(file));
    writer.append_tree(root, "")?;
    // The kernel opens it as init's stdio; an unprivileged builder cannot mknod it.
    if fs::symlink_metadata(root.join("dev/console")).is_err() {
        writer.char_device("dev/console", 0o600, 5, 1)?;
    }
    let written = writer.written();
    writer.finish()?;
    Ok(written)
}

/// Moves `new` to `dest`, replacing (and then deleting) what was there.
fn replace_dir(new: &Path, dest: &Path, work: &Path) -> Result<(), TreeError> {
    let rename = |from: &Path, to: &Path| {
        fs::rename(from, to).map_err(|error| TreeError {
            op: "rename",
            path: from.to_owned(),
            error,
        })
    };
    if fs::symlink_metadata(dest).is_ok() {
        let old = work.join("old");
        rename(dest, &old)?;
        rename(new, dest)?;
    } else {
        rename(new, dest)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_names_are_plain_folder_names() {
        assert!(valid_name("default"));
        assert!(valid_name("py-3.12_slim"));
        assert!(!valid_name(""));
        assert!(!valid_name(".hidden"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(".."));
    }
}
