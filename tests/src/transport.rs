//! The seam between the scenarios and where the agent runs.
//!
//! A [`Transport`] is one way to reach a running agent: it opens clients and raw byte
//! streams to it and states the [`Facts`] a scenario may depend on. A [`Target`] is
//! what a scenario gets: a transport and a client already connected through it.
//! The transports themselves:
//! - [`UnixTransport`]: the agent as an ordinary process on a throwaway Unix socket,
//!   or serving the link behind a `sandbox-relay` ([`UnixTransport::start_link`]);
//! - [`VmTransport`]: the agent as PID 1 of a real microVM of the default template or
//!   another ([`VmTransport::boot_template`]), over the launcher's transport
//!   (its serial link by default);
//! - [`UpgradeTransport`]: the agent on a Unix socket behind a real `sandboxd`
//!   (attached to it): every connection an HTTP/1.1 upgrade through the daemon.
//!
//! A new transport (say, a virtio-serial relay) implements [`Transport`] and adds one
//! entry to [`crate::suite::TRANSPORTS`]; every scenario then runs over it too.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use sandbox_vmm::launcher::TemplateRef;

use crate::node::NodeDaemon;
use crate::raw::RawConnection;
use crate::vm::{default_template, TestVm, VmHost};
use crate::{AgentOptions, TempDir, TestAgent};

/// A boxed, sendable future (the trait below must stay object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a scenario may need to know about the agent's machine.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The agent is the machine's init (PID 1), with its duties.
    pub is_pid1: bool,
    /// A directory in the agent's machine, writable by the agent, under which each
    /// scenario makes a directory of its own ([`Target::scratch`]).
    pub scratch_root: PathBuf,
    /// How big a file the round-trip scenarios move: a microVM keeps its files in
    /// guest memory, a host agent on disk.
    pub big_file_bytes: u64,
}

/// One way to reach a running agent.
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// What scenarios may rely on.
    fn facts(&self) -> &Facts;
    /// A new client connection (handshake done); panics with diagnostics if it fails.
    fn connect(&self) -> BoxFuture<'_, Client>;
    /// A new raw byte stream to the agent, nothing sent yet.
    fn open_raw(&self) -> BoxFuture<'_, RawConnection>;
    /// The end of what the agent's side logged (the agent's log, a guest's console),
    /// added to a failed trial's message: the agent outlives the trial, so nothing
    /// else would show it.
    fn log_tail(&self) -> String;
    /// The token the agent requires, if any (every launcher-started VM has one).
    fn token(&self) -> Option<String> {
        None
    }
    /// The microVM the agent is PID 1 of, for scenarios about the machine itself
    /// (a fork); `None` for an agent on the host.
    fn vm(&self) -> Option<&TestVm> {
        None
    }
}

/// How much of a log [`Transport::log_tail`] returns.
const LOG_TAIL_BYTES: usize = 4 * 1024;

/// The last [`LOG_TAIL_BYTES`] of `log`, cut at a line start.
fn tail(log: &str) -> String {
    let mut start = log.len().saturating_sub(LOG_TAIL_BYTES);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    let cut = &log[start..];
    match cut.find('\n') {
        Some(line) if start > 0 => cut[line + 1..].to_owned(),
        _ => cut.to_owned(),
    }
}

/// What a scenario runs against: a transport and a client connected through it.
#[derive(Debug, Clone)]
pub struct Target {
    transport: Arc<dyn Transport>,
    client: Client,
}

impl Target {
    /// Connects a client through `transport`.
    pub async fn new(transport: Arc<dyn Transport>) -> Self {
        let client = transport.connect().await;
        Self { transport, client }
    }

    /// The client connected for this scenario.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A new, separate client connection.
    pub async fn connect(&self) -> Client {
        self.transport.connect().await
    }

    /// A raw connection with nothing sent yet.
    pub async fn raw(&self) -> RawConnection {
        self.transport.open_raw().await
    }

    /// A raw connection after a valid hello.
    pub async fn raw_hello(&self) -> RawConnection {
        self.raw().await.hello(self.transport.token()).await
    }

    /// What the scenario may rely on.
    pub fn facts(&self) -> &Facts {
        self.transport.facts()
    }

    /// The microVM the agent runs in, when it does.
    pub fn vm(&self) -> Option<&TestVm> {
        self.transport.vm()
    }

    /// A fresh directory in the agent's machine for one scenario, so scenarios
    /// sharing an agent never touch each other's files.
    pub async fn scratch(&self, name: &str) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = self.facts().scratch_root.join(format!("{name}-{n}"));
        self.client
            .mkdir(&dir, true, None)
            .await
            .unwrap_or_else(|e| panic!("cannot make {}: {e}", dir.display()));
        dir
    }

    /// Asserts the agent still serves a fresh connection.
    pub async fn assert_serves(&self) {
        let client = self.connect().await;
        crate::within(20, client.ps())
            .await
            .unwrap_or_else(|e| panic!("a fresh connection is not served: {e}"));
    }
}

