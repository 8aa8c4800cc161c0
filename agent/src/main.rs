//! `sandbox-agent`: parse arguments, set up logging (and, as PID 1, the guest), run.
//!
//! As PID 1 the process must never exit: every way out of [`run_as_init`] ends in an
//! orderly power-off, and a panic on the main thread is caught and does the same.

// System calls belong in the library's `sys` module.
#![deny(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sandbox_agent::config::{Args, Config};
use sandbox_agent::init::{self, PowerAction};
use sandbox_agent::{ready, run};
use tokio::signal::unix::{signal, SignalKind};

/// Time processes get between SIGTERM and SIGKILL at power-off.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    sandbox_agent::sys::return_large_allocations_to_the_kernel();
    sandbox_agent::sys::raise_open_file_limit();
    if init::is_pid1() {
        let action = std::panic::catch_unwind(run_as_init).unwrap_or_else(|panic| {
            // Not eprintln!: it panics when the console is gone, and this is outside
            // catch_unwind, where a panic would end PID 1 and the guest kernel.
            let _ = writeln!(
                std::io::stderr(),
                "sandbox-agent: fatal panic as init: {panic:?}; powering off"
            );
            PowerAction::PowerOff
        });
        init::power_off(SHUTDOWN_GRACE, action)
    }
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    if let Err(error) = sandbox_agent::sys::set_child_subreaper() {
        eprintln!("sandbox-agent: cannot become a child subreaper: {error}");
    }
    let config = Config::new(args, None);
    init_logging(&config.log);
    match runtime().and_then(|rt| rt.block_on(serve(config))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbox-agent: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The agent as the guest's init: prepare the guest, serve, and power off (or reboot,
/// when a shutdown request asked for it) at the end.
fn run_as_init() -> PowerAction {
    let (boot, early) = init::early();
    // The kernel passes unknown command-line words to init; they must not stop it.
    let (args, unparsed) = match Args::try_parse() {
        Ok(args) => (args, None),
        Err(error) => (Args::parse_from(["sandbox-agent"]), Some(error)),
    };
    let config = Config::new(args, Some(&boot));
    init_logging(&config.log);
    if let Some(error) = unparsed {
        tracing::warn!(%error, "init arguments ignored; using the kernel command line only");
    }
    if let Err(error) = init::prepare(&boot, early) {
        tracing::error!(error = %init::ErrorChain(&error), "guest preparation failed");
        return PowerAction::PowerOff;
    }
    // Over the link, the `Attached` answer to a host is the readiness.
    let ready_port = boot.ready_port.filter(|_| boot.serial.is_none());
    let served = runtime().and_then(|rt| {
        let served = rt.block_on(async move {
            let (listening_tx, listening_rx) = tokio::sync::oneshot::channel();
            let notifier = tokio::spawn(async move {
                if let (Some(port), Ok(boot_id)) = (ready_port, listening_rx.await) {
                    ready::notify_host(port, &ready::ready_message(boot_id)).await;
                }
            });
            let result = run(config, init_shutdown_signal(), |agent| {
                let _ = listening_tx.send(agent.boot_id.clone());
            })
            .await;
            notifier.abort();
            result.map_err(anyhow::Error::from)
        });
        // Blocking file work still running must not hold up the power-off.
        rt.shutdown_timeout(Duration::from_secs(1));
        served
    });
    match served {
        Ok(agent) => agent.requested_shutdown().unwrap_or(PowerAction::PowerOff),
        Err(error) => {
            tracing::error!("{error:#}");
            PowerAction::PowerOff
        }
    }
}

/// The agent as an ordinary process: serve, then stop every process it started.
async fn serve(config: Config) -> anyhow::Result<()> {
    let agent = run(config, shutdown_signal(), |_| {}).await?;
    tracing::info!("shutting down");
    agent.table.kill_all();
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = int.recv() => tracing::info!("SIGINT"),
            }
        }
        _ => {
            tracing::error!(
                "cannot watch SIGTERM/SIGINT; only a shutdown request will stop the agent"
            );
            std::future::pending::<()>().await;
        }
    }
}

/// As init: SIGTERM or SIGINT, and the signals busybox's `halt` (SIGUSR1) and
/// `poweroff` (SIGUSR2) send to PID 1. Each powers the guest off (busybox's `reboot`
/// sends SIGTERM; a microVM has nothing to reboot into, QEMU runs with -no-reboot).
async fn init_shutdown_signal() {
    let halt = signal(SignalKind::user_defined1());
    let power_off = signal(SignalKind::user_defined2());
    match (halt, power_off) {
        (Ok(mut halt), Ok(mut power_off)) => {
            tokio::select! {
                () = shutdown_signal() => {}
                _ = halt.recv() => tracing::info!("SIGUSR1 (halt)"),
                _ = power_off.recv() => tracing::info!("SIGUSR2 (poweroff)"),
            }
        }
        _ => {
            tracing::error!("cannot watch SIGUSR1/SIGUSR2: `halt` and `poweroff` will not work");
            shutdown_signal().await;
        }
    }
}

/// One thread runs everything (blocking file work goes to tokio's blocking pool, and
/// `resumed`/`reidentify` to init's machine thread, `machine::worker`): a
/// request then never hops between threads, which in a 1-vCPU guest under TCG cut
/// the bare request round trip over vsock from about 540 µs to 450 µs.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `filter` is a list of `target=level` directives (`info`, `sandbox_agent=debug`):
/// `tracing_subscriber`'s `Targets`, which needs no regular-expression engine in PID 1
/// (`EnvFilter`'s span and field filters would add one, a fifth of the binary).
fn init_logging(filter: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter: tracing_subscriber::filter::Targets = filter.parse().unwrap_or_else(|_| {
        tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO)
    });
    // Colours only for a person at a terminal (and never with NO_COLOR), not on a
    // serial console or in a log file.
    let ansi = anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never
        && !init::is_pid1();
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = tracing_subscriber::registry()
        .with(format)
        .with(filter)
        .try_init();
}
