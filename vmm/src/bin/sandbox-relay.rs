//! `sandbox-relay`: the per-VM host relay of a snapshot-capable microVM (see
//! `sandbox_vmm::relay`). The launcher starts it; it prints the agent's `Ready` as
//! one JSON line on stdout when the agent first attaches, closes stdout, and runs
//! until the agent stream ends. Logs go to stderr.
//!
//! Usage: `sandbox-relay --agent SOCKET --listen SOCKET [--connect-timeout-ms N]
//! [--egress-policy FILE --egress-log FILE] [--log FILE]
//! [--console SOCKET --console-log FILE]`. A policy file that does not exist
//! means `net: none`: it is read once, at start (a restored VM gets a new relay).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use sandbox_vmm::egress::EgressConfig;
use sandbox_vmm::relay::log::{RotatingLog, RELAY_LOG_MAX_BYTES};
use sandbox_vmm::relay::{self, RelayConfig};

fn main() -> ExitCode {
    let (config, log) = match parse(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("sandbox-relay: {message}\nusage: sandbox-relay --agent SOCKET --listen SOCKET [--connect-timeout-ms N] [--egress-policy FILE --egress-log FILE] [--log FILE] [--console SOCKET --console-log FILE]");
            return ExitCode::from(2);
        }
    };
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    // `--log FILE` (what the launcher passes; stderr is that file too): rotated at
    // its cap, stderr following it. Without: stderr as it is.
    let rotating = log.map(|path| RotatingLog::open(&path, RELAY_LOG_MAX_BYTES, true));
    match rotating {
        Some(Ok(log)) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(move || log.clone())
                .with_ansi(false)
                .try_init();
        }
        other => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .try_init();
            if let Some(Err(error)) = other {
                tracing::warn!(%error, "cannot open the log file; logging to stderr unrotated");
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandbox-relay: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(relay::run(&config, |ready| {
        let mut stdout = std::io::stdout().lock();
        let line = serde_json::to_string(ready).unwrap_or_default();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
        // Close stdout so the launcher's read ends; the relay goes on.
        close_stdout();
    }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbox-relay: {}", sandbox_vmm::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(RelayConfig, Option<PathBuf>), String> {
    let (mut agent, mut listen, mut log_file) = (None, None, None);
    let (mut console, mut console_log) = (None::<PathBuf>, None::<PathBuf>);
    let (mut policy, mut log) = (None::<PathBuf>, None::<PathBuf>);
    let mut connect_timeout = Duration::from_secs(10);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--agent" => agent = Some(PathBuf::from(value()?)),
            "--listen" => listen = Some(PathBuf::from(value()?)),
            "--connect-timeout-ms" => {
                let ms = value()?;
                let ms: u64 = ms.parse().map_err(|_| format!("bad milliseconds {ms:?}"))?;
                connect_timeout = Duration::from_millis(ms);
            }
            "--egress-policy" => policy = Some(PathBuf::from(value()?)),
            "--egress-log" => log = Some(PathBuf::from(value()?)),
            "--log" => log_file = Some(PathBuf::from(value()?)),
            "--console" => console = Some(PathBuf::from(value()?)),
            "--console-log" => console_log = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let egress = match (policy, log) {
        (None, None) => None,
        (Some(policy), Some(log)) => sandbox_vmm::egress::read_policy(&policy)
            .map_err(|error| sandbox_vmm::error_chain(&error))?
            .map(|policy| EgressConfig { policy, log }),
        _ => return Err("--egress-policy and --egress-log go together".into()),
    };
    let config = RelayConfig {
        agent: agent.ok_or("--agent is required")?,
        listen: listen.ok_or("--listen is required")?,
        connect_timeout,
        egress,
        console: match (console, console_log) {
            (None, None) => None,
            (Some(socket), Some(log)) => Some((socket, log)),
            _ => return Err("--console and --console-log go together".into()),
        },
    };
    Ok((config, log_file))
}

/// Points stdout at /dev/null, closing the pipe the launcher reads.
fn close_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1);
    }
}
