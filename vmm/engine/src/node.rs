//! The node: where sandboxes come from (the pool, or the one attached agent), the
//! [`Registry`] of the ones it holds, and the policies of claiming, releasing,
//! renewing, draining and describing them.
//!
//! # Attach mode
//! The attached agent is registered as the sandbox [`ATTACHED_ID`] at start, with no
//! deadline. `release` forgets it without touching the agent (it is not ours: its
//! processes keep running). `create` claims it again when it was released, and
//! otherwise says it is the only sandbox there is.
//!
//! # Snapshots
//! In launch mode the node also holds a [`SnapshotHost`]: every VM sandbox can be
//! hibernated through it, and the snapshot operations (`crate::snapshot::ops`) fork,
//! branch and checkpoint through it. Their children are sandboxes of the node like
//! any claim ([`Node::insert_vm`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::launcher::template::TEMPLATE_FILE;
use sandbox_vmm::launcher::{Launcher, Size, TemplateRef};

use crate::config::{AttachConfig, Mode, ATTACHED_ID, DEFAULT_TTL_SECS, MAX_TTL_SECS};
use crate::error::{
    CreateError, InsertError, LookupError, NetError, RenewError, SpecError, TtlError,
};
use crate::image_build::{BuildProgress, ImageBuilds};
use crate::pool::launcher::{LaunchedVm, LauncherFactory};
use crate::pool::{Lease, Machine, Origin, Pool, PoolStatus, VmSpec};
use crate::record::{Owner, OwnerKind};
use crate::registry::{Lookup, Registry};
use crate::sandbox::{Backing, Claim, Deadline, Lineage, Sandbox, SandboxId};
use crate::snapshot::SnapshotHost;
use crate::token::SandboxToken;
use crate::util::millis;

/// Where sandboxes come from.
#[derive(Debug)]
enum Source {
    Attach(AttachConfig),
    Launch(Arc<Pool<LauncherFactory>>, Arc<SnapshotHost>),
}

/// The network a claim asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetRequest {
    /// No network interface beyond loopback (the default).
    #[default]
    None,
    /// Outbound connections through the host's allowlist.
    Egress,
}

/// One claim, as a front end asks for it.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    /// A template name or path, or an image reference (`oci://…`, `python:3.12`:
    /// see [`crate::image_build`]); `None` or blank for the node's default.
    pub template: Option<String>,
    /// Where a claim that builds its template from a registry reports the build.
    pub progress: Option<BuildProgress>,
    /// A size preset name (`small`, ...); `None` for the template's default.
    pub size: Option<String>,
    /// The network.
    pub net: NetRequest,
    /// With egress: narrow the operator's allowlist to these entries.
    pub allow: Vec<String>,
    /// Lifetime in seconds; 0 for [`DEFAULT_TTL_SECS`].
    pub ttl_seconds: u64,
}

/// What a claim made.
#[derive(Debug)]
pub struct Claimed {
    /// The new sandbox.
    pub sandbox: Arc<Sandbox>,
    /// Where its VM came from; `None` for the attached agent.
    pub origin: Option<Origin>,
    /// Its lifetime; `None` for the attached agent.
    pub ttl_secs: Option<u64>,
    /// How long the claim took.
    pub duration: Duration,
}

/// The sandboxes and where they come from.
#[derive(Debug)]
pub struct Node {
    pub(crate) registry: Arc<Registry>,
    source: Source,
    /// The operator's egress allowlist (empty: egress is refused).
    egress_allow: sandbox_vmm::egress::Allowlist,
    /// Drain: claims are refused; live sandboxes run out.
    draining: AtomicBool,
    /// Claims by image reference; `None` in attach mode.
    image_builds: Option<Arc<ImageBuilds>>,
}

