// Activation rows to int8 blocks of 32 (matmul.h), and rows of weights back to floats.
#include <cmath>

#include "matmul.h"

namespace specx {

void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out) {
  const int64_t kc = k / kChunk;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < kc; ++c) {
      const float* v = x + r * k + c * kChunk;
      int8_t* q = out.q + r * k + c * kChunk;
      float amax = 0.0f;
      bool finite = true;
      for (int i = 0; i < kChunk; ++i) {
        amax = std::fmax(amax, std::fabs(v[i]));
        finite = finite && std::isfinite(v[i]);
      }
      if (!finite) {  // a NaN or infinity poisons the block's products, as in float
        for (int i = 0; i < kChunk; ++i) q[i] = 0;
        out.d[r * kc + c] = std::nanf("");
        out.s[r * kc + c] = 0;
        continue;
      }
      const float d = amax / 127.0f;
      const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int i = 0; i < kChunk; ++i) {
        const int code = static_cast<int>(std::nearbyint(v[i] * inverse));
        q[i] = static_cast<int8_t>(code);
        sum += code;
      }
      out.d[r * kc + c] = d;
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
