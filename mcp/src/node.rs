//! The node the tools talk to: where sandboxes come from (the pool, or the one
//! attached agent), the session's [`Registry`], and the policies of
//! `create_sandbox`, `release` and `node_info`.
//!
//! # Attach mode
//! The attached agent is registered as the sandbox [`ATTACHED_ID`] at start, with no
//! deadline. `release` forgets it without touching the agent (it is not ours: its
//! processes keep running). `create_sandbox` claims it again when it was released,
//! and otherwise says it is the only sandbox there is.
//!
//! # Snapshots
//! In launch mode the node also holds a [`SnapshotHost`]: every VM sandbox can be
//! hibernated through it, and the snapshot tools (`crate::snapshot`) fork, branch
//! and checkpoint through it. Their children are sandboxes of this session like any
//! claim ([`Node::insert_vm`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_vmm::client::{Client, ConnectOptions};
use sandbox_vmm::launcher::template::TEMPLATE_FILE;
use sandbox_vmm::launcher::{Launcher, Size, TemplateRef};

use crate::config::{AttachConfig, Config, Mode, ATTACHED_ID};
use crate::error::ToolError;
use crate::params::{CreateSandboxParams, Net};
use crate::pool::launcher::{LaunchedVm, LauncherFactory};
use crate::pool::{Lease, Machine, Pool, VmSpec};
use crate::registry::{Lookup, Registry};
use crate::render::{
    rfc3339, CapacityInfo, ClaimInfo, CreateSandboxResult, NodeInfoResult, PoolInfo, ReleaseResult,
    TemplateInfo,
};
use crate::sandbox::{Backing, Claim, Deadline, Lineage, Sandbox, SandboxId};
use crate::snapshot::SnapshotHost;
use crate::token::SandboxToken;
use crate::util::millis;

/// The TTL `ttl_seconds: 0` means.
pub const DEFAULT_TTL_SECS: u64 = 60 * 60;

/// The longest TTL a claim may ask for.
pub const MAX_TTL_SECS: u64 = 24 * 60 * 60;

/// Where sandboxes come from.
#[derive(Debug)]
enum Source {
    Attach(AttachConfig),
    Launch(Arc<Pool<LauncherFactory>>, Arc<SnapshotHost>),
}

/// The sandboxes and where they come from.
#[derive(Debug)]
pub struct Node {
    registry: Arc<Registry>,
    source: Source,
    /// The operator's egress allowlist (empty: egress is refused).
    egress_allow: sandbox_vmm::egress::Allowlist,
}

/// A VM made for the session, to become one of its sandboxes ([`Node::insert_vm`]).
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

impl Node {
    /// Sets up the node: in attach mode registers the attached agent; in launch mode
    /// starts the warm pool. Never fails: a missing template or an unreachable agent
    /// is reported by the tools that need them.
    pub async fn start(config: Config) -> Arc<Self> {
        let registry = Registry::new();
        let mut egress_allow = sandbox_vmm::egress::Allowlist::default();
        let source = match config.mode {
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
                let spec = VmSpec {
                    template: launch.template,
                    size,
                    net: sandbox_vmm::egress::Net::None,
                };
                let pool = Pool::new(
                    LauncherFactory::new(launcher),
                    spec,
                    launch.pool,
                    launch.max_sandboxes,
                    launch.boot_timeout,
                );
                pool.start();
                let pool = Arc::new(pool);
                let snapshots = Arc::new(SnapshotHost::new(pool.clone(), launch.max_fork_count));
                Source::Launch(pool, snapshots)
            }
        };
        let node = Arc::new(Self {
            registry,
            source,
            egress_allow,
        });
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

    /// The live sandbox `id`, or an error that lists the live ones.
    pub fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, ToolError> {
        self.registry
            .get(id)
            .map_err(|why| ToolError::lookup(id, &why, &self.registry.ids()))
    }

    /// The session's sandboxes.
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

    /// The template `create_sandbox` uses when none is given; `None` in attach mode.
    pub fn default_template(&self) -> Option<&TemplateRef> {
        match &self.source {
            Source::Attach(_) => None,
            Source::Launch(pool, _) => Some(pool.default_template()),
        }
    }

