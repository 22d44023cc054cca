#!/usr/bin/env bash
# Build libspecx (native/libspecx: the runtime as a C library), its C++ tests and the example
# worker, and install the library with its headers and CMake package into
# native/libspecx/build/prefix (find_package(specx) with CMAKE_PREFIX_PATH=that folder).
# Prints the library's path.
#   --test   also build the library and its tests with AddressSanitizer and
#            UndefinedBehaviorSanitizer into native/libspecx/build-sanitize (tests/native drives
#            both builds with an artifact it exports)
# ONNX Runtime: the headers from ORT_INCLUDE_DIR or Debian's libonnxruntime-dev
# (fetch_ort_headers.sh); the shared library from ORT_LIBRARY, else the onnxruntime wheel of the
# project's environment. The specx kernels library (build_kernels.sh) is placed beside libspecx,
# where libspecx looks for it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/native/libspecx"
BUILD="${SPECX_LIBSPECX_BUILD:-$SRC/build}"
source "$ROOT/scripts/native_common.sh"
LIB="${ORT_LIBRARY:-}"
if [ -z "$LIB" ]; then
  CAPI="$("$VENV/bin/python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')"
  LIB="$(find "$CAPI" -maxdepth 1 -name 'libonnxruntime.so.1*' -type f | sort | tail -1)"
fi
[ -f "$LIB" ] || { echo "build_libspecx: no ONNX Runtime shared library (set ORT_LIBRARY)" >&2; exit 1; }
KERNELS="$ROOT/runtime/kernels/lib/libspecx_kernels.so"
configure "$SRC" "$BUILD" -DORT_LIBRARY="$LIB" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$BUILD/prefix"
cmake --build "$BUILD" >&2
cmake --install "$BUILD" >&2
if [ -f "$KERNELS" ]; then
  install -m 755 "$KERNELS" "$BUILD/libspecx_kernels.so"
  install -m 755 "$KERNELS" "$BUILD/prefix/lib/libspecx_kernels.so"
fi
if [ "${1:-}" = "--test" ]; then
  configure "$SRC" "$BUILD-sanitize" -DORT_LIBRARY="$LIB" -DCMAKE_BUILD_TYPE=Debug -DSPECX_SANITIZE=ON
  cmake --build "$BUILD-sanitize" >&2
  if [ -f "$KERNELS" ]; then install -m 755 "$KERNELS" "$BUILD-sanitize/libspecx_kernels.so"; fi
fi
echo "$BUILD/libspecx.so"
