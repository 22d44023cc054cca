#!/usr/bin/env bash
# Print a folder holding ONNX Runtime's C and C++ headers (onnxruntime_c_api.h, ...), for the
# kernels library (native/). ORT_INCLUDE_DIR wins where set. Else Debian's libonnxruntime-dev
# (suite trixie, API version 21) is fetched by name and unpacked, never installed: a private apt
# configuration whose one source is this machine's own Debian archive with the suite trixie.
# A custom-op library built against older headers runs in newer runtimes (the API is versioned).
# Cached in ~/.cache/specx/ort-headers; exits 1 (saying why on stderr) where none can be had.
set -euo pipefail
if [ -n "${ORT_INCLUDE_DIR:-}" ]; then
  [ -f "$ORT_INCLUDE_DIR/onnxruntime_c_api.h" ] || {
    echo "ORT_INCLUDE_DIR=$ORT_INCLUDE_DIR holds no onnxruntime_c_api.h" >&2; exit 1; }
  echo "$ORT_INCLUDE_DIR"; exit 0
fi
CACHE="${SPECX_CACHE:-$HOME/.cache/specx}/ort-headers"
FOUND="$(find "$CACHE/root" -name onnxruntime_c_api.h -print -quit 2>/dev/null || true)"
if [ -n "$FOUND" ]; then dirname "$FOUND"; exit 0; fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null || {
  echo "no apt-get/dpkg here to fetch libonnxruntime-dev: set ORT_INCLUDE_DIR" >&2; exit 1; }
URI="$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
[ -n "$URI" ] || URI="$(sed -n 's/^deb \(http[^ ]*debian\) .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -1)"
[ -n "$URI" ] || URI="http://deb.debian.org/debian"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
WORK="$CACHE/apt"
rm -rf "$WORK" && mkdir -p "$WORK/sources" "$WORK/lists/partial" "$WORK/cache/archives/partial"
cat > "$WORK/sources/trixie.sources" <<SRC
Types: deb
URIs: $URI
Suites: trixie
Components: main
Signed-By: $KEYRING
SRC
APT=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$WORK/sources"
  -o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK/cache" -o Debug::NoLocking=1
  -o APT::Sandbox::User=root)
apt-get "${APT[@]}" -qq update >&2 || { echo "apt-get update of trixie failed" >&2; exit 1; }
(cd "$WORK" && apt-get "${APT[@]}" -qq download libonnxruntime-dev >&2) || {
  echo "could not download libonnxruntime-dev: set ORT_INCLUDE_DIR" >&2; exit 1; }
rm -rf "$CACHE/root" && dpkg -x "$WORK"/libonnxruntime-dev_*.deb "$CACHE/root"
rm -rf "$WORK"
FOUND="$(find "$CACHE/root" -name onnxruntime_c_api.h -print -quit)"
[ -n "$FOUND" ] || { echo "libonnxruntime-dev held no onnxruntime_c_api.h" >&2; exit 1; }
dirname "$FOUND"
