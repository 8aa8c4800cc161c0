#!/usr/bin/env bash
# Runs every test: formatting, lints, unit tests, and the end-to-end tests (the real
# agent on Unix sockets and as PID 1 of a namespace, real microVMs under QEMU, the MCP
# server driven by a real MCP client). Installs what is missing and builds the
# default template first.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --bins --locked
# The microVM tests boot the default template: build it from this checkout's agent.
target/debug/sandbox-rootfs build
cargo test --workspace --locked --no-fail-fast
scripts/fuzz.sh --smoke  # fuzz targets (fuzz/): replay the committed corpus, fuzz each 20 s
