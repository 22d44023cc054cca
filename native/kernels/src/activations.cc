// Activation rows to int8 blocks (matmul.h), and rows of weights back to floats.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "matmul.h"

namespace specx {

void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out) {
  const int block = out.block;
  const int64_t blocks = k / block;
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
  }
  finish_rows(m, k, out);
}

void finish_rows(int64_t m, int64_t k, QuantRows out) {
  const int64_t kc = k / kChunk, blocks = k / out.block;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < k / 16; ++g) {  // exact integer sums of each 16 and 32 codes
      const int8_t* q = out.q + r * k + g * 16;
      int32_t sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[i];
      out.s16[r * (k / 16) + g] = static_cast<int16_t>(sum);
    }
    for (int64_t c = 0; c < kc; ++c) {
      out.s[r * kc + c] = out.s16[r * (k / 16) + 2 * c] + out.s16[r * (k / 16) + 2 * c + 1];
      out.fs[r * kc + c] = out.d[r * blocks + c * kChunk / out.block] * static_cast<float>(out.s[r * kc + c]);
    }
  }
  if (out.pairs == nullptr) return;
  for (int64_t p = 0; p < m / 2; ++p) {
    for (int64_t b = 0; b < blocks; ++b) {
      PairBlock& pb = out.pairs[p * blocks + b];
      for (int h = 0; h < 2; ++h) {
        const int64_t r = 2 * p + h;
        for (int c = 0; c < 8; ++c) {
          std::memcpy(pb.q[c][h], out.q + r * k + b * kMaxBlock + c * kChunk, kChunk);
          pb.da[8 * h + c] = out.d[r * blocks + b];
          pb.fs[8 * h + c] = out.fs[r * kc + b * 8 + c];
        }
        std::memcpy(pb.s16[h], out.s16 + r * (k / 16) + b * 16, sizeof pb.s16[h]);
      }
    }
  }
}

QuantRows Activations::quantize(Isa isa, const BlockFormat& format, const float* x, int64_t m,
                                int64_t k) {
  const int block = activation_block(format);
  auto grow = [](auto& buffer, int64_t size) {
    if (buffer.size() < static_cast<size_t>(size)) buffer.resize(static_cast<size_t>(size));
    return buffer.data();
  };
  const bool paired = takes_row_pairs(isa, format, m);
  QuantRows rows{grow(q_, m * k),           grow(d_, m * (k / block)), grow(s_, m * (k / kChunk)),
                 block,                     grow(fs_, m * (k / kChunk)), grow(s16_, m * (k / 16)),
                 paired ? grow(pairs_, m / 2 * (k / kMaxBlock)) : nullptr};
  quantize_rows(isa, x, m, k, rows);
  return rows;
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
