#!/usr/bin/env bash
# The main job: build the default template (Debian's cloud kernel + the static agent as
# PID 1 + busybox), boot it in a QEMU microVM, run a command in it over virtio-vsock,
# and shut the VM down.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --release --locked -p sandbox-rootfs -p sandboxctl --bins
target/release/sandbox-rootfs build
target/release/sandboxctl vm run -- uname -a
