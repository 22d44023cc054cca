#!/usr/bin/env bash
# Build the specx kernels library (native/kernels: ONNX Runtime custom ops over GGUF blocks) and
# place it where the runtime finds it (runtime/kernels/lib/). Prints the library's path.
#   --test   also build the kernels' own tests with AddressSanitizer and UndefinedBehaviorSanitizer
#            (leak checking on) and run them with ctest; then cross-compile them for ARM64 (the
#            NEON path) and run them under qemu-user against the scalar path, where Debian's
#            g++-aarch64-linux-gnu and qemu-user are installed (scripts/setup_cross.sh; where
#            they are not: skipped, or an error with SPECX_REQUIRE_CROSS=1)
# ONNX Runtime's headers: ORT_INCLUDE_DIR, else Debian's libonnxruntime-dev (fetch_ort_headers.sh).
# Needs a C++17 compiler and cmake (pip's cmake and ninja do); exits 1 saying why where it cannot.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/native/kernels"
BUILD="${SPECX_KERNELS_BUILD:-$SRC/build}"
source "$ROOT/scripts/native_common.sh"
configure "$SRC" "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSPECX_BUILD_TESTS=OFF
cmake --build "$BUILD" >&2
mkdir -p "$ROOT/runtime/kernels/lib"
install -m 755 "$BUILD/libspecx_kernels.so" "$ROOT/runtime/kernels/lib/libspecx_kernels.so"
if [ "${1:-}" = "--test" ]; then
  configure "$SRC" "$BUILD-sanitize" -DCMAKE_BUILD_TYPE=Debug -DSPECX_SANITIZE=ON
  cmake --build "$BUILD-sanitize" >&2
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$BUILD-sanitize" --output-on-failure >&2
  if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
    configure "$SRC" "$BUILD-aarch64" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE="$SRC/cmake/aarch64-linux-gnu.cmake"
    cmake --build "$BUILD-aarch64" >&2
    ctest --test-dir "$BUILD-aarch64" --output-on-failure >&2
  elif [ -n "${SPECX_REQUIRE_CROSS:-}" ]; then
    echo "build_kernels: no ARM64 cross toolchain or qemu-user (scripts/setup_cross.sh)" >&2
    exit 1
  else
    echo "build_kernels: ARM64 (NEON) tests skipped: no cross toolchain (scripts/setup_cross.sh)" >&2
  fi
fi
echo "$ROOT/runtime/kernels/lib/libspecx_kernels.so"
