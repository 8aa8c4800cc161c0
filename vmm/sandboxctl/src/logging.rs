//! The `tracing` subscriber: events from this tool, the client and the launcher (a
//! QEMU that survived SIGKILL, a guest that refused to power off) go to stderr, so
//! nothing they report is lost and stdout stays the command's output.

use anstream::{AutoStream, ColorChoice};
use tracing_subscriber::EnvFilter;

/// The variable that overrides [`DEFAULT_FILTER`], in `EnvFilter` syntax.
pub const LOG_ENV: &str = "SANDBOX_LOG";

/// Warnings and errors only: a person reading a command's output wants the launcher's
/// warnings, not its progress. `SANDBOX_LOG=info` (or `debug`) shows the rest.
const DEFAULT_FILTER: &str = "warn";

/// Installs the subscriber. An unparsable `SANDBOX_LOG` falls back to the default,
/// with a note, rather than failing the command.
pub fn init() {
    let filter = match std::env::var(LOG_ENV) {
        Ok(directives) => EnvFilter::try_new(&directives).unwrap_or_else(|error| {
            eprintln!("sandboxctl: ignoring {LOG_ENV}={directives:?}: {error}");
            EnvFilter::new(DEFAULT_FILTER)
        }),
        Err(_) => EnvFilter::new(DEFAULT_FILTER),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(stderr_wants_colour())
        .try_init();
}

/// Colour only for a person at a terminal, and never with `NO_COLOR`: the rule clap
/// applies to its own messages (also `CLICOLOR_FORCE`, `TERM=dumb`), so a redirected
/// stderr gets no escape codes.
fn stderr_wants_colour() -> bool {
    AutoStream::choice(&std::io::stderr()) != ColorChoice::Never
}
