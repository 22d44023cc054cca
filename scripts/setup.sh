#!/usr/bin/env bash
# Create (or update) the project's virtual environment with everything specx needs:
# the runtime, the exporter (torch CPU 2.13.0, transformers, onnx, gguf, accelerate), the server
# (starlette, uvicorn) and the test tools. Safe to run again: pip skips what is already installed.
#   SPECX_VENV=path   use another environment (default: .venv at the repository root)
#   SPECX_REQUIRE_KERNELS=1   fail where the specx kernels library or libspecx cannot be built
#                     (the test command sets it); otherwise specx installs without them and
#                     runs ONNX Runtime's own kernels (artifacts exported with --kernels ort)
#   --gpu             swap onnxruntime for onnxruntime-gpu (CUDA / TensorRT providers). The two
#                     packages provide the same module and must never be installed together.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# torch first, pinned: its CPU wheel lies on disk; an open range could pull a multi-GB CUDA build.
"${PIP[@]}" install "torch==2.13.0"
"${PIP[@]}" install -e "$ROOT[export,serve,dev]" cmake ninja
# The specx kernels (native/): ONNX Runtime custom ops over GGUF blocks.
if ! "$ROOT/scripts/build_kernels.sh" >/dev/null; then
  if [ -n "${SPECX_REQUIRE_KERNELS:-}" ]; then
    echo "the specx kernels library did not build (above: why)" >&2
    exit 1
  fi
  echo "warning: the specx kernels library was not built (above: why); specx runs without it," \
    "on ONNX Runtime's kernels (--kernels ort)" >&2
fi
if [ "${1:-}" = "--gpu" ]; then
  "${PIP[@]}" uninstall -y onnxruntime onnxruntime-gpu
  "${PIP[@]}" install "onnxruntime-gpu>=1.20"
fi
# libspecx (native/libspecx): the runtime as a C library, for services in other languages;
# built against the onnxruntime wheel installed above (after a --gpu swap: onnxruntime-gpu).
if ! "$ROOT/scripts/build_libspecx.sh" >/dev/null; then
  if [ -n "${SPECX_REQUIRE_KERNELS:-}" ]; then
    echo "libspecx did not build (above: why)" >&2
    exit 1
  fi
  echo "warning: libspecx (the C library) was not built (above: why); the Python runtime" \
    "does not need it" >&2
fi
echo "environment ready: $VENV" >&2
