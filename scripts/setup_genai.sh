#!/usr/bin/env bash
# Set up ONNX Runtime GenAI (CPU) as a benchmark peer of specx, in its OWN virtual environment
# (onnxruntime-genai pulls its own onnxruntime, which must not meet the one in .venv), and
# build SmolLM2-135M-Instruct with GenAI's model builder: an fp32 target and an int4 draft.
#
#   scripts/setup_genai.sh [HF_FOLDER]
#     HF_FOLDER            plain Hugging Face folder of the model (default $SPECX_CACHE/smollm2-hf;
#                          made from the GGUF by scripts/gguf_to_hf.py if missing)
#     SPECX_GENAI_VENV     the environment (default .venv-genai at the repository root)
#     SPECX_CACHE          cache root (default ~/.cache/specx); models go to $SPECX_CACHE/genai/
#
# Idempotent: an existing environment, HF folder or built model (genai_config.json present) is kept.
# Then run:  $SPECX_GENAI_VENV/bin/python apps/bench/data/genai_runner.py --target .../target-fp32 ...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_GENAI_VENV:-$ROOT/.venv-genai}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
HF="${1:-$CACHE/smollm2-hf}"
OUT="$CACHE/genai"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check -q)
if ! "$PY" -c "import onnxruntime_genai, onnx_ir, onnx, transformers, torch" 2>/dev/null; then
  # torch pinned: its CPU wheel lies on local disk; an open range pulls a multi-GB CUDA build.
  "${PIP[@]}" install "torch==2.13.0"
  "${PIP[@]}" install onnxruntime-genai onnx onnx_ir transformers numpy
fi
"$PY" -c "import onnxruntime_genai as og, onnxruntime as ort; print('onnxruntime-genai', og.__version__, '/ onnxruntime', ort.__version__)" >&2

if [ ! -f "$HF/config.json" ]; then
  GGUF="$(SPECX_CACHE="$CACHE" "$ROOT/scripts/fetch_smollm2.sh")"
  "$ROOT/.venv/bin/python" "$ROOT/scripts/gguf_to_hf.py" "$GGUF" "$HF"
fi

# build NAME PRECISION [extra builder options]; the builder reads the HF folder offline.
# (Its --help crashes; options: -i input folder, -o output, -p precision, -e provider,
#  -c cache dir, --extra_options key=value ...)
build() {
  local name="$1" precision="$2"; shift 2
  if [ -f "$OUT/$name/genai_config.json" ]; then
    echo "have $OUT/$name" >&2; return
  fi
  echo "building $OUT/$name ($precision, cpu; log in $OUT/$name.log)" >&2
  mkdir -p "$OUT"
  if ! HF_HUB_OFFLINE=1 "$PY" -m onnxruntime_genai.models.builder \
      -i "$HF" -o "$OUT/$name" -p "$precision" -e cpu -c "$OUT/.builder-cache" "$@" \
      >"$OUT/$name.log" 2>&1; then
    tail -n 20 "$OUT/$name.log" >&2; exit 1
  fi
}
build target-fp32 fp32
build draft-int4 int4
echo "$OUT/target-fp32"
echo "$OUT/draft-int4"
