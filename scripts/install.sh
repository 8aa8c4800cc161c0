#!/usr/bin/env bash
# Installs sandbox-mcp, sandboxctl, sandboxd (the node daemon) and sandbox-relay
# (the per-VM host end of the serial link, which all find next to themselves) from this checkout with
# `cargo install --path ... --locked --root PREFIX`, into PREFIX/bin.
#
#   scripts/install.sh                      # into ~/.cargo/bin (on PATH after rustup)
#   scripts/install.sh --prefix /usr/local  # into /usr/local/bin, for every user
#   scripts/install.sh --debug              # a debug build (faster to build, slower to run)
#
# PREFIX defaults to $CARGO_HOME (~/.cargo). The builds use the workspace's target
# folder, so a second install only relinks. The VMs also need what scripts/setup.sh
# installs (QEMU, vhost-device-vsock) and a template: `target/debug/sandbox-rootfs
# build` in this checkout (scripts/demo.sh does both).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix="${CARGO_HOME:-$HOME/.cargo}"
profile=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a folder}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --debug) profile=(--debug); shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in
  /*) ;;
  *) prefix="$PWD/$prefix" ;;
esac

install() {
  cargo install --locked --force --root "$prefix" "${profile[@]}" "$@"
}
install --path mcp
install --path vmm/sandboxctl
install --path vmm/sandboxd
install --path vmm --bin sandbox-relay

echo "installed into $prefix/bin: sandbox-mcp sandboxctl sandboxd sandbox-relay"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not on PATH; add it, or name the full path in .mcp.json" >&2 ;;
esac
