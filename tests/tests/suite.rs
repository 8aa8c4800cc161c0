//! Every transport-independent scenario (`sandbox_tests::scenarios`) over every
//! transport (`sandbox_tests::suite::TRANSPORTS`): the agent on a Unix socket, behind
//! a relay's link, behind a node daemon's HTTP upgrade (`upgrade`), and as PID 1 of a
//! real microVM. Trials are named `TRANSPORT::AREA::NAME`;
//! `cargo test -p sandbox-tests --test suite -- unix::` runs one transport.
//!
//! The microVM trials need QEMU, `vhost-device-vsock` and the default template
//! (`sandbox_tests::vm::gate`); `SANDBOX_SKIP_VM_TESTS=1` marks them ignored.

fn main() -> std::process::ExitCode {
    sandbox_tests::suite::main()
}
