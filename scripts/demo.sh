#!/usr/bin/env bash
# The main job: build the default template (Debian's cloud kernel + the static agent as
# PID 1 + busybox), boot it in a QEMU microVM, run a command in it over its virtio-serial
# link (sandbox-relay, built with sandbox-vmm, serves it on the host),
# and shut the VM down.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --release --locked -p sandbox-rootfs -p sandboxctl -p sandbox-vmm --bins
target/release/sandbox-rootfs build
target/release/sandboxctl vm run -- uname -a
