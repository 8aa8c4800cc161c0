//! `sandbox-rootfs`: command-line front end of the template builder.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use sandbox_protocol::WarmSession;
use sandbox_rootfs::agent::AgentSearch;
use sandbox_rootfs::base::registry::auth::{AuthSource, BasicAuth};
use sandbox_rootfs::base::registry::reference::ImageRef;
use sandbox_rootfs::base::registry::{Progress, ProgressSink, RegistryOptions};
use sandbox_rootfs::base::{Base, BaseTools};
use sandbox_rootfs::build::{
    build_template, Built, DEFAULT_DISK_FREE_BYTES, DEFAULT_INITRAMFS_MAX_BYTES,
};
use sandbox_rootfs::image_config::parse_warm_session;
use sandbox_rootfs::{
    BuildOptions, KernelSource, Layout, SandboxHome, Size, TemplateManifest, DEFAULT_TEMPLATE,
};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Build sandbox templates (kernel + initramfs + optional root disk)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build (or rebuild) a template.
    Build(Box<BuildArgs>),
    /// Print a template's manifest.
    Show {
        /// Template name.
        #[arg(default_value = DEFAULT_TEMPLATE)]
        name: String,
    },
    /// Print the templates folder.
    Path,
    /// Print an image reference as a template records it, the registry it is pulled
    /// from and the template name a claim by it gets, as one JSON object.
    Reference {
        /// oci://REGISTRY/REPO[:TAG|@sha256:DIGEST] or a short form (python:3.12-slim).
        reference: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProgressArg {
    /// Bytes per layer on a terminal; none in a pipe.
    Auto,
    /// One JSON object per line on stdout (`{"what","digest","done","total"}`), for
    /// a program that runs the builder and reports its progress.
    Json,
    /// None.
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LayoutArg {
    Auto,
    Initramfs,
    Disk,
}

#[derive(Debug, clap::Args)]
struct BuildArgs {
    /// Template name.
    #[arg(long, default_value = DEFAULT_TEMPLATE)]
    name: String,
    /// Template folder (default: $SANDBOX_HOME/templates/NAME).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Base: busybox, dir:PATH, image:PATH.tar (OCI or docker save), debian[:SUITE],
    /// or a registry image: oci://REGISTRY/REPO[:TAG|@sha256:DIGEST] or a short form
    /// such as python:3.12-slim (Docker Hub, as docker reads it).
    #[arg(long, default_value = "busybox")]
    base: Base,
    /// Credentials for the registry of an oci:// base (instead of docker's
    /// config.json).
    #[arg(
        long,
        value_name = "USER:PASSWORD",
        env = "SANDBOX_REGISTRY_AUTH",
        hide_env_values = true
    )]
    registry_auth: Option<BasicAuth>,
    /// A registry spoken to over plain HTTP (repeatable); all others only over HTTPS.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// Ask the registry where the tag points now, instead of using the digest an
    /// earlier pull pinned it to.
    #[arg(long)]
    refresh: bool,
    /// Largest registry image (MiB), its layers both as downloaded and as unpacked.
    #[arg(long, default_value_t = sandbox_rootfs::base::registry::DEFAULT_MAX_IMAGE_BYTES >> 20)]
    max_image_mib: u64,
    /// Download progress of a registry image.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,
    /// Debian packages to install on the debian base, comma-separated or repeated
    /// (e.g. python3,python3-pip); the bootstrap is cached by suite and packages.
    #[arg(long, value_name = "PACKAGE,...", value_delimiter = ',')]
    packages: Vec<String>,
    /// Bootstrap the debian base again instead of unpacking the cached one (to pick
    /// up Debian's updates).
    #[arg(long)]
    refresh_base: bool,
    /// Kernel image (vmlinux or bzImage) instead of Debian's cloud kernel.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// The kernel's /lib/modules/VERSION folder (with --kernel).
    #[arg(long, requires = "kernel")]
    modules: Option<PathBuf>,
    /// Static agent binary (default: the workspace's musl build in the `agent` profile, brought up to date with cargo).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Agent version recorded in template.json.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    agent_version: String,
    /// Static busybox for the busybox base.
    #[arg(long, default_value = sandbox_rootfs::base::busybox::DEFAULT_BUSYBOX)]
    busybox: PathBuf,
    /// Default VM size recorded in template.json: small, medium, large, xlarge,
    /// 2xlarge or VCPUSxMIB (checked now, not at the first boot).
    #[arg(long, default_value = "small")]
    size: Size,
    /// Where the base goes.
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Largest base (MiB) put in the initramfs with --layout auto.
    #[arg(long, default_value_t = DEFAULT_INITRAMFS_MAX_BYTES >> 20)]
    initramfs_max_mib: u64,
    /// Free space (MiB) on a root disk.
    #[arg(long, default_value_t = DEFAULT_DISK_FREE_BYTES >> 20)]
    disk_free_mib: u64,
    /// Extra kernel parameter (repeatable).
    #[arg(long = "cmdline", value_name = "PARAM")]
    extra_cmdline: Vec<String>,
    /// An interpreter session the agent starts at boot (repeatable): language python
    /// or sh; the setup code (everything after the second ':') runs once at start,
    /// e.g. `default:python:import json, os, sys`.
    #[arg(
        long = "warm-session",
        value_name = "NAME:LANGUAGE[:SETUP_CODE]",
        value_parser = parse_warm_session
    )]
    warm_sessions: Vec<WarmSession>,
}