    /// `create_sandbox`
    pub async fn create(
        &self,
        params: CreateSandboxParams,
    ) -> Result<CreateSandboxResult, ToolError> {
        let ttl_secs = claim_ttl_secs(params.ttl_seconds)?;
        // Checked in attach mode too: an attached agent has no egress to give.
        self.net(params.net, &params.allow)?;
        match &self.source {
            Source::Attach(_) => self.claim_attached().await,
            Source::Launch(pool, _) => self.claim_vm(pool, params, ttl_secs).await,
        }
    }

    async fn claim_vm(
        &self,
        pool: &Pool<LauncherFactory>,
        params: CreateSandboxParams,
        ttl_secs: u64,
    ) -> Result<CreateSandboxResult, ToolError> {
        let started = Instant::now();
        let size = match params.size {
            Some(name) => Some(Size::preset(name.as_str()).ok_or_else(|| {
                ToolError::new(format!(
                    "Size {} is not one the launcher knows; use small, medium, large, xlarge or 2xlarge.",
                    name.as_str()
                ))
            })?),
            None => None,
        };
        let mut spec = self.resolve_spec(pool, params.template.as_deref(), size)?;
        spec.net = self.net(params.net, &params.allow)?;
        let VmSpec { template, size, .. } = spec.clone();
        let (lease, origin) = pool
            .claim(&spec)
            .await
            .map_err(|error| ToolError::claim(&template.to_string(), &error))?;
        let warm = origin.is_warm();
        let claim_duration = started.elapsed();
        let sandbox = self
            .insert_vm(NewVm {
                lease,
                template: template.to_string(),
                size,
                ttl: Duration::from_secs(ttl_secs),
                warm,
                claim_duration,
                lineage: Lineage::Template,
            })
            .await?;
        let deadline = sandbox.deadline.map(|deadline| deadline.wall);
        Ok(CreateSandboxResult {
            sandbox_id: sandbox.id.to_string(),
            deadline: deadline.map(rfc3339),
            ttl_seconds: Some(ttl_secs),
            template: sandbox.template.clone(),
            size: Some(size.to_string()),
            vcpus: Some(size.vcpus),
            memory_mib: Some(size.memory_mib),
            warm,
            origin: origin.as_str().to_owned(),
            claim_ms: millis(claim_duration),
            note: None,
        })
    }

