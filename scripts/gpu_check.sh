#!/usr/bin/env bash
# Every GPU check in one command, for a machine with an NVIDIA GPU:
#   1. what is there (GPU, driver, onnxruntime providers, TensorRT),
#   2. the GPU tests (pytest -m "gpu or tensorrt"; they skip what the machine lacks),
#   3. a short GPU benchmark (scripts/gpu_bench.py) that prints a table.
# It installs nothing from the network. Optional: a folder of wheels (SPECX_WHEELS, default
# ./.whl) with onnxruntime-gpu and/or tensorrt is installed offline into a private folder first.
#   PYTHON=python3 scripts/gpu_check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${SPECX_WHEELS:-$ROOT/.whl}"
SITE="${TMPDIR:-/tmp}/specx-gpu-site"
echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>/dev/null \
  || echo "nvidia-smi not found (Jetson: use tegrastats)"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "== installing wheels from $WHEELS (offline)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
fi
# specx itself from this checkout, without installing it: a package tree of symlinks.
SRC="${TMPDIR:-/tmp}/specx-gpu-src"
mkdir -p "$SRC/specx"
for d in runtime profiles exporter apps; do ln -sfn "$ROOT/$d" "$SRC/specx/$d"; done
export PYTHONPATH="$SITE:$SRC:${PYTHONPATH:-}"
"$PY" - <<'PYEOF'
import importlib.util
import onnxruntime as ort
print("onnxruntime", ort.__version__, "providers:", ", ".join(ort.get_available_providers()))
spec = importlib.util.find_spec("tensorrt")
if spec:
    import tensorrt as trt
    print("tensorrt", trt.__version__, "(builder)" if hasattr(trt, "Builder") else "(no builder)")
else:
    print("tensorrt: not installed (TensorRT tests and engines will be skipped)")
try:
    from specx.runtime.backends.cuda import compute_capability
    print("compute capability", compute_capability())
except Exception as e:  # noqa: BLE001
    print("CUDA runtime:", e)
PYEOF
# libspecx (carried built, e.g. native/libspecx/build) runs on the ONNX Runtime of $PY: its
# libonnxruntime.so.1 link is pointed there, so its CUDA tests use onnxruntime-gpu's providers.
LIBSPECX="$ROOT/native/libspecx/build"
if [ -f "$LIBSPECX/libspecx.so" ]; then
  ORTLIB="$("$PY" -c 'import glob, os, onnxruntime as o; print(sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so.1*")))[-1])')"
  ln -sfn "$ORTLIB" "$LIBSPECX/libonnxruntime.so.1" && echo "libspecx runs on $ORTLIB"
else
  echo "libspecx: not built here (scripts/build_libspecx.sh); its CUDA tests will be skipped"
fi
echo "== GPU tests"
(cd "$ROOT" && "$PY" -m pytest tests -m "gpu or tensorrt" -q -rs -p no:cacheprovider)
TESTS=$?
echo "== GPU benchmark"
"$PY" "$ROOT/scripts/gpu_bench.py"
BENCH=$?
echo "== done: tests exit $TESTS, benchmark exit $BENCH"
exit $(( TESTS != 0 && TESTS != 5 ? TESTS : BENCH ))