/// A VM made for the node, to become one of its sandboxes ([`Node::insert_vm`]).
#[derive(Debug)]
pub struct NewVm {
    /// The VM and its capacity slot.
    pub lease: Lease<LaunchedVm>,
    /// The template it runs (by name, for listings).
    pub template: String,
    /// vCPUs and memory.
    pub size: Size,
    /// Its lifetime.
    pub ttl: Duration,
    /// Whether a ready VM of the warm pool was waiting for the claim.
    pub warm: bool,
    /// How long it took to have.
    pub claim_duration: Duration,
    /// What it descends from.
    pub lineage: Lineage,
}

/// A template the node holds.
#[derive(Debug, Clone)]
pub struct TemplateEntry {
    /// Its name, for a claim's `template`.
    pub name: String,
    /// Whether it is the node's default (the one kept warm).
    pub default: bool,
    /// The size its VMs get unless told otherwise; `None` when it cannot be loaded.
    pub size: Option<Size>,
    /// Made by `promote` (its VMs restore a captured state).
    pub promoted: bool,
    /// Interpreter sessions its agent starts at boot, as `NAME:LANGUAGE`.
    pub sessions: Vec<String>,
    /// When its `template.json` was last written.
    pub modified: Option<std::time::SystemTime>,
    /// Why it cannot be loaded, if it cannot.
    pub error: Option<String>,
}

/// Limits and usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Most VMs at once.
    pub max_sandboxes: usize,
    /// VMs running or booting now.
    pub vms: usize,
    /// Sandboxes claimed.
    pub live_claims: usize,
    /// Sandboxes that can still be claimed (warm VMs are given up for a claim).
    pub claimable: usize,
}

/// What the node is and holds (`node_info`, `GET /v1/info`).
#[derive(Debug)]
pub struct NodeStatus {
    /// True in attach mode.
    pub attached: bool,
    /// The template a claim gets when it names none.
    pub default_template: String,
    /// The warm pool; `None` in attach mode.
    pub pool: Option<PoolStatus>,
    /// The templates that can be claimed.
    pub templates: Vec<TemplateEntry>,
    /// The live sandboxes, by id.
    pub sandboxes: Vec<Arc<Sandbox>>,
    /// Limits and usage.
    pub capacity: Capacity,
    /// Whether claims are refused.
    pub draining: bool,
}

impl Node {
    /// Sets up the node: in attach mode registers the attached agent; in launch mode
    /// starts the warm pool. Never fails: a missing template or an unreachable agent
    /// is reported by the operations that need them.
    pub async fn start(mode: Mode) -> Arc<Self> {
        let registry = Registry::new();
        let mut egress_allow = sandbox_vmm::egress::Allowlist::default();
        let mut image_builds = None;
        let source = match mode {
            Mode::Attach(attach) => Source::Attach(attach),
            Mode::Launch(launch) => {
                let launcher = Arc::new(Launcher::new(launch.launcher));
                let size = match launcher.template(&launch.template) {
                    Ok(template) => template.default_size,
                    Err(error) => {
                        tracing::error!(
                            template = %launch.template,
                            error = %sandbox_vmm::error_chain(&error),
                            "the default template cannot be loaded; claims will fail until it exists"
                        );
                        Size::default()
                    }
                };
                egress_allow = launch.egress_allow;
                image_builds = Some(Arc::new(ImageBuilds::new(
                    launch.registry,
                    launcher.config().home.root().to_owned(),
                    launcher.config().templates_root(),
                )));
                let spec = VmSpec {
                    template: launch.template,
                    size,
                    net: sandbox_vmm::egress::Net::None,
                };
                let pool = Pool::new(
                    LauncherFactory::new(launcher, launch.owner),
                    spec,
                    launch.pool,
                    launch.max_sandboxes,
                    launch.boot_timeout,
                );
                let pool = Arc::new(pool);
                let snapshots = Arc::new(SnapshotHost::new(pool.clone(), launch.max_fork_count));
                Source::Launch(pool, snapshots)
            }
        };
        let node = Arc::new(Self {
            registry,
            source,
            egress_allow,
            draining: AtomicBool::new(false),
            image_builds,
        });
        if let Source::Launch(pool, _) = &node.source {
            // Before the pool boots (and sweeps): a daemon's earlier life left its
            // claimed VMs running or asleep, and its warm ones to stop.
            if pool.factory().owner() == OwnerKind::Node {
                node.adopt_leftovers().await;
            }
            pool.start();
        }
        if let Source::Attach(attach) = &node.source {
            match node.insert_attached(None, Duration::ZERO).await {
                // Connect in the background: the client is kept for the first call, and
                // an unreachable agent is logged now rather than on first use.
                Ok(sandbox) => {
                    let url = attach.url.clone();
                    tokio::spawn(async move {
                        match sandbox.client().await {
                            Ok(_) => tracing::info!(%url, "attached agent reachable"),
                            Err(error) => tracing::warn!(
                                %url,
                                error = %sandbox_vmm::error_chain(&error),
                                "the attached agent is not reachable yet; calls will retry"
                            ),
                        }
                    });
                }
                Err(error) => tracing::error!(%error, "cannot register the attached agent"),
            }
        }
        node
    }

