// Q4_0 and Q4_1: 32 weights a block, 4-bit codes; Q4_0 centred on 8, Q4_1 with an offset.
//   Q4_0 (18 bytes): fp16 d, qs[16]          W = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, qs[16]  W = d * q + m
// Byte j holds code j in its low nibble and code j + 16 in its high nibble.
// The scalar decoder is the reference; the AVX2 one yields the same codes and scales.
#pragma once

#include "blocks.h"
#include "simd.h"

namespace specx {

template <bool Offset>
struct Q4Legacy {
  static constexpr int kElements = 32, kBytes = Offset ? 20 : 18;
  static constexpr bool kOffset = Offset, kSigned = !Offset;
  static constexpr int kCodes = Offset ? 4 : 2;  // byte offset of qs

  static void decode(const uint8_t* block, Decoded* out) {
    const uint8_t* qs = block + kCodes;
    const int centre = Offset ? 0 : 8;
    for (int j = 0; j < 16; ++j) {
      out->w[j] = static_cast<int8_t>((qs[j] & 0x0f) - centre);
      out->w[j + 16] = static_cast<int8_t>((qs[j] >> 4) - centre);
    }
    out->ws[0] = out->ws[1] = read_half(block);
    out->wm[0] = Offset ? read_half(block + 2) : 0.0f;
  }

#if SPECX_X86_SIMD
  struct Simd {
    const uint8_t* block;
    explicit Simd(const uint8_t* b) : block(b) {}
    __m256i codes(int) const {
      const __m256i w = split_nibbles(block + kCodes);
      return Offset ? w : _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    }
    __m256 scales(int) const { return _mm256_set1_ps(read_half(block)); }
    float offset(int) const { return Offset ? read_half(block + 2) : 0.0f; }
  };
#endif
};

using Q4_0 = Q4Legacy<false>;
using Q4_1 = Q4Legacy<true>;

}  // namespace specx
