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
//! image tarball, or Debian) in a staging folder, plus essentials ([`guest`]) →
//! initramfs ([`cpio`]) with the modules [`modules`] resolves → an ext4 disk
//! ([`disk`]) when the base is too large for RAM → `template.json` ([`manifest`]).
//!
//! # Layout
//! - [`paths`] resolves `SANDBOX_HOME` and the templates folder (shared with the launcher).
//! - [`manifest`] reads and writes `template.json`; [`size`] is the VM size it records
//!   (shared with the launcher).
//! - [`cmd`] runs host tools, with errors that say what to install.
//! - [`tree`] copies, measures and writes into guest trees without leaving them.

pub mod agent;
pub mod base;
pub mod build;
pub mod cmd;
pub mod cpio;
pub mod disk;
pub mod guest;
pub mod kernel;
pub mod manifest;
pub mod modules;
pub mod paths;
pub mod size;
pub mod tree;

pub use build::{build, BuildError, BuildOptions, KernelSource, Layout};
pub use manifest::{TemplateManifest, MANIFEST_FILE};
pub use paths::{PathsError, SandboxHome, DEFAULT_TEMPLATE};
pub use size::{Size, SizeError};
