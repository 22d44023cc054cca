// Q5_K: 256 weights a super-block (176 bytes): fp16 d, fp16 dmin, scales[12], qh[32], qs[128].
// As Q4_K with a fifth bit: code l of group g takes bit g of qh[l].
//   W = (d * s_g) * q - dmin * m_g
// The scalar decoder is the reference; the AVX2 one yields the same codes and scales.
#pragma once

#include "blocks.h"
#include "blocks/q4_k.h"
#include "simd.h"

namespace specx {

struct Q5_K {
  static constexpr int kElements = 256, kBytes = 176;
  static constexpr bool kOffset = true, kSigned = false;
  static constexpr int kCentre = 0;

  static void decode(const uint8_t* block, Decoded* out) {
    Q4_K::header(block, out);
    const uint8_t* qh = block + 16;
    const uint8_t* qs = block + 48;
    for (int g = 0; g < 8; ++g) {
      const uint8_t* q = qs + 32 * (g / 2);
      const int shift = (g % 2) * 4;
      for (int l = 0; l < 32; ++l) {
        const int high = ((qh[l] >> g) & 1) << 4;
        out->w[32 * g + l] = static_cast<int8_t>(((q[l] >> shift) & 0x0f) | high);
      }
    }
  }

#if SPECX_X86_SIMD
  struct Simd : Q4_K::Simd {  // Q4_K's header; codes with their fifth bit
    const uint8_t* qh;
    explicit Simd(const uint8_t* b) : Q4_K::Simd(b), qh(b + 16) { qs = b + 48; }
    __m256i codes(int g) const {
      const __m256i low = Q4_K::Simd::codes(g);
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << g));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(h, mask), mask);
      return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
#if SPECX_AVX512
    __m512i pair(int p) const {  // bit c of qh moved to bit 4 for chunks c = 2p, 2p + 1
      const __m512i h = broadcast32(qh);
      const __m512i moved = p < 2 ? _mm512_sllv_epi16(h, shifts(4 - 2 * p, 3 - 2 * p))
                                  : _mm512_srlv_epi16(h, shifts(2 * p - 4, 2 * p - 3));
      return or_masked(Q4_K::Simd::pair(p), moved, 0x10);
    }
#endif
  };
#endif
};

}  // namespace specx
