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
VENV="${SPECX_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
SRC="$ROOT/native/libspecx"
BUILD="${SPECX_LIBSPECX_BUILD:-$SRC/build}"
command -v cmake >/dev/null || { echo "build_libspecx: no cmake (pip install cmake)" >&2; exit 1; }
INC="$("$ROOT/scripts/fetch_ort_headers.sh")"
LIB="${ORT_LIBRARY:-}"
if [ -z "$LIB" ]; then
  CAPI="$("$VENV/bin/python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')"
  LIB="$(find "$CAPI" -maxdepth 1 -name 'libonnxruntime.so.1*' -type f | sort | tail -1)"
fi
[ -f "$LIB" ] || { echo "build_libspecx: no ONNX Runtime shared library (set ORT_LIBRARY)" >&2; exit 1; }
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
configure() {  # build folder, extra cmake arguments
  local dir="$1"; shift
  if [ -f "$dir/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${GENERATOR[1]:-Unix Makefiles}" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"  # made by another generator
  fi
  cmake -S "$SRC" -B "$dir" "${GENERATOR[@]}" -DORT_INCLUDE_DIR="$INC" -DORT_LIBRARY="$LIB" "$@" >&2
}
KERNELS="$ROOT/runtime/kernels/lib/libspecx_kernels.so"
configure "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$BUILD/prefix"
cmake --build "$BUILD" >&2
cmake --install "$BUILD" >&2
if [ -f "$KERNELS" ]; then
  install -m 755 "$KERNELS" "$BUILD/libspecx_kernels.so"
  install -m 755 "$KERNELS" "$BUILD/prefix/lib/libspecx_kernels.so"
fi
if [ "${1:-}" = "--test" ]; then
  configure "$BUILD-sanitize" -DCMAKE_BUILD_TYPE=Debug -DSPECX_SANITIZE=ON
  cmake --build "$BUILD-sanitize" >&2
  [ -f "$KERNELS" ] && install -m 755 "$KERNELS" "$BUILD-sanitize/libspecx_kernels.so"
fi
echo "$BUILD/libspecx.so"
