#!/usr/bin/env bash
# An environment with Hugging Face Optimum's ONNX exporter (optimum-onnx), and print its python:
# the tool that makes the decoder folders `specx import` reads (tests/optimum_models.py builds
# tiny ones with it). optimum-onnx 0.1 pins transformers 4.57, which the main environment's
# transformers 5 replaces, so it lives apart; torch is the same CPU wheel as the main one's.
#   SPECX_OPTIMUM_VENV=path   where to make it (default: .venv-optimum at the repository root)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_OPTIMUM_VENV:-$ROOT/.venv-optimum}"
MAIN="${SPECX_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$MAIN/bin/python" -m venv "$VENV"  # the same Python version as the main environment
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# torch first, pinned: its CPU wheel lies on disk; an open range could pull a multi-GB CUDA build.
"${PIP[@]}" install "torch==2.13.0" >&2
"${PIP[@]}" install "optimum-onnx==0.1.0" "onnxruntime>=1.22" >&2
echo "$VENV/bin/python"
