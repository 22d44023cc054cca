#!/usr/bin/env bash
# Build llama.cpp (CPU, Release) as a benchmark peer of specx: `specx bench` runs its
# llama-server on the artifact's own GGUF files (apps/bench/llamacpp_peer.py).
#
#   scripts/setup_llamacpp.sh          prints the path of llama-server
#     SPECX_CACHE            cache root (default ~/.cache/specx); the build goes to
#                            $SPECX_CACHE/llama.cpp/ (kept: a second run only prints the path)
#     SPECX_LLAMACPP_VERSION llama-cpp-python release whose sdist vendors the source (0.3.36:
#                            llama.cpp commit 0c1e570)
#
# No prebuilt llama.cpp is on PyPI; the llama-cpp-python sdist vendors its source. The UI and
# OpenSSL flags keep the build offline (without them it tries to download a web UI). It takes
# minutes (how long it took on a 2-core VM: docs/bench/measurements.md). The binaries use this
# CPU's instruction set (GGML_NATIVE): build them on the machine that benchmarks. On a CPU with
# AMX the native build's llama-server segfaulted at start in these VMs, so there the ISA is named
# instead (AVX2, FMA, F16C and the AVX-512 parts the CPU has), without AMX.
#     SPECX_LLAMACPP_CMAKE_ARGS  more cmake arguments (e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
VERSION="${SPECX_LLAMACPP_VERSION:-0.3.36}"
OUT="$CACHE/llama.cpp"
SERVER="$OUT/bin/llama-server"
if [ -x "$SERVER" ]; then
  echo "$SERVER"
  exit 0
fi
PY="${SPECX_VENV:-$ROOT/.venv}/bin/python"
[ -x "$PY" ] || PY=python3
WORK="$(mktemp -d "${TMPDIR:-/tmp}/specx-llamacpp.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
  "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$SRC/CMakeLists.txt" ] || { echo "no vendored llama.cpp in the sdist" >&2; exit 1; }
ISA=()
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
  for flag in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
    if grep -qw "${flag%%:*}" /proc/cpuinfo; then ISA+=("-DGGML_${flag##*:}=ON"); fi
  done
  echo "AMX CPU: building llama.cpp for ${ISA[*]} (no AMX)" >&2
fi
# shellcheck disable=SC2086  # SPECX_LLAMACPP_CMAKE_ARGS is a list of arguments
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF "${ISA[@]}" ${SPECX_LLAMACPP_CMAKE_ARGS:-} >&2
cmake --build "$WORK/build" -j "$(nproc)" --target llama-server llama-bench >&2
mkdir -p "$OUT.partial/bin"
cp "$WORK/build/bin/llama-server" "$WORK/build/bin/llama-bench" "$OUT.partial/bin/"
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
echo "$SERVER"
