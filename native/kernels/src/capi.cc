// The C ABI of specx_kernels.h over the kernels.
#include <cstdio>
#include <vector>

#include "matmul.h"
#include "specx_kernels.h"

#ifndef SPECX_KERNELS_VERSION
#define SPECX_KERNELS_VERSION "0.0.0"
#endif

namespace {

int fail(int code, char* message, size_t len, const char* text) {
  if (message != nullptr && len > 0) std::snprintf(message, len, "%s", text);
  return code;
}

int check_shape(const specx::BlockFormat* f, int type, int64_t k, char* message, size_t len) {
  char text[256];
  if (f == nullptr) {
    std::snprintf(text, sizeof text, "GGML type %d is not held by the specx kernels (held: %s)",
                  type, specx::held_formats());
    return fail(SPECX_KERNELS_UNKNOWN_TYPE, message, len, text);
  }
  if (k <= 0 || k % f->elements != 0) {
    std::snprintf(text, sizeof text, "k = %lld is not a positive multiple of %s's %d weights",
                  static_cast<long long>(k), f->name, f->elements);
    return fail(SPECX_KERNELS_BAD_ARGUMENT, message, len, text);
  }
  return SPECX_KERNELS_OK;
}

}  // namespace

extern "C" {

int specx_kernels_abi_version(void) { return SPECX_KERNELS_ABI_VERSION; }

const char* specx_kernels_version(void) { return SPECX_KERNELS_VERSION; }

const char* specx_kernels_isa(void) { return specx::isa_name(specx::active_isa()); }

int specx_kernels_isa_supported(const char* isa) {
  specx::Isa chosen;
  return isa != nullptr && specx::isa_from_name(isa, &chosen) && specx::isa_supported(chosen);
}

const char* specx_kernels_formats(void) { return specx::held_formats(); }

int specx_kernels_block_shape(int type, int* elements, int* bytes) {
  const specx::BlockFormat* f = specx::find_format(type);
  if (f == nullptr) return SPECX_KERNELS_UNKNOWN_TYPE;
  if (elements != nullptr) *elements = f->elements;
  if (bytes != nullptr) *bytes = f->bytes;
  return SPECX_KERNELS_OK;
}

int specx_kernels_peak(const char* isa, double seconds, double* macs_per_second, char* message,
                       size_t message_len) {
  if (macs_per_second == nullptr || !(seconds > 0.0 && seconds <= 10.0)) {
    return fail(SPECX_KERNELS_BAD_ARGUMENT, message, message_len,
                "macs_per_second must be non-null and seconds in (0, 10]");
  }
  specx::Isa chosen = specx::active_isa();
  if (isa != nullptr && (!specx::isa_from_name(isa, &chosen) || !specx::isa_supported(chosen))) {
    return fail(SPECX_KERNELS_UNSUPPORTED_ISA, message, message_len,
                "that instruction set is not one this CPU and build run");
  }
  *macs_per_second = specx::product_peak(chosen, seconds);
  return SPECX_KERNELS_OK;
}

int specx_kernels_matmul(const char* isa, int type, const uint8_t* weights, int64_t n, int64_t k,
                         const float* x, int64_t m, float* y, char* message, size_t message_len) {
  if (weights == nullptr || x == nullptr || y == nullptr || n <= 0 || m <= 0) {
    return fail(SPECX_KERNELS_BAD_ARGUMENT, message, message_len,
                "weights, x and y must be non-null and n, m positive");
  }
  const specx::BlockFormat* f = specx::find_format(type);
  const int shape = check_shape(f, type, k, message, message_len);
  if (shape != SPECX_KERNELS_OK) return shape;
  specx::Isa chosen = specx::active_isa();
  if (isa != nullptr && (!specx::isa_from_name(isa, &chosen) || !specx::isa_supported(chosen))) {
    return fail(SPECX_KERNELS_UNSUPPORTED_ISA, message, message_len,
                "that instruction set is not one this CPU and build run");
  }
  specx::Activations activations;
  const specx::QuantRows acts = activations.quantize(chosen, *f, x, m, k);
  const specx::MatMulJob job{f, weights, static_cast<size_t>(k / f->elements * f->bytes), k, n, m,
                             acts, y};
  specx::matmul_columns(chosen, job, 0, n);
  return SPECX_KERNELS_OK;
}

int specx_kernels_dequantize(int type, const uint8_t* weights, int64_t rows, int64_t k, float* y,
                             char* message, size_t message_len) {
  if (weights == nullptr || y == nullptr || rows <= 0) {
    return fail(SPECX_KERNELS_BAD_ARGUMENT, message, message_len,
                "weights and y must be non-null and rows positive");
  }
  const specx::BlockFormat* f = specx::find_format(type);
  const int shape = check_shape(f, type, k, message, message_len);
  if (shape != SPECX_KERNELS_OK) return shape;
  const int64_t row_bytes = k / f->elements * f->bytes;
  for (int64_t r = 0; r < rows; ++r) specx::dequantize_row(*f, weights + r * row_bytes, k, y + r * k);
  return SPECX_KERNELS_OK;
}

}  // extern "C"