    /// The live sandbox `id`.
    pub fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, LookupError> {
        self.registry
            .get(id)
            .map_err(|why| self.lookup_error(id, why))
    }

    /// The node's sandboxes.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// What forks, checkpoints and hibernates; `None` in attach mode.
    pub fn snapshots(&self) -> Option<&Arc<SnapshotHost>> {
        match &self.source {
            Source::Attach(_) => None,
            Source::Launch(_, snapshots) => Some(snapshots),
        }
    }

    /// The pool VMs come from; `None` in attach mode.
    pub fn pool(&self) -> Option<&Arc<Pool<LauncherFactory>>> {
        match &self.source {
            Source::Attach(_) => None,
            Source::Launch(pool, _) => Some(pool),
        }
    }

    /// True in attach mode.
    pub fn is_attached(&self) -> bool {
        matches!(self.source, Source::Attach(_))
    }

    /// The template a claim uses when it names none; `None` in attach mode.
    pub fn default_template(&self) -> Option<&TemplateRef> {
        match &self.source {
            Source::Attach(_) => None,
            Source::Launch(pool, _) => Some(pool.default_template()),
        }
    }

    /// Whether the node refuses claims.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Starts (`true`) or ends a drain: while it lasts claims, batches and branches
    /// are refused and the live sandboxes run out their deadlines.
    pub fn set_draining(&self, draining: bool) {
        let was = self.draining.swap(draining, Ordering::SeqCst);
        if was != draining {
            tracing::info!(draining, "drain state changed");
        }
    }

    /// One claim: a sandbox of the asked template, size and network.
    pub async fn create(&self, request: ClaimRequest) -> Result<Claimed, CreateError> {
        if self.is_draining() {
            return Err(CreateError::Draining);
        }
        let ttl_secs = claim_ttl_secs(request.ttl_seconds).map_err(CreateError::Ttl)?;
        // Checked in attach mode too: an attached agent has no egress to give.
        self.net(request.net, &request.allow)
            .map_err(CreateError::Net)?;
        match &self.source {
            Source::Attach(_) => self.claim_attached().await,
            Source::Launch(pool, _) => self.claim_vm(pool, request, ttl_secs).await,
        }
    }