    /// What a claim of `template` (the default when `None` or blank) at `size` (the
    /// template's default when `None`) boots, or why that template cannot be used.
    pub fn resolve_spec(
        &self,
        pool: &Pool<LauncherFactory>,
        template: Option<&str>,
        size: Option<Size>,
    ) -> Result<VmSpec, ToolError> {
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
                    return Err(ToolError::new(format!(
                        "Template {template} cannot be used: {}. Templates available: {}.",
                        sandbox_vmm::error_chain(&error),
                        self.template_names().join(", ")
                    )))
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
    pub fn net(&self, net: Net, allow: &[String]) -> Result<sandbox_vmm::egress::Net, ToolError> {
        use sandbox_vmm::egress::{Allowlist, Net as VmNet, Policy};
        match net {
            Net::None if allow.is_empty() => Ok(VmNet::None),
            Net::None => Err(ToolError::new(
                "allow applies to net \"egress\" only: pass net \"egress\" with it, or leave it out.",
            )),
            Net::Egress if matches!(self.source, Source::Attach(_)) => Err(ToolError::new(
                "The attached agent runs in no VM this server launched, so it has no egress \
                 to give: claim with net \"none\".",
            )),
            Net::Egress if self.egress_allow.is_empty() => Err(ToolError::new(
                "This server gives no egress: its operator set no allowlist (sandbox-mcp \
                 --egress-allow ENTRY). Claim with net \"none\"; to get files in, use write_file.",
            )),
            Net::Egress => {
                let policy = Policy::new(self.egress_allow.clone());
                if allow.is_empty() {
                    return Ok(VmNet::Egress(policy));
                }
                let own = Allowlist::parse(allow).map_err(|error| {
                    ToolError::new(format!(
                        "{error}. Entries are host names, \"*.domain\", \"*\", IP addresses or \
                         CIDR blocks, each with an optional \":port\" or \":low-high\"."
                    ))
                })?;
                Ok(VmNet::Egress(policy.narrowed(own)))
            }
        }
    }

    /// The operator's egress allowlist entries.
    pub fn egress_allow(&self) -> Vec<String> {
        self.egress_allow.entries()
    }

    /// The last `tail` records of `sandbox`'s egress log, oldest first.
    pub fn egress_log(
        &self,
        sandbox: &Sandbox,
        tail: usize,
    ) -> Result<Vec<sandbox_vmm::egress::EgressRecord>, ToolError> {
        let Source::Launch(pool, _) = &self.source else {
            return Err(ToolError::new(
                "An attached agent has no egress log: this server launches no VMs.",
            ));
        };
        let vm_id = sandbox
            .id
            .as_str()
            .strip_prefix("sbx-")
            .and_then(|id| id.parse::<sandbox_vmm::launcher::VmId>().ok())
            .ok_or_else(|| ToolError::new(format!("{} is not a VM sandbox", sandbox.id)))?;
        pool.factory()
            .launcher()
            .egress_log(&vm_id, tail)
            .map_err(|error| {
                ToolError::new(format!(
                    "Cannot read the egress log of {}: {}",
                    sandbox.id,
                    sandbox_vmm::error_chain(&error)
                ))
            })
    }

    /// Makes `vm` a sandbox of this session, `sbx-<VM id>`, expiring `ttl` from now,
    /// with a fresh token.
    pub async fn insert_vm(&self, vm: NewVm) -> Result<Arc<Sandbox>, ToolError> {
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
        let token = new_token()?;
        let deadline = Deadline::after(ttl);
        let id = SandboxId::new(format!("sbx-{}", lease.vm().id()));
        // The sandbox keeps its own handle on the connection the VM came with.
        let agent = (
            lease.vm().url.clone(),
            lease
                .vm()
                .vm
                .connect_options(ConnectOptions::default().connect_timeout),
            Some(lease.vm().client.clone()),
        );
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
        let sandbox = Sandbox::new(id, claim, agent, backing);
        let sandbox = self
            .registry
            .insert(sandbox)
            .await
            .map_err(|why| ToolError::lookup("", &why, &[]))?;
        tracing::info!(sandbox = %sandbox.id, warm, claim_ms = millis(claim_duration), ttl_secs = ttl.as_secs(), "claimed");
        Ok(sandbox)
    }

    async fn claim_attached(&self) -> Result<CreateSandboxResult, ToolError> {
        if self.registry.get(ATTACHED_ID).is_ok() {
            return Err(ToolError::new(format!(
                "This server is attached to one existing agent, exposed as sandbox_id \
                 {ATTACHED_ID:?}, and it is already yours: pass sandbox_id {ATTACHED_ID:?} to \
                 the other tools. No other sandbox can be created in attach mode."
            )));
        }
        let started = Instant::now();
        let sandbox = self.insert_attached(None, started.elapsed()).await?;
        Ok(CreateSandboxResult {
            sandbox_id: sandbox.id.to_string(),
            deadline: None,
            ttl_seconds: None,
            template: ATTACHED_ID.to_owned(),
            size: None,
            vcpus: None,
            memory_mib: None,
            warm: true,
            origin: "attached".to_owned(),
            claim_ms: millis(started.elapsed()),
            note: Some(
                "Attach mode: this is the one existing agent the server was started with. It \
                 has no deadline; template, size and ttl_seconds do not apply."
                    .to_owned(),
            ),
        })
    }

    async fn insert_attached(
        &self,
        client: Option<Client>,
        claim_duration: Duration,
    ) -> Result<Arc<Sandbox>, ToolError> {
        let Source::Attach(attach) = &self.source else {
            return Err(ToolError::new("Not in attach mode"));
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
            token: new_token()?,
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
            .map_err(|why| ToolError::lookup(ATTACHED_ID, &why, &[]))
    }

    /// `release`
    pub async fn release(&self, id: &str) -> Result<ReleaseResult, ToolError> {
        let sandbox = self
            .registry
            .release(id)
            .await
            .map_err(|why| self.lookup_error(id, &why))?;
        let outcome = if sandbox.is_attached() {
            "forgotten by this session; the attached agent and its processes keep running \
             (create_sandbox claims it again)"
        } else {
            "the VM and everything in it was destroyed"
        };
        Ok(ReleaseResult {
            sandbox_id: sandbox.id.to_string(),
            outcome: outcome.to_owned(),
        })
    }

    fn lookup_error(&self, id: &str, why: &Lookup) -> ToolError {
        ToolError::lookup(id, why, &self.registry.ids())
    }

    /// `node_info`
    pub fn info(&self) -> NodeInfoResult {
        let sandboxes = self.registry.list();
        let claims: Vec<ClaimInfo> = sandboxes
            .iter()
            .map(|sandbox| ClaimInfo {
                sandbox_id: sandbox.id.to_string(),
                template: sandbox.template.clone(),
                size: sandbox.size.map(|size| size.to_string()),
                claimed_at: rfc3339(sandbox.claimed_at),
                deadline: sandbox.deadline.map(|deadline| rfc3339(deadline.wall)),
            })
            .collect();
        match &self.source {
            Source::Attach(_) => NodeInfoResult {
                mode: "attach".to_owned(),
                default_template: ATTACHED_ID.to_owned(),
                pool: None,
                templates: Vec::new(),
                capacity: CapacityInfo {
                    max_sandboxes: 1,
                    vms: 0,
                    live_claims: claims.len(),
                    claimable: 1 - claims.len().min(1),
                },
                claims,
            },
            Source::Launch(pool, _) => {
                let status = pool.status();
                let vm_claims = sandboxes.len();
                NodeInfoResult {
                    mode: "launch".to_owned(),
                    default_template: pool.default_template().to_string(),
                    pool: Some(PoolInfo {
                        template: status.template,
                        size: status.size.to_string(),
                        target: status.target,
                        warm: status.warm,
                        booting: status.booting,
                        last_error: status.last_error,
                    }),
                    templates: self.templates(pool),
                    capacity: CapacityInfo {
                        max_sandboxes: pool.max(),
                        vms: pool.used(),
                        live_claims: vm_claims,
                        claimable: pool.max().saturating_sub(vm_claims),
                    },
                    claims,
                }
            }
        }
    }

    fn templates(&self, pool: &Pool<LauncherFactory>) -> Vec<TemplateInfo> {
        let default = pool.default_template().to_string();
        let mut names = self.template_names();
        if !names.contains(&default) && matches!(pool.default_template(), TemplateRef::Path(_)) {
            names.push(default.clone());
        }
        names
            .into_iter()
            .map(|name| {
                let reference = TemplateRef::parse(&name);
                let default_size = pool
                    .factory()
                    .launcher()
                    .template(&reference)
                    .ok()
                    .map(|t| t.default_size)
                    .map(|size| size.to_string());
                TemplateInfo {
                    default: name == default,
                    name,
                    default_size,
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
            .collect();
        names.sort();
        names
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

/// A sandbox's token, or why none could be made.
fn new_token() -> Result<SandboxToken, ToolError> {
    SandboxToken::generate().map_err(|error| {
        ToolError::new(format!(
            "Cannot make the sandbox's token: no random bytes from the kernel ({error}). \
             Nothing was kept; try again."
        ))
    })
}

/// The lifetime of a claim asking for `ttl_seconds` (0 for the default),
/// or why it cannot be had.
pub fn claim_ttl_secs(ttl_seconds: u64) -> Result<u64, ToolError> {
    match ttl_seconds {
        0 => Ok(DEFAULT_TTL_SECS),
        secs if secs > MAX_TTL_SECS => Err(ToolError::new(format!(
            "ttl_seconds may be at most {MAX_TTL_SECS} (24 hours); got {secs}. Pass a smaller \
             value, or 0 for one hour."
        ))),
        secs => Ok(secs),
    }
}
