//! `sandbox-rootfs`: builds the templates sandboxes boot from.
//!
//! A template is a folder (default `$SANDBOX_HOME/templates/<name>`, see [`paths`])
//! holding a kernel, an initramfs whose `/init` is the static agent, optionally an
//! ext4 root disk, and a `template.json` ([`TemplateManifest`]) that the launcher
//! reads to boot it.
//!
//! # Flow ([`build::build`])
//! kernel ([`kernel`]: Debian's cloud kernel or a given one) → agent ([`agent`]:
//! given, found in the workspace, or built) → base ([`base`]: busybox, a folder, an
//! image tarball, or Debian) in a staging folder, plus essentials ([`guest`]) and
//! the agent's defaults ([`image_config`]: an image's `Env`, `WorkingDir`, `User`,
//! sessions to warm) →
//! initramfs ([`cpio`]) with the modules [`modules`] resolves → an ext4 disk
//! ([`disk`]) when the base is too large for RAM → `template.json` ([`manifest`]).
//!
//! # Features
//! `builder` (default): everything that builds templates, and the `sandbox-rootfs`
//! binary. The launcher depends on this crate without it, for [`manifest`],
//! [`size`] and [`paths`] alone.
//!
//! # Layout
//! - [`paths`] resolves `SANDBOX_HOME` and the templates folder (shared with the launcher).
//! - [`manifest`] reads and writes `template.json`; [`size`] is the VM size it records
//!   (shared with the launcher).
//! - [`cmd`] runs host tools, with errors that say what to install.
//! - [`tree`] copies, measures and writes into guest trees without leaving them.

// The doc above names the builder's modules, which exist only with `builder`.
#![cfg_attr(not(feature = "builder"), allow(rustdoc::broken_intra_doc_links))]

// The builder, behind the default `builder` feature: the launcher needs only the
// modules after it, and without it links no tar or gzip code.
#[cfg(feature = "builder")]
pub mod agent;
#[cfg(feature = "builder")]
pub mod base;
#[cfg(feature = "builder")]
pub mod build;
#[cfg(feature = "builder")]
pub mod cmd;
#[cfg(feature = "builder")]
pub mod cpio;
#[cfg(feature = "builder")]
pub mod disk;
#[cfg(feature = "builder")]
pub mod guest;
#[cfg(feature = "builder")]
pub mod image_config;
#[cfg(feature = "builder")]
pub mod kernel;
#[cfg(feature = "builder")]
pub mod modules;
#[cfg(feature = "builder")]
pub mod tree;

pub mod manifest;
pub mod paths;
pub mod size;

#[cfg(feature = "builder")]
pub use build::{build, BuildError, BuildOptions, KernelSource, Layout};
pub use manifest::{TemplateManifest, MANIFEST_FILE};
pub use paths::{PathsError, SandboxHome, DEFAULT_TEMPLATE};
pub use size::{Size, SizeError};