    async fn claim_vm(
        &self,
        pool: &Pool<LauncherFactory>,
        request: ClaimRequest,
        ttl_secs: u64,
    ) -> Result<Claimed, CreateError> {
        let started = Instant::now();
        let size = match request.size.as_deref() {
            Some(name) => Some(
                Size::preset(name)
                    .ok_or_else(|| CreateError::Spec(SpecError::UnknownSize(name.to_owned())))?,
            ),
            None => None,
        };
        let template = self
            .claim_template(pool, request.template, request.progress.as_ref())
            .await?;
        let mut spec = self
            .resolve_spec(pool, template.as_deref(), size)
            .map_err(CreateError::Spec)?;
        spec.net = self
            .net(request.net, &request.allow)
            .map_err(CreateError::Net)?;
        let VmSpec { template, size, .. } = spec.clone();
        let (lease, origin) = pool
            .claim(&spec)
            .await
            .map_err(|error| CreateError::Claim {
                template: template.to_string(),
                error,
            })?;
        let claim_duration = started.elapsed();
        let sandbox = self
            .insert_vm(NewVm {
                lease,
                template: template.to_string(),
                size,
                ttl: Duration::from_secs(ttl_secs),
                warm: origin.is_warm(),
                claim_duration,
                lineage: Lineage::Template,
            })
            .await
            .map_err(CreateError::Insert)?;
        Ok(Claimed {
            sandbox,
            origin: Some(origin),
            ttl_secs: Some(ttl_secs),
            duration: claim_duration,
        })
    }

    /// The template a claim of `template` boots: an image reference becomes the
    /// template built from it (held already, or built now); anything else is as given.
    pub async fn claim_template(
        &self,
        pool: &Pool<LauncherFactory>,
        template: Option<String>,
        progress: Option<&BuildProgress>,
    ) -> Result<Option<String>, CreateError> {
        let (Some(text), Some(builds)) = (template.as_deref(), &self.image_builds) else {
            return Ok(template);
        };
        let launcher = pool.factory().launcher();
        let held = |text: &str| launcher.template(&TemplateRef::parse(text)).is_ok();
        if !crate::image_build::is_reference(text, held) {
            return Ok(template);
        }
        builds
            .resolve(text, progress)
            .await
            .map(Some)
            .map_err(CreateError::Image)
    }

    /// Claims by image reference; `None` in attach mode.
    pub fn image_builds(&self) -> Option<&Arc<ImageBuilds>> {
        self.image_builds.as_ref()
    }

    /// What a claim of `template` (the default when `None` or blank) at `size` (the
    /// template's default when `None`) boots, or why that template cannot be used.
    pub fn resolve_spec(
        &self,
        pool: &Pool<LauncherFactory>,
        template: Option<&str>,
        size: Option<Size>,
    ) -> Result<VmSpec, SpecError> {
        let template = match template.map(str::trim) {
            None | Some("") => pool.default_template().clone(),
            Some(name) => TemplateRef::parse(name),
        };
        let size = match size {
            Some(size) => size,
            None if template == *pool.default_template() => pool.default_size(),
            None => match pool.factory().launcher().template(&template) {
                Ok(loaded) => loaded.default_size,
                Err(error) => {
                    return Err(SpecError::Template {
                        template: template.to_string(),
                        error: sandbox_vmm::error_chain(&error),
                        available: self.template_names(),
                    })
                }
            },
        };
        Ok(VmSpec {
            template,
            size,
            net: sandbox_vmm::egress::Net::None,
        })
    }

    /// The network a claim asking for `net` with the sandbox's own `allow` gets: the
    /// operator's allowlist, narrowed by `allow` (never widened: a destination must
    /// pass both).
    pub fn net(
        &self,
        net: NetRequest,
        allow: &[String],
    ) -> Result<sandbox_vmm::egress::Net, NetError> {
        use sandbox_vmm::egress::{Allowlist, Net as VmNet, Policy};
        match net {
            NetRequest::None if allow.is_empty() => Ok(VmNet::None),
            NetRequest::None => Err(NetError::AllowWithoutEgress),
            NetRequest::Egress if self.is_attached() => Err(NetError::Attached),
            NetRequest::Egress if self.egress_allow.is_empty() => Err(NetError::NoAllowlist),
            NetRequest::Egress => {
                let policy = Policy::new(self.egress_allow.clone());
                if allow.is_empty() {
                    return Ok(VmNet::Egress(policy));
                }
                let own = Allowlist::parse(allow).map_err(NetError::Allow)?;
                Ok(VmNet::Egress(policy.narrowed(own)))
            }
        }
    }

