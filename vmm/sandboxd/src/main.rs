//! `sandboxd`: parse arguments, log to stderr, serve until SIGTERM/SIGINT, and turn
//! the result into an exit code. Everything else lives in the library.

use std::process::ExitCode;

use clap::Parser;
use sandboxd::{Args, Config};
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let config = match Config::from_args(args, |name| std::env::var_os(name)) {
        Ok(config) => config,
        Err(error) => return fail(&anyhow::Error::new(error)),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&anyhow::Error::new(error)),
    };
    let result = runtime.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        sandboxd::run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("sandboxd: {error}");
    for cause in error.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    ExitCode::FAILURE
}
