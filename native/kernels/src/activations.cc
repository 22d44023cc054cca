// Activation rows to int8 blocks of 32 (matmul.h), and rows of weights back to floats.
#include <cmath>

#include "matmul.h"

namespace specx {

void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out) {
  const int block = out.block;
  const int64_t blocks = k / block, kc = k / kChunk;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * k + b * block;
      int8_t* q = out.q + r * k + b * block;
      float amax = 0.0f;
      bool finite = true;
      for (int i = 0; i < block; ++i) {
        amax = std::fmax(amax, std::fabs(v[i]));
        finite = finite && std::isfinite(v[i]);
      }
      const float d = finite ? amax / 127.0f : std::nanf("");  // NaN or inf poisons the block
      const float inverse = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int i = 0; i < block; ++i) {
        q[i] = finite ? static_cast<int8_t>(static_cast<int>(std::nearbyint(v[i] * inverse))) : 0;
      }
      out.d[r * blocks + b] = d;
    }
    for (int64_t c = 0; c < kc; ++c) {
      const int8_t* q = out.q + r * k + c * kChunk;
      int32_t sum = 0;
      for (int i = 0; i < kChunk; ++i) sum += q[i];
      out.s[r * kc + c] = sum;
    }
  }
}

void dequantize_row(const BlockFormat& format, const uint8_t* row, int64_t k, float* out) {
  Decoded dec;
  for (int64_t b = 0; b < k / format.elements; ++b) {
    format.decode(row + b * format.bytes, &dec);
    float* y = out + b * format.elements;
    for (int i = 0; i < format.elements; ++i) {
      const float scaled = dec.ws[i / 16] * static_cast<float>(dec.w[i]);
      y[i] = format.has_offset ? scaled + dec.wm[i / 32] : scaled;
    }
  }
}

}  // namespace specx