/// The agent as an ordinary process on a throwaway Unix socket.
#[derive(Debug)]
pub struct UnixTransport {
    agent: TestAgent,
    facts: Facts,
    // Last: removed after the agent is gone.
    _scratch: TempDir,
}

impl UnixTransport {
    /// Starts an agent with default options; scratch space under the target dir.
    pub fn start() -> Self {
        Self::start_with(AgentOptions::default(), 1 << 30)
    }

    /// Starts an agent serving the link behind a `sandbox-relay`: the transport of
    /// snapshot-capable VMs, on the host.
    pub fn start_link() -> Self {
        let options = AgentOptions {
            link: true,
            ..AgentOptions::default()
        };
        Self::start_with(options, 256 << 20)
    }

    fn start_with(options: AgentOptions, big_file_bytes: u64) -> Self {
        let scratch = TempDir::new_in(&crate::bins::target_tmp_dir(), "scratch");
        Self {
            agent: TestAgent::start_with(options),
            facts: Facts {
                is_pid1: false,
                scratch_root: scratch.path().to_owned(),
                big_file_bytes,
            },
            _scratch: scratch,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &TestAgent {
        &self.agent
    }
}

impl Transport for UnixTransport {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn connect(&self) -> BoxFuture<'_, Client> {
        Box::pin(self.agent.client())
    }

    fn open_raw(&self) -> BoxFuture<'_, RawConnection> {
        Box::pin(RawConnection::unix(self.agent.socket()))
    }

    fn log_tail(&self) -> String {
        tail(&self.agent.log())
    }
}

/// The agent on a Unix socket behind a real node daemon (`sandboxd --attach`): every
/// client and raw connection is an HTTP/1.1 upgrade through the daemon's data plane,
/// which splices it to the agent. The client presents the node's operator token
/// only; the agent requires a token of its own, which only the daemon holds (it puts
/// it into each `Hello`).
#[derive(Debug)]
pub struct UpgradeTransport {
    // First: the daemon stops before the agent goes.
    node: NodeDaemon,
    agent: UnixTransport,
}

/// The token the [`UpgradeTransport`]'s agent requires; never sent by its clients.
const AGENT_TOKEN: &str = "agent-only-token";

impl UpgradeTransport {
    /// Starts an agent with a token and a daemon attached to it.
    pub fn start() -> Self {
        let options = AgentOptions {
            token: Some(AGENT_TOKEN.to_owned()),
            ..AgentOptions::default()
        };
        let agent = UnixTransport::start_with(options, 1 << 30);
        let url = AgentUrl::Unix(agent.agent().socket().to_owned());
        let node = NodeDaemon::attached(&url, AGENT_TOKEN);
        Self { node, agent }
    }

    async fn client(&self) -> Client {
        let options = ConnectOptions {
            token: Some(self.node.token().to_owned()),
            ..ConnectOptions::default()
        };
        match Client::connect(&self.node.agent_url(), &options).await {
            Ok(client) => client,
            Err(error) => panic!(
                "cannot connect through sandboxd: {}\nsandboxd log:\n{}\nagent log:\n{}",
                sandbox_vmm::error_chain(&error),
                self.node.log_tail(),
                self.log_tail()
            ),
        }
    }
}

impl Transport for UpgradeTransport {
    fn facts(&self) -> &Facts {
        self.agent.facts()
    }

    fn connect(&self) -> BoxFuture<'_, Client> {
        Box::pin(self.client())
    }

    fn open_raw(&self) -> BoxFuture<'_, RawConnection> {
        Box::pin(async move {
            RawConnection::node(&self.node.agent_url(), Some(self.node.token())).await
        })
    }

    fn log_tail(&self) -> String {
        self.agent.log_tail()
    }
}

/// The agent as PID 1 of a real microVM, reached through its launcher. Dropping it
/// powers the guest off and removes its run folder.
#[derive(Debug)]
pub struct VmTransport {
    vm: TestVm,
    facts: Facts,
}

impl VmTransport {
    /// Boots the default template; panics unless the microVM gate is open.
    pub async fn boot() -> Self {
        Self::boot_template(default_template()).await
    }

    /// Boots `template` (from its ready snapshot when it has one); panics unless the
    /// microVM gate is open.
    pub async fn boot_template(template: TemplateRef) -> Self {
        let host = VmHost::get("microvm transport").expect("booted with the gate closed");
        let vm = host.boot(template).await;
        Self {
            vm,
            facts: Facts {
                is_pid1: true,
                scratch_root: Path::new("/tmp/e2e").to_owned(),
                // The guest's /tmp is a tmpfs in its memory.
                big_file_bytes: 64 << 20,
            },
        }
    }
}

impl Transport for VmTransport {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn connect(&self) -> BoxFuture<'_, Client> {
        Box::pin(self.vm.connect())
    }

    fn open_raw(&self) -> BoxFuture<'_, RawConnection> {
        Box::pin(self.vm.raw())
    }

    fn log_tail(&self) -> String {
        tail(&self.vm.console())
    }

    fn token(&self) -> Option<String> {
        Some(self.vm.vm().token().to_owned())
    }

    fn vm(&self) -> Option<&TestVm> {
        Some(&self.vm)
    }
}
