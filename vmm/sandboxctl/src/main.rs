//! `sandboxctl`: the command line of the sandbox, built on the `sandbox-vmm` client and
//! launcher. This crate owns everything a front end owns and a library must not:
//! argument parsing, what goes to stdout and stderr, exit codes, and logging.
//!
//! # How a run goes
//! `main` parses the arguments ([`args`]), sets up logging ([`logging`]) and calls
//! [`run::run`], which starts a one-thread runtime, connects to the agent (or, for
//! `vm` and `doctor`, to nothing) and hands the client to one command module. The
//! command writes through [`output`] and returns the exit code; `main` turns an error
//! into `sandboxctl: …` lines on stderr and exit code 1, except a closed stdout or
//! stderr, which is a normal end (`sandboxctl ps | head`).
//!
//! Exit codes: a command's own code for `exec`/`sh`/`shell`/`attach`/`vm run` (128+N
//! when killed by signal N, 124 on timeout; 127 when the command is not found, 126 when
//! it cannot be run: not executable, a directory, a bad `--cwd` or `--user`, as
//! `docker exec` and `kubectl exec` exit); 124 when `wait-for` times out; for `eval` see [`eval`]; 0 for the
//! rest on success, and when the reader of our output went away; 1 when the tool
//! itself fails (bad URL, agent unreachable, agent error); 125 when the VM behind
//! `--vm ID` is not running (its guest powered off or panicked; the message quotes
//! its console).
//!
//! Logging: `tracing` events (the launcher's and the client's among them) go to
//! stderr at `warn` and above; `SANDBOX_LOG` takes an `EnvFilter` directive instead
//! (`SANDBOX_LOG=debug`, `SANDBOX_LOG=sandbox_vmm=trace`).
//!
//! # Layout
//! - [`args`]: the clap types and the parsers clap calls (modes, signals, `K=V`).
//! - [`run`]: the runtime, connecting (`--agent`, `--vm`, `--wait`), dispatch, and
//!   what commands share (building a `ProcessSpec`, exit bytes).
//! - [`output`]: writing to stdout and stderr, and telling a closed pipe from a failure.
//! - [`logging`]: the `tracing` subscriber on stderr.
//! - Commands: [`exec`] (`exec`, `sh`, `spawn`), [`eval`] (`eval`, `close-session`:
//!   interpreter sessions), [`procs`] (`ps`, `kill`), [`logs`],
//!   [`wait`] (`wait-for`),
//!   [`files`] (`put`, `get`, `cat`, `write`, `ls`, `stat`, `rm`, `mkdir`), [`system`]
//!   (the guest-wide `resume` and `shutdown`), [`shell`] (`shell`, `attach`) on
//!   [`terminal`] (raw mode, window size, stdin pump), [`info`], [`port_forward`], [`vm`]
//!   (`vm run|start|ls|stop`, `--vm ID`), [`snapshot`] (`vm checkpoint|branch|fork|
//!   checkpoints|rm-checkpoint`), [`doctor`], [`node`] (`--node ADDR`: the same
//!   commands through a node daemon, and `node info|drain|uncordon|rm-template`).
//! - [`json`]: the JSON views of protocol types for `--json`.

mod args;
mod doctor;
mod eval;
mod exec;
mod files;
mod info;
mod json;
mod logging;
mod logs;
mod node;
mod output;
mod port_forward;
mod procs;
mod run;
mod shell;
mod snapshot;
mod system;
mod terminal;
mod vm;
mod wait;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    logging::init();
    match run::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(error) if output::is_closed_output(&error) => ExitCode::SUCCESS,
        Err(error) if error.chain().any(|cause| cause.is::<vm::VmGone>()) => {
            // The VM's end is the news; what the command saw (a lost connection) is
            // its consequence.
            for cause in error.chain().filter(|cause| cause.is::<vm::VmGone>()) {
                eprintln!("sandboxctl: {cause}");
            }
            eprintln!("  (the command failed with: {error})");
            ExitCode::from(vm::EXIT_VM_GONE)
        }
        Err(error) => {
            eprintln!("sandboxctl: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
