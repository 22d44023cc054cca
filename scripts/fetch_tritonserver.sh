#!/usr/bin/env bash
# Fetch a Triton Inference Server that runs here (CPU, Python backend) for the Triton tests: the
# PyPI package nvidia-pytriton ships a tritonserver binary with the Python backend and its stubs.
# The wheel is unpacked, not installed (its own dependencies pin numpy < 2), and the backend stub
# for this environment's Python version is put into backends/python. Prints the path of the
# tritonserver binary; the backends are in ../backends beside it. Cached under $SPECX_CACHE.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_VENV:-$ROOT/.venv}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
VERSION="0.7.0"
DIR="$CACHE/pytriton-$VERSION"
SERVER="$DIR/pytriton/tritonserver/bin/tritonserver"
PYVER="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
STUB="$DIR/pytriton/tritonserver/backends/python/triton_python_backend_stub"
if [ ! -x "$SERVER" ] || [ ! -f "$STUB.$PYVER" ]; then
  mkdir -p "$CACHE/wheels"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps \
    "nvidia-pytriton==$VERSION" -d "$CACHE/wheels" >&2
  rm -rf "$DIR"
  "$VENV/bin/python" - "$CACHE" "$DIR" "$VERSION" <<'PY'
import sys, zipfile, pathlib
cache, target, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = sorted((cache / "wheels").glob(f"nvidia_pytriton-{version}-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        path = z.extract(info, target)
        mode = info.external_attr >> 16
        if mode:
            pathlib.Path(path).chmod(mode & 0o777)
PY
  cp "$DIR/pytriton/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub" "$STUB"
  chmod +x "$STUB" "$SERVER"
  touch "$STUB.$PYVER"
fi
echo "$SERVER"
