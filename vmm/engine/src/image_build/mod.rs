//! Templates from registry images at claim time: a claim whose template is an image
//! reference the node does not hold builds it once, when the operator allows that
//! registry, and then claims it like any template.
//!
//! # Flow ([`ImageBuilds::resolve`])
//! 1. [`is_reference`]: the claim's template is a reference when it starts with
//!    `oci://`, or holds a `:` or `@` (which no template name may hold) and names no
//!    template folder.
//! 2. [`builder::describe`]: the reference as a template records it, its registry and
//!    the template name it gets ([`builder::Described`]), from the builder itself
//!    (`sandbox-rootfs reference`), so the engine parses references with the same
//!    grammar the builder pulls with, and derives names by the same rule.
//! 3. Under a lock of that reference: the template, when it exists and records this
//!    reference (`image_source`), is the answer; so is it for a claim that waited
//!    while another built it. Otherwise the registry must be allowed
//!    ([`RegistryPolicy::allows`]), and [`builder::build`] runs
//!    `sandbox-rootfs build --name NAME --base REFERENCE`, reporting its progress.
//!    One build runs at a time on the node (a build downloads and writes up to the
//!    image size limit, and takes a core for minutes).
//!
//! # Why a process, not the builder's library
//! The engine links `sandbox-rootfs` without its `builder` feature (no tar, gzip or
//! registry client in the node daemon or the MCP server). A build is blocking work
//! of minutes on bytes from the network; in its own process a hostile image that
//! found a bug in the unpacker takes down a build, never the node, and dropping the
//! claim (a client that gave up) kills it. The refusal names that same command, so
//! an operator can run it by hand.

pub mod args;
pub mod builder;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_vmm::launcher::template::TEMPLATE_FILE;

use crate::util::lock;
use builder::Described;

pub use args::RegistryArgs;

/// The builder program when none is named: looked up beside the running program,
/// then on `PATH`.
pub const DEFAULT_BUILDER: &str = "sandbox-rootfs";

/// Which registries claims may build from, and how to reach them.
#[derive(Debug, Clone, Default)]
pub struct RegistryPolicy {
    /// `HOST[:PORT]`s (lowercase) a claim may build from; none by default.
    pub allow: Vec<String>,
    /// `HOST:PORT`s spoken to in plain HTTP, passed on to the builder.
    pub insecure: Vec<String>,
    /// The `sandbox-rootfs` program.
    pub builder: PathBuf,
}

impl RegistryPolicy {
    /// Whether a claim may build `image`: its registry as written (`docker.io`) or
    /// as dialled (`index.docker.io`) is allowed.
    pub fn allows(&self, image: &Described) -> bool {
        self.allow.iter().any(|allowed| {
            allowed.eq_ignore_ascii_case(&image.registry)
                || allowed.eq_ignore_ascii_case(&image.host)
        })
    }

    /// The command that builds `image` by hand, as a refusal names it.
    pub fn build_command(&self, image: &Described) -> String {
        let mut command = format!(
            "sandbox-rootfs build --name {} --base {}",
            image.template, image.reference
        );
        if self
            .insecure
            .iter()
            .any(|host| host.eq_ignore_ascii_case(&image.host))
        {
            command.push_str(&format!(" --insecure-registry {}", image.host));
        }
        command
    }
}

/// Where a claim-time build reports what it is doing (an MCP progress message, a
/// log line): one short line at a time.
#[derive(Clone)]
pub struct BuildProgress(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for BuildProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BuildProgress")
    }
}

impl BuildProgress {
    /// Reports `line`.
    pub fn report(&self, line: &str) {
        (self.0)(line);
    }
}

/// A claim's image reference could not become a template.
#[derive(Debug, thiserror::Error)]
pub enum ImageBuildError {
    /// The text is not an image reference.
    #[error("{text:?} is not an image reference: {reason}")]
    Reference {
        /// The claim's template.
        text: String,
        /// The builder's words.
        reason: String,
    },
    /// The operator allows no builds from this registry.
    #[error("The node holds no template of {reference} and does not build from {host} (--allow-registry); build it with: {command}")]
    NotAllowed {
        /// The reference, fully qualified.
        reference: String,
        /// Its registry.
        host: String,
        /// The command that builds it.
        command: String,
    },
    /// The build failed.
    #[error("Building {reference} failed ({command}): {log}")]
    Build {
        /// The reference, fully qualified.
        reference: String,
        /// The command that builds it.
        command: String,
        /// The end of its log.
        log: String,
    },
    /// The builder could not be run.
    #[error("Cannot run the template builder {}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// The builder answered with something else than its JSON line.
    #[error("The template builder described {text:?} unreadably: {output:?}")]
    Output {
        /// The claim's template.
        text: String,
        /// What it printed.
        output: String,
    },
}

/// Whether a claim's `template` is an image reference rather than a template name or
/// folder: `oci://…`, or text with `:` or `@` (never in a template name) that is no
/// template folder. `held` says whether a folder of that name or path holds one.
pub fn is_reference(template: &str, held: impl FnOnce(&str) -> bool) -> bool {
    let template = template.trim();
    if template.starts_with("oci://") {
        return true;
    }
    template.contains([':', '@']) && !held(template)
}

