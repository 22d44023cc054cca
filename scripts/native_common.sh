# Sourced by build_kernels.sh and build_libspecx.sh: what building native code with CMake here
# needs. Expects ROOT; sets PATH (the project environment's cmake and ninja first), INC (ONNX
# Runtime's headers) and GENERATOR, and defines `configure`.
VENV="${SPECX_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
command -v cmake >/dev/null || { echo "$(basename "$0"): no cmake (pip install cmake)" >&2; exit 1; }
command -v c++ >/dev/null || command -v g++ >/dev/null || {
  echo "$(basename "$0"): no C++ compiler" >&2; exit 1; }
INC="$("$ROOT/scripts/fetch_ort_headers.sh")"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)

configure() {  # source folder, build folder, extra cmake arguments
  local src="$1" dir="$2"; shift 2
  if [ -f "$dir/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${GENERATOR[1]:-Unix Makefiles}" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"  # made by another generator
  fi
  cmake -S "$src" -B "$dir" "${GENERATOR[@]}" -DORT_INCLUDE_DIR="$INC" "$@" >&2
}
