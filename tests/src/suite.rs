//! The one suite: every scenario of [`crate::scenarios::all`] over every transport
//! of [`TRANSPORTS`], as `libtest-mimic` trials named `TRANSPORT::AREA::NAME`, so a
//! failure names its transport.
//!
//! Each transport is started once, lazily, by its first trial, and shared by all its
//! scenarios (which keep to their own paths and processes): one agent process, one
//! microVM. Trials run on [`TRIAL_THREADS`] threads (or `--test-threads`) over one
//! two-worker runtime. When the microVM gate is closed by
//! `SANDBOX_SKIP_VM_TESTS=1` the microVM trials are *ignored*, and show so in the
//! summary; when something is missing they fail saying what.

use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use tokio::sync::OnceCell;

use crate::scenarios::{self, Scenario};
use crate::transport::{
    BoxFuture, Target, Transport, UnixTransport, UpgradeTransport, VmTransport,
};
use crate::vm::{gate, Gate, SKIP_NOTE};

/// How many trials run at once unless `--test-threads` says otherwise. Not one per
/// host core: the scenarios of a transport share one agent, and a microVM's agent
/// has a vCPU or two under emulation, so more at once only stretches every trial
/// towards its deadlines (the suite took 45 s on two cores with two threads).
pub const TRIAL_THREADS: usize = 2;

/// How long one trial may take before it fails as hung (the 1 GiB round trip on a
/// loaded two-core host is the slowest).
pub const TRIAL_SECS: u64 = 600;

/// One way to run the agent.
#[derive(Debug)]
pub struct TransportKind {
    /// The first part of every trial name.
    pub name: &'static str,
    /// Whether its trials can run here.
    pub gate: fn() -> Gate,
    /// Starts it (called once, by the first trial that needs it).
    pub start: fn() -> BoxFuture<'static, Arc<dyn Transport>>,
}

/// Every transport the suite runs over. Adding a transport is adding an entry here.
pub const TRANSPORTS: &[TransportKind] = &[
    TransportKind {
        name: "unix",
        gate: || Gate::Open,
        start: || Box::pin(async { Arc::new(UnixTransport::start()) as Arc<dyn Transport> }),
    },
    TransportKind {
        name: "link",
        gate: || Gate::Open,
        start: || Box::pin(async { Arc::new(UnixTransport::start_link()) as Arc<dyn Transport> }),
    },
    TransportKind {
        name: "upgrade",
        gate: || Gate::Open,
        start: || Box::pin(async { Arc::new(UpgradeTransport::start()) as Arc<dyn Transport> }),
    },
    TransportKind {
        name: "microvm",
        gate: || gate().clone(),
        start: || Box::pin(async { Arc::new(VmTransport::boot().await) as Arc<dyn Transport> }),
    },
];

/// A transport started on first use. A start that failed stays failed, so its other
/// trials fail at once with the same message instead of trying again (a microVM boot
/// costs seconds of CPU).
struct Started {
    kind: &'static TransportKind,
    cell: OnceCell<Result<Arc<dyn Transport>, String>>,
}

impl Started {
    async fn get(&self) -> Result<Arc<dyn Transport>, String> {
        let start = self.kind.start;
        self.cell
            .get_or_init(|| async move {
                tokio::spawn(start())
                    .await
                    .map_err(|error| match error.try_into_panic() {
                        Ok(panic) => panic_text(panic.as_ref()),
                        Err(error) => error.to_string(),
                    })
            })
            .await
            .clone()
    }
}

/// Builds the trials of every scenario over every transport and runs them; returns
/// the process's exit status.
pub fn main() -> std::process::ExitCode {
    run(TRANSPORTS, scenarios::all())
}

/// Runs `scenarios` over `transports` (each started once, by its first trial), as
/// [`main`] does for the whole suite: for targets that run a part of the list over a
/// transport of their own (a microVM of another template).
pub fn run(
    transports: &'static [TransportKind],
    scenarios: Vec<Scenario>,
) -> std::process::ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads = args.test_threads.or(Some(TRIAL_THREADS));
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("cannot build the suite's runtime"),
    );
    let started: Vec<Arc<Started>> = transports
        .iter()
        .map(|kind| {
            Arc::new(Started {
                kind,
                cell: OnceCell::new(),
            })
        })
        .collect();
    let mut trials = Vec::new();
    for transport in &started {
        let gate = (transport.kind.gate)();
        for scenario in &scenarios {
            trials.push(trial(&runtime, transport, *scenario, &gate));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    // Stop the agents and power the VMs off before the runtime goes.
    runtime.block_on(async move { drop(started) });
    conclusion.exit_code()
}

fn trial(
    runtime: &Arc<tokio::runtime::Runtime>,
    transport: &Arc<Started>,
    scenario: Scenario,
    gate: &Gate,
) -> Trial {
    let name = format!(
        "{}::{}::{}",
        transport.kind.name, scenario.area, scenario.name
    );
    let (runtime, gate) = (runtime.clone(), gate.clone());
    let (transport, started) = (transport.clone(), transport.clone());
    let skipped = gate == Gate::Skipped;
    Trial::ignorable_test(name, move || {
        match gate {
            Gate::Open => {}
            Gate::Skipped => return Ok(Completion::ignored_with(SKIP_NOTE)),
            Gate::Missing(what) => return Err(Failed::from(what)),
        }
        let work = async move {
            let shared = match transport.get().await {
                Ok(shared) => shared,
                Err(why) => panic!("the {} transport did not start: {why}", transport.kind.name),
            };
            let target = Target::new(shared).await;
            (scenario.run)(target).await;
        };
        let task = runtime.spawn(async move {
            tokio::time::timeout(Duration::from_secs(TRIAL_SECS), work).await
        });
        let why = match runtime.block_on(task) {
            Ok(Ok(())) => return Ok(Completion::Completed),
            Ok(Err(_)) => format!("did not finish within {TRIAL_SECS}s"),
            Err(error) => match error.try_into_panic() {
                Ok(panic) => panic_text(panic.as_ref()),
                Err(error) => error.to_string(),
            },
        };
        Err(match started.cell.get() {
            Some(Ok(shared)) => format!(
                "{why}\n---- end of the {} agent's log ----\n{}\n---- end ----",
                started.kind.name,
                shared.log_tail()
            ),
            _ => why,
        }
        .into())
    })
    .with_ignored_flag(skipped)
}

pub use crate::vm::{block_on, vm_main, VmTest};

/// The message of a panic payload.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}
