#!/usr/bin/env bash
# Set up ONNX Runtime GenAI (CPU) as a benchmark peer of specx, in its OWN virtual environment
# (onnxruntime-genai pulls its own onnxruntime, which must not meet the one in .venv), and build
# a model pair with GenAI's own model builder from the same GGUF weights specx exports.
#
#   scripts/setup_genai.sh [MODEL]
#     MODEL  smollm2     SmolLM2-135M-Instruct: an fp32 target and an int4 draft (default)
#            qwen-coder  Qwen2.5-Coder-1.5B-Instruct int4 target, 0.5B int4 draft
#            env         the environment only: print its python (the `specx import` tests run
#                        GenAI's builder from it on tiny models, tests/genai_models.py)
#     SPECX_GENAI_VENV     the environment (default .venv-genai at the repository root)
#     SPECX_CACHE          cache root (default ~/.cache/specx)
#
# The pair lands in $SPECX_CACHE/genai/MODEL/ as target-<precision>/ and draft-int4/, with
# source.json naming the GGUF files it was made from: `specx bench --peers genai` finds the folder
# whose source is the artifact's own target (or takes --genai-models / SPECX_GENAI_MODELS).
# GenAI's builder reads plain Hugging Face folders, made from the GGUFs by scripts/gguf_to_hf.py
# into $SPECX_CACHE/hf/. Idempotent: an existing environment, HF folder or built model
# (genai_config.json present) is kept. Prints the pair's folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_GENAI_VENV:-$ROOT/.venv-genai}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
MODEL="${1:-smollm2}"
OUT="$CACHE/genai/$MODEL"
PY="$VENV/bin/python"

case "$MODEL" in
  env) ;;
  smollm2)
    TARGET_GGUF="$(SPECX_CACHE="$CACHE" "$ROOT/scripts/fetch_smollm2.sh")"
    DRAFT_GGUF="$TARGET_GGUF"  # the int4 draft is the same weights, quantized by the builder
    TARGET_PRECISION=fp32 ;;
  qwen-coder)
    mapfile -t PAIR < <(SPECX_CACHE="$CACHE" "$ROOT/scripts/fetch_qwen_coder.sh")
    DRAFT_GGUF="${PAIR[0]}" TARGET_GGUF="${PAIR[1]}"
    TARGET_PRECISION=int4 ;;
  *)
    echo "setup_genai.sh: unknown model '$MODEL' (choose smollm2 or qwen-coder)" >&2; exit 2 ;;
esac

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check -q)
if ! "$PY" -c "import onnxruntime_genai, onnx_ir, onnx, transformers, torch" 2>/dev/null; then
  # torch pinned: its CPU wheel lies on local disk; an open range pulls a multi-GB CUDA build.
  "${PIP[@]}" install "torch==2.13.0" >&2
  "${PIP[@]}" install onnxruntime-genai onnx onnx_ir transformers numpy >&2
fi
"$PY" -c "import onnxruntime_genai as og, onnxruntime as ort; print('onnxruntime-genai', og.__version__, '/ onnxruntime', ort.__version__)" >&2
if [ "$MODEL" = env ]; then
  echo "$PY"
  exit 0
fi

# hf_folder GGUF: a plain Hugging Face folder of the GGUF's weights (float32), made once.
hf_folder() {
  local gguf="$1" hf
  hf="$CACHE/hf/$(basename "$gguf" .gguf)"
  if [ ! -f "$hf/config.json" ]; then
    echo "converting $gguf to $hf" >&2
    "$ROOT/.venv/bin/python" "$ROOT/scripts/gguf_to_hf.py" "$gguf" "$hf" >&2
  fi
  echo "$hf"
}

# build NAME GGUF PRECISION: the builder reads the HF folder offline.
# (Its --help crashes; options: -i input folder, -o output, -p precision, -e provider,
#  -c cache dir, --extra_options key=value ...)
build() {
  local name="$1" gguf="$2" precision="$3" hf
  if [ -f "$OUT/$name/genai_config.json" ]; then
    echo "have $OUT/$name" >&2; return
  fi
  hf="$(hf_folder "$gguf")"
  echo "building $OUT/$name ($precision, cpu; log in $OUT/$name.log)" >&2
  mkdir -p "$OUT"
  if ! HF_HUB_OFFLINE=1 "$PY" -m onnxruntime_genai.models.builder \
      -i "$hf" -o "$OUT/$name" -p "$precision" -e cpu -c "$OUT/.builder-cache" \
      >"$OUT/$name.log" 2>&1; then
    tail -n 20 "$OUT/$name.log" >&2; rm -rf "$OUT/$name"; exit 1
  fi
  rm -rf "$OUT/.builder-cache"
}
build "target-$TARGET_PRECISION" "$TARGET_GGUF" "$TARGET_PRECISION"
build draft-int4 "$DRAFT_GGUF" int4
"$PY" - "$OUT/source.json" "$TARGET_GGUF" "$DRAFT_GGUF" <<'PY'
import json, os, sys
out, target, draft = sys.argv[1:]
json.dump({"target": os.path.realpath(target), "draft": os.path.realpath(draft)}, open(out, "w"))
PY
echo "$OUT"