    /// The operator's egress allowlist entries.
    pub fn egress_allow(&self) -> Vec<String> {
        self.egress_allow.entries()
    }

    /// The last `tail` records of `sandbox`'s egress log, oldest first; `None` when
    /// the sandbox runs in no VM of the node's.
    pub fn egress_log(
        &self,
        sandbox: &Sandbox,
        tail: usize,
    ) -> Option<Result<Vec<sandbox_vmm::egress::EgressRecord>, sandbox_vmm::launcher::LaunchError>>
    {
        let Source::Launch(pool, _) = &self.source else {
            return None;
        };
        let vm_id = vm_id_of(&sandbox.id)?;
        Some(pool.factory().launcher().egress_log(&vm_id, tail))
    }

    /// Makes `vm` a sandbox of the node, `sbx-<VM id>`, expiring `ttl` from now,
    /// with a fresh token.
    pub async fn insert_vm(&self, vm: NewVm) -> Result<Arc<Sandbox>, InsertError> {
        let NewVm {
            lease,
            template,
            size,
            ttl,
            warm,
            claim_duration,
            lineage,
        } = vm;
        // On failure the lease is dropped here, which kills the VM.
        let token = SandboxToken::generate().map_err(InsertError::Token)?;
        let deadline = Deadline::after(ttl);
        let id = sandbox_id_of(lease.vm().id());
        // The sandbox keeps its own handle on the connection the VM came with.
        let agent = (
            lease.vm().url.clone(),
            lease
                .vm()
                .vm
                .connect_options(ConnectOptions::default().connect_timeout),
            Some(lease.vm().client.clone()),
        );
        let run_dir = lease.vm().vm.run_dir().to_owned();
        let backing = match &self.source {
            Source::Launch(_, snapshots) => Backing::hibernating(lease, snapshots.clone()),
            Source::Attach(_) => Backing::vm(lease),
        };
        let claim = Claim {
            template,
            size: Some(size),
            deadline: Some(deadline),
            warm,
            duration: claim_duration,
            lineage,
            token,
        };
        let owner = Owner::this(self.owner_kind());
        let sandbox = Sandbox::new(id, claim, agent, backing).with_record(run_dir, owner);
        // Written before anyone learns the token: a node killed after this finds the
        // sandbox at its next start, as it was claimed.
        if let Err(error) = sandbox.persist() {
            sandbox.destroy().await;
            return Err(InsertError::Record(error));
        }
        let sandbox = self
            .registry
            .insert(sandbox)
            .await
            .map_err(|_| InsertError::Closed)?;
        tracing::info!(sandbox = %sandbox.id, warm, claim_ms = millis(claim_duration), ttl_secs = ttl.as_secs(), "claimed");
        Ok(sandbox)
    }

    async fn claim_attached(&self) -> Result<Claimed, CreateError> {
        if self.registry.get(ATTACHED_ID).is_ok() {
            return Err(CreateError::AttachedTaken);
        }
        let started = Instant::now();
        let sandbox = self
            .insert_attached(None, started.elapsed())
            .await
            .map_err(CreateError::Insert)?;
        Ok(Claimed {
            sandbox,
            origin: None,
            ttl_secs: None,
            duration: started.elapsed(),
        })
    }

    async fn insert_attached(
        &self,
        client: Option<Client>,
        claim_duration: Duration,
    ) -> Result<Arc<Sandbox>, InsertError> {
        let Source::Attach(attach) = &self.source else {
            return Err(InsertError::Closed);
        };
        let options = ConnectOptions {
            token: attach.token.clone(),
            ..ConnectOptions::default()
        };
        let claim = Claim {
            template: ATTACHED_ID.to_owned(),
            size: None,
            deadline: None,
            warm: true,
            duration: claim_duration,
            lineage: Lineage::Attached,
            token: SandboxToken::generate().map_err(InsertError::Token)?,
        };
        let sandbox = Sandbox::new(
            SandboxId::new(ATTACHED_ID),
            claim,
            (attach.url.clone(), options, client),
            Backing::Attached,
        );
        self.registry
            .insert(sandbox)
            .await
            .map_err(|_| InsertError::Closed)
    }

