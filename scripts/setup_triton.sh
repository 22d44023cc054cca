#!/usr/bin/env bash
# An environment for Triton's Python backend to run specx in, and print its python.
# The backend stub of the tritonserver that scripts/fetch_tritonserver.sh fetches (nvidia-pytriton
# 0.7) was built against numpy 1.x: with numpy 2 its string tensors come out corrupted. So this
# environment has the runtime's dependencies with numpy < 2, and specx from this checkout.
#   SPECX_TRITON_VENV=path   where to make it (default: .venv-triton at the repository root)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_TRITON_VENV:-$ROOT/.venv-triton}"
MAIN="${SPECX_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$MAIN/bin/python" -m venv "$VENV"  # the same Python version as the main environment
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install "numpy>=1.24,<2" "onnxruntime>=1.22" "tokenizers>=0.19" "jinja2>=3.1" \
  "click>=8.1" >&2
"${PIP[@]}" install --no-deps -e "$ROOT" >&2
echo "$VENV/bin/python"
