#!/usr/bin/env bash
# Debian's ARM64 cross compiler and qemu-user, for the kernels' NEON tests
# (scripts/build_kernels.sh --test). Installs them with apt-get where they are missing; needs
# root (or sudo without a password). Exits 1 saying why where it cannot.
set -euo pipefail
if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null && sudo -n true 2>/dev/null || {
    echo "setup_cross: installing g++-aarch64-linux-gnu and qemu-user needs root" >&2; exit 1; }
  SUDO=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get install -y -q --no-install-recommends g++-aarch64-linux-gnu qemu-user >&2 || {
  "${SUDO[@]}" apt-get update -q >&2
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends g++-aarch64-linux-gnu qemu-user >&2
}