    /// Destroys the sandbox `id` (an attached agent is only forgotten); a second
    /// release finds it gone.
    pub async fn release(&self, id: &str) -> Result<Arc<Sandbox>, LookupError> {
        self.registry
            .release(id)
            .await
            .map_err(|why| self.lookup_error(id, why))
    }

    /// Moves the deadline of `id` to `ttl_seconds` (0: the default) from now.
    pub fn renew(&self, id: &str, ttl_seconds: u64) -> Result<Arc<Sandbox>, RenewError> {
        let ttl = claim_ttl_secs(ttl_seconds).map_err(RenewError::Ttl)?;
        let deadline = Deadline::after(Duration::from_secs(ttl));
        match self.registry.renew(id, deadline) {
            Ok(Some(sandbox)) => {
                if let Err(error) = sandbox.persist() {
                    // Renewed here; a restarted node would go by the old deadline.
                    tracing::warn!(sandbox = %sandbox.id, error = %sandbox_vmm::error_chain(&error), "cannot record the new deadline");
                }
                tracing::info!(sandbox = %sandbox.id, ttl_secs = ttl, "renewed");
                Ok(sandbox)
            }
            Ok(None) => Err(RenewError::Attached),
            Err(why) => Err(RenewError::Lookup(self.lookup_error(id, why))),
        }
    }

    /// A lookup failure, with the live ids.
    pub fn lookup_error(&self, id: &str, why: Lookup) -> LookupError {
        LookupError {
            id: id.to_owned(),
            why,
            live: self.registry.ids(),
        }
    }

    /// What the node is and holds.
    pub fn status(&self) -> NodeStatus {
        let sandboxes = self.registry.list();
        let draining = self.is_draining();
        match &self.source {
            Source::Attach(_) => NodeStatus {
                attached: true,
                default_template: ATTACHED_ID.to_owned(),
                pool: None,
                templates: Vec::new(),
                capacity: Capacity {
                    max_sandboxes: 1,
                    vms: 0,
                    live_claims: sandboxes.len(),
                    claimable: 1 - sandboxes.len().min(1),
                },
                sandboxes,
                draining,
            },
            Source::Launch(pool, _) => {
                let live_claims = sandboxes.len();
                NodeStatus {
                    attached: false,
                    default_template: pool.default_template().to_string(),
                    pool: Some(pool.status()),
                    templates: self.info_templates(pool),
                    capacity: Capacity {
                        max_sandboxes: pool.max(),
                        vms: pool.used(),
                        live_claims,
                        claimable: pool.max().saturating_sub(live_claims),
                    },
                    sandboxes,
                    draining,
                }
            }
        }
    }

    /// The templates `status` lists: those under the templates root, and the default
    /// when it is a path.
    fn info_templates(&self, pool: &Pool<LauncherFactory>) -> Vec<TemplateEntry> {
        let default = pool.default_template();
        let mut references: Vec<TemplateRef> = self
            .template_names()
            .into_iter()
            .map(TemplateRef::Name)
            .collect();
        if !references.contains(default) && matches!(default, TemplateRef::Path(_)) {
            references.push(default.clone());
        }
        self.entries(pool, references)
    }

    /// The templates under the templates root, and the default whatever it is, by
    /// name; empty in attach mode.
    pub fn template_entries(&self) -> Vec<TemplateEntry> {
        let Some(pool) = self.pool() else {
            return Vec::new();
        };
        let default = pool.default_template();
        let mut references: Vec<TemplateRef> = self
            .template_names()
            .into_iter()
            .map(TemplateRef::Name)
            .collect();
        if !references.contains(default) {
            references.push(default.clone());
        }
        self.entries(pool, references)
    }

