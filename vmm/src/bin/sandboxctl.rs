//! `sandboxctl`: parse arguments, run, turn the result into an exit code. Everything
//! else lives in `sandbox_vmm::cli`.

use std::process::ExitCode;

use clap::Parser;
use sandbox_vmm::cli::{self, Cli};

fn main() -> ExitCode {
    let args = Cli::parse();
    match cli::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("sandboxctl: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