/// The node's claim-time builds: the policy, one lock per reference, one build at a
/// time, and how many builds ran (for status and tests).
#[derive(Debug)]
pub struct ImageBuilds {
    policy: RegistryPolicy,
    /// `SANDBOX_HOME` the builder writes into.
    home: PathBuf,
    /// Where templates live (`$SANDBOX_HOME/templates`).
    templates_root: PathBuf,
    /// One lock per fully qualified reference: a second claim waits for the first
    /// one's build, then finds its template.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One build at a time on the node.
    building: tokio::sync::Semaphore,
    /// Builds started.
    builds: AtomicU64,
}

impl ImageBuilds {
    /// Builds as `policy` allows, into the templates of `home`.
    pub fn new(policy: RegistryPolicy, home: PathBuf, templates_root: PathBuf) -> Self {
        Self {
            policy,
            home,
            templates_root,
            locks: Mutex::new(HashMap::new()),
            building: tokio::sync::Semaphore::new(1),
            builds: AtomicU64::new(0),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RegistryPolicy {
        &self.policy
    }

    /// Builds started since the node started.
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::SeqCst)
    }

    /// The template name a claim of `text` (an image reference) gets: the one held,
    /// or the one just built. See the module doc for the steps.
    pub async fn resolve(
        &self,
        text: &str,
        progress: Option<&BuildProgress>,
    ) -> Result<String, ImageBuildError> {
        let image = builder::describe(&self.policy.builder, text.trim()).await?;
        let reference_lock = {
            let mut locks = lock(&self.locks);
            locks.entry(image.reference.clone()).or_default().clone()
        };
        let held_lock = match reference_lock.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                if let Some(progress) = progress {
                    progress.report(&format!(
                        "waiting for another claim's build of {}",
                        image.reference
                    ));
                }
                reference_lock.lock().await
            }
        };
        let result = self.resolve_locked(&image, progress).await;
        drop(held_lock);
        // The lock goes with its last user (the map holds one handle, this claim
        // another): references claimed once do not pile up in the map.
        let mut locks = lock(&self.locks);
        if Arc::strong_count(&reference_lock) == 2 {
            locks.remove(&image.reference);
        }
        result
    }

    async fn resolve_locked(
        &self,
        image: &Described,
        progress: Option<&BuildProgress>,
    ) -> Result<String, ImageBuildError> {
        if self.holds(image) {
            return Ok(image.template.clone());
        }
        if !self.policy.allows(image) {
            return Err(ImageBuildError::NotAllowed {
                reference: image.reference.clone(),
                host: image.host.clone(),
                command: self.policy.build_command(image),
            });
        }
        let _one_at_a_time = match self.building.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                if let Some(progress) = progress {
                    progress.report("waiting for the node's current image build to end");
                }
                self.building
                    .acquire()
                    .await
                    .map_err(|_| ImageBuildError::Build {
                        reference: image.reference.clone(),
                        command: self.policy.build_command(image),
                        log: "the node is shutting down".into(),
                    })?
            }
        };
        self.builds.fetch_add(1, Ordering::SeqCst);
        tracing::info!(reference = %image.reference, template = %image.template,
            "building a template from a registry image");
        let started = std::time::Instant::now();
        builder::build(&self.policy, &self.home, image, progress).await?;
        tracing::info!(reference = %image.reference, template = %image.template,
            build_ms = crate::util::millis(started.elapsed()), "template built from a registry image");
        Ok(image.template.clone())
    }

    /// Whether the templates hold `image`'s template, recording that reference.
    fn holds(&self, image: &Described) -> bool {
        let dir = self.templates_root.join(&image.template);
        let Ok(manifest) = sandbox_rootfs::TemplateManifest::load(&dir) else {
            return false;
        };
        dir.join(TEMPLATE_FILE).is_file()
            && manifest
                .image_source
                .is_some_and(|source| source.reference == image.reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(registry: &str, host: &str) -> Described {
        Described {
            reference: format!("oci://{registry}/r:v1"),
            registry: registry.into(),
            host: host.into(),
            template: "oci-x".into(),
        }
    }

    #[test]
    fn references_are_told_from_template_names_and_folders() {
        let none = |_: &str| false;
        assert!(is_reference("oci://alpine", none));
        assert!(is_reference("python:3.12-slim", none));
        assert!(is_reference("127.0.0.1:5000/t/bb@sha256:ab", none));
        assert!(!is_reference("default", none));
        assert!(!is_reference("/srv/templates/py", none));
        // A folder that is a template wins over reading it as a reference.
        assert!(!is_reference("/srv/t:1", |_| true));
        assert!(is_reference(" oci://x/y ", |_| true));
    }

    #[test]
    fn only_allowed_registries_build_and_the_refusal_names_the_command() {
        let policy = RegistryPolicy {
            allow: vec!["127.0.0.1:5000".into(), "DOCKER.io".into()],
            insecure: vec!["127.0.0.1:5000".into()],
            builder: DEFAULT_BUILDER.into(),
        };
        assert!(policy.allows(&described("127.0.0.1:5000", "127.0.0.1:5000")));
        assert!(policy.allows(&described("docker.io", "index.docker.io")));
        assert!(!policy.allows(&described("127.0.0.1:5001", "127.0.0.1:5001")));
        assert!(!policy.allows(&described("ghcr.io", "ghcr.io")));
        assert!(!RegistryPolicy::default().allows(&described("docker.io", "index.docker.io")));
        let local = described("127.0.0.1:5000", "127.0.0.1:5000");
        assert_eq!(
            policy.build_command(&local),
            "sandbox-rootfs build --name oci-x --base oci://127.0.0.1:5000/r:v1 \
             --insecure-registry 127.0.0.1:5000"
        );
    }
}