    fn entries(
        &self,
        pool: &Pool<LauncherFactory>,
        references: Vec<TemplateRef>,
    ) -> Vec<TemplateEntry> {
        let default = pool.default_template();
        let launcher = pool.factory().launcher();
        references
            .into_iter()
            .map(|reference| {
                let is_default = reference == *default;
                match launcher.template(&reference) {
                    Ok(template) => TemplateEntry {
                        name: reference.to_string(),
                        default: is_default,
                        size: Some(template.default_size),
                        promoted: template.snapshot.is_some(),
                        sessions: template
                            .image_config
                            .sessions
                            .iter()
                            .map(|session| {
                                format!("{}:{}", session.name, session.language.as_str())
                            })
                            .collect(),
                        modified: std::fs::metadata(template.dir.join(TEMPLATE_FILE))
                            .and_then(|meta| meta.modified())
                            .ok(),
                        error: None,
                    },
                    Err(error) => TemplateEntry {
                        name: reference.to_string(),
                        default: is_default,
                        size: None,
                        promoted: false,
                        sessions: Vec::new(),
                        modified: None,
                        error: Some(sandbox_vmm::error_chain(&error)),
                    },
                }
            })
            .collect()
    }

    /// Names of the folders under the templates root that hold a template.
    pub fn template_names(&self) -> Vec<String> {
        let Source::Launch(pool, _) = &self.source else {
            return Vec::new();
        };
        let root = pool.factory().launcher().config().templates_root();
        let Ok(entries) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.path().join(TEMPLATE_FILE).is_file())
            .filter_map(|entry| entry.file_name().into_string().ok())
            // A download or promotion under way is no template yet.
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// Who holds this node's VMs (an attached node holds none: embedded).
    pub fn owner_kind(&self) -> OwnerKind {
        match &self.source {
            Source::Launch(pool, _) => pool.factory().owner(),
            Source::Attach(_) => OwnerKind::Embedded,
        }
    }

    /// A node daemon's graceful stop: the warm VMs are destroyed, the claimed
    /// sandboxes left running (or asleep) with their records for the next start to
    /// re-adopt; further calls are refused. An embedded node's VMs cannot outlive it:
    /// this is [`Node::shutdown`] there.
    pub async fn leave(&self) {
        if self.owner_kind() != OwnerKind::Node {
            return self.shutdown().await;
        }
        self.registry.leave().await;
        if let Source::Launch(pool, snapshots) = &self.source {
            pool.shutdown().await;
            // Forks' checkpoints that live children still map are refused here.
            snapshots.shutdown();
        }
    }

    /// Destroys every sandbox and warm VM; further calls are refused.
    pub async fn shutdown(&self) {
        self.registry.shutdown().await;
        if let Source::Launch(pool, snapshots) = &self.source {
            pool.shutdown().await;
            // After the sandboxes: their forks' checkpoints are unused only now.
            snapshots.shutdown();
        }
    }
}

/// The sandbox id of VM `vm_id`: `sbx-<VM id>`, the one id space of the node, the
/// CLI and the run folders.
pub fn sandbox_id_of(vm_id: &str) -> SandboxId {
    SandboxId::new(format!("sbx-{vm_id}"))
}

/// The VM id of a VM sandbox's id, or `None` when it names none.
pub fn vm_id_of(id: &SandboxId) -> Option<sandbox_vmm::launcher::VmId> {
    id.as_str()
        .strip_prefix("sbx-")
        .and_then(|id| id.parse::<sandbox_vmm::launcher::VmId>().ok())
}

/// The lifetime of a claim asking for `ttl_seconds` (0 for the default), or why it
/// cannot be had.
pub fn claim_ttl_secs(ttl_seconds: u64) -> Result<u64, TtlError> {
    match ttl_seconds {
        0 => Ok(DEFAULT_TTL_SECS),
        secs if secs > MAX_TTL_SECS => Err(TtlError {
            asked: secs,
            max: MAX_TTL_SECS,
        }),
        secs => Ok(secs),
    }
}
