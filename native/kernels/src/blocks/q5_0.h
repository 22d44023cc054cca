// Q5_0 and Q5_1: 32 weights a block, 5-bit codes (low 4 bits in qs, fifth bits in qh).
//   Q5_0 (22 bytes): fp16 d, qh[4], qs[16]          W = d * (q - 16)
//   Q5_1 (24 bytes): fp16 d, fp16 m, qh[4], qs[16]  W = d * q + m
// qh is a little-endian 32-bit word: bit j is code j's fifth bit.
// The scalar decoder is the reference; the AVX2 one yields the same codes and scales.
#pragma once

#include <cstring>

#include "blocks.h"
#include "simd.h"

namespace specx {

template <bool Offset>
struct Q5Legacy {
  static constexpr int kElements = 32, kBytes = Offset ? 24 : 22;
  static constexpr bool kOffset = Offset, kSigned = !Offset;
  static constexpr int kHigh = Offset ? 4 : 2;  // byte offset of qh; qs follows it

  static uint32_t high_bits(const uint8_t* block) {
    const uint8_t* h = block + kHigh;
    return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 8) |
           (static_cast<uint32_t>(h[2]) << 16) | (static_cast<uint32_t>(h[3]) << 24);
  }

  static void decode(const uint8_t* block, Decoded* out) {
    const uint32_t qh = high_bits(block);
    const uint8_t* qs = block + kHigh + 4;
    const int centre = Offset ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
      const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
      out->w[j] = static_cast<int8_t>(lo - centre);
      out->w[j + 16] = static_cast<int8_t>(hi - centre);
    }
    out->ws[0] = out->ws[1] = read_half(block);
    out->wm[0] = Offset ? read_half(block + 2) : 0.0f;
  }

#if SPECX_X86_SIMD
  struct Simd {
    const uint8_t* block;
    explicit Simd(const uint8_t* b) : block(b) {}
    __m256i codes(int) const {
      const __m256i low = split_nibbles(block + kHigh + 4);
#if SPECX_AVX512
      // byte i of the 32: 0x10 where bit i of qh is set (qh as the byte mask itself)
      const __m256i w = _mm256_mask_add_epi8(low, static_cast<__mmask32>(high_bits(block)), low,
                                            _mm256_set1_epi8(0x10));
      return Offset ? w : _mm256_sub_epi8(w, _mm256_set1_epi8(16));
#else
      // byte i of the 32: 0x10 where bit i of qh is set
      const __m256i word = _mm256_set1_epi32(static_cast<int>(high_bits(block)));
      const __m256i spread = _mm256_shuffle_epi8(
          word, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      const __m256i w = _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      return Offset ? w : _mm256_sub_epi8(w, _mm256_set1_epi8(16));
#endif
    }
    __m256 scales(int) const { return _mm256_set1_ps(read_half(block)); }
    float offset(int) const { return Offset ? read_half(block + 2) : 0.0f; }
  };
#endif
};

using Q5_0 = Q5Legacy<false>;
using Q5_1 = Q5Legacy<true>;

}  // namespace specx