fn main() -> ExitCode {
    // Colour only for a person at a terminal (and never with NO_COLOR): the same rule
    // clap applies to its own messages, so a log file gets no escape codes.
    let ansi = anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SANDBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbox-rootfs: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let home = SandboxHome::from_env()?;
    match cli.command {
        Cmd::Path => {
            println!("{}", home.templates().display());
            Ok(())
        }
        Cmd::Show { name } => {
            let manifest = TemplateManifest::load(&home.template(&name))?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
            Ok(())
        }
        Cmd::Reference { reference } => {
            let image: ImageRef = reference.parse()?;
            let described = serde_json::json!({
                "reference": image.to_string(),
                "registry": image.registry(),
                "host": image.host(),
                "template": image.template_name(),
            });
            println!("{described}");
            Ok(())
        }
        Cmd::Build(args) => {
            let opts = build_options(*args, &home)?;
            let Built { manifest, reused } = build_template(&opts)?;
            println!("{}", opts.output.display());
            if reused {
                let digest = manifest
                    .image_source
                    .as_ref()
                    .map_or("", |source| source.manifest_digest.as_str());
                eprintln!(
                    "template {} is up to date: already built from {digest} with the same \
                     options; nothing rewritten",
                    manifest.name
                );
                return Ok(());
            }
            eprintln!(
                "built template {} (kernel {}, {})",
                manifest.name,
                manifest.kernel_version,
                if manifest.disk.is_some() {
                    "root disk"
                } else {
                    "initramfs only"
                }
            );
            Ok(())
        }
    }
}

/// Arguments and environment → validated build options. The only place besides
/// `SandboxHome::from_env` that reads the environment.
fn build_options(args: BuildArgs, home: &SandboxHome) -> anyhow::Result<BuildOptions> {
    let mut start_dirs = Vec::new();
    if let Ok(dir) = std::env::current_dir() {
        start_dirs.push(dir);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from))
    {
        start_dirs.push(dir);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    let absolute = |path: PathBuf| -> anyhow::Result<PathBuf> {
        std::path::absolute(&path).with_context(|| format!("Cannot resolve {}", path.display()))
    };
    let kernel = match args.kernel {
        Some(image) => KernelSource::Path {
            image: absolute(image)?,
            modules: args.modules.map(absolute).transpose()?,
        },
        None => KernelSource::DebianCloud,
    };
    let output = match args.output {
        Some(path) => absolute(path)?,
        None => home.template(&args.name),
    };
    // Docker's own rule: $DOCKER_CONFIG/config.json, else ~/.docker/config.json.
    let docker_config = std::env::var_os("DOCKER_CONFIG")
        .map(|dir| PathBuf::from(dir).join("config.json"))
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker/config.json"))
        });
    let registry = RegistryOptions {
        auth: AuthSource {
            explicit: args.registry_auth,
            docker_config,
        },
        insecure: args.insecure_registries,
        refresh: args.refresh,
        max_bytes: args.max_image_mib.saturating_mul(1 << 20),
        progress: match args.progress {
            ProgressArg::Auto => std::io::stderr().is_terminal().then(terminal_progress),
            ProgressArg::Json => Some(json_progress()),
            ProgressArg::None => None,
        },
    };
    Ok(BuildOptions {
        name: args.name,
        output,
        cache_dir: home.cache(),
        base: args.base,
        registry,
        base_tools: BaseTools {
            busybox: args.busybox,
        },
        packages: args.packages,
        refresh_base: args.refresh_base,
        kernel,
        agent: args.agent.map(absolute).transpose()?,
        agent_search: AgentSearch {
            start_dirs,
            target_dir,
        },
        agent_version: args.agent_version,
        default_size: args.size,
        layout: match args.layout {
            LayoutArg::Auto => Layout::Auto,
            LayoutArg::Initramfs => Layout::Initramfs,
            LayoutArg::Disk => Layout::Disk,
        },
        initramfs_max_bytes: args.initramfs_max_mib << 20,
        disk_free_bytes: args.disk_free_mib << 20,
        extra_cmdline: args.extra_cmdline,
        warm_sessions: args.warm_sessions,
    })
}

/// Download progress for a program: one JSON line on stdout per report, at most one
/// per MiB of a blob besides its first and last.
fn json_progress() -> ProgressSink {
    let last = Mutex::new(0u64);
    ProgressSink(Arc::new(move |p: &Progress<'_>| {
        let Ok(mut last) = last.lock() else { return };
        let complete = p.done == p.total;
        if p.done != 0 && !complete && p.done < *last + (1 << 20) {
            return;
        }
        *last = if complete { 0 } else { p.done };
        let line = serde_json::json!({
            "what": p.what,
            "digest": p.digest,
            "done": p.done,
            "total": p.total,
        });
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }))
}

/// Download progress for a person at a terminal: one line per blob, redrawn at most
/// every 1 MiB, ended when the blob is complete. Pipes and logs get none (the build
/// logs each image's downloads and cache hits once).
fn terminal_progress() -> ProgressSink {
    let last = Mutex::new(0u64);
    ProgressSink(Arc::new(move |p: &Progress<'_>| {
        let Ok(mut last) = last.lock() else { return };
        let complete = p.done == p.total;
        if p.done != 0 && !complete && p.done < *last + (1 << 20) {
            return;
        }
        *last = if complete { 0 } else { p.done };
        let short = p.digest.get(..19).unwrap_or(p.digest);
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r  {} {short}  {:.1} / {:.1} MiB",
            p.what,
            mib(p.done),
            mib(p.total)
        );
        if complete {
            let _ = writeln!(err);
        }
    }))
}
