//! `sandbox-mcp`: parse arguments, set up logging to stderr, run the server until
//! the client disconnects or SIGTERM/SIGINT arrives, and turn the result into an exit
//! code. Everything else lives in the library.

use std::process::ExitCode;
use std::time::Duration;

use sandbox_mcp::logging::ClientLog;
use sandbox_mcp::{Args, Config};
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// How long runtime shutdown waits for blocking work (a stdin read that cannot be
/// cancelled) after every sandbox is gone.
const RUNTIME_SHUTDOWN_MS: u64 = 200;

fn main() -> ExitCode {
    let args = Args::parse_normalized();
    let log = ClientLog::default();
    init_logging(&log);
    let config = match Config::from_args(args, |name| std::env::var_os(name)) {
        Ok(config) => config,
        Err(error) => return fail(&error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error),
    };
    let result = runtime.block_on(async {
        let shutdown = match shutdown_signal() {
            Ok(shutdown) => shutdown,
            Err(error) => return Err(anyhow::Error::new(error)),
        };
        sandbox_mcp::run(config, log, shutdown)
            .await
            .map_err(anyhow::Error::new)
    });
    runtime.shutdown_timeout(Duration::from_millis(RUNTIME_SHUTDOWN_MS));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error.as_ref()),
    }
}

/// Resolves on the first SIGTERM or SIGINT.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Logs go to stderr (stdout carries the protocol), filtered by `RUST_LOG` (default
/// info), and to the MCP client at the level it sets ([`ClientLog`]), whatever
/// `RUST_LOG` says.
fn init_logging(log: &ClientLog) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(filter);
    // Only this crate's events (see `sandbox_mcp::logging::forwards`): what the
    // client is sent must not itself log into the client (rmcp's events).
    let client = log
        .layer()
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            sandbox_mcp::logging::forwards(meta.target())
        }));
    tracing_subscriber::registry()
        .with(stderr)
        .with(client)
        .init();
}

fn fail(error: &(dyn std::error::Error + 'static)) -> ExitCode {
    eprintln!("sandbox-mcp: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        eprintln!("  caused by: {cause}");
        source = cause.source();
    }
    ExitCode::FAILURE
}
