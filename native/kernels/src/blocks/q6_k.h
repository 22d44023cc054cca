// Q6_K: 256 weights a super-block (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d.
// Sixteen groups of 16, group g with scale s_g:   W = (d * s_g) * (q - 32)
// Each half of 128 weights takes 64 bytes of ql (low 4 bits) and 32 of qh (2 high bits each):
// weight 32 k + l of a half (k = 0..3, l = 0..31) reads ql[l + 32 (k % 2)] (low nibble for
// k < 2, high for k >= 2) and bits 2k, 2k + 1 of qh[l].
// The scalar decoder is the reference (codes centred, q - 32); the SIMD ones give q itself.
#pragma once

#include "blocks.h"
#include "simd.h"

namespace specx {

struct Q6_K {
  static constexpr int kElements = 256, kBytes = 210;
  static constexpr bool kOffset = false, kSigned = false;  // the kernels take q unsigned
  static constexpr int kCentre = 32;                      // and take 32 * sums off

  static void decode(const uint8_t* block, Decoded* out) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
    const float d = read_half(block + 208);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* l4 = block + 64 * half;
      const uint8_t* h2 = block + 128 + 32 * half;
      int8_t* w = out->w + 128 * half;
      for (int k = 0; k < 4; ++k) {
        const uint8_t* low = l4 + 32 * (k % 2);
        const int shift = k < 2 ? 0 : 4;
        for (int l = 0; l < 32; ++l) {
          const int q = ((low[l] >> shift) & 0x0f) | (((h2[l] >> (2 * k)) & 3) << 4);
          w[32 * k + l] = static_cast<int8_t>(q - 32);
        }
      }
    }
    out->d = d;
    out->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) {
      out->sc[g] = scales[g];
      out->ws[g] = d * static_cast<float>(scales[g]);
    }
    for (int g = 0; g < 8; ++g) {
      out->wm[g] = 0.0f;
      out->mn[g] = 0;
    }
  }

#if SPECX_X86_SIMD
  struct Simd {  // codes unsigned (q, 0..63): the kernel takes the centre 32 off in integers
    const uint8_t* block;
    const int8_t* sc;
    __m256i sc16;  // the 16 scales as int16
    float d;
    explicit Simd(const uint8_t* b)
        : block(b), sc(reinterpret_cast<const int8_t*>(b + 192)), d(read_half(b + 208)) {
      sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    }
    __m256i codes(int c) const {  // chunk c = 4 half + k
      const int half = c / 4, k = c % 4;
      const __m256i low = nibbles(block + 64 * half + 32 * (k % 2), k >= 2);
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), _mm256_set1_epi8(3));
      return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    }
    __m256i sub_scales(int c) const {  // codes 0..15 of the chunk: sc[2c]; 16..31: sc[2c + 1]
      return _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
    }
#if SPECX_AVX512
    // chunks 2p and 2p + 1 (k = 0, 1 or 2, 3 of half p / 2): 64 bytes of ql, bits of qh to 4, 5
    __m512i pair(int p) const {
      const __m512i ql = _mm512_loadu_si512(block + 64 * (p / 2));
      const __m512i low = _mm512_and_si512(p % 2 ? _mm512_srli_epi16(ql, 4) : ql,
                                           _mm512_set1_epi8(0x0f));
      const __m512i h = broadcast32(block + 128 + 32 * (p / 2));
      const __m512i moved = p % 2 ? _mm512_srlv_epi16(h, shifts(0, 2))
                                  : _mm512_sllv_epi16(h, shifts(4, 2));
      return or_masked(low, moved, 0x30);
    }
#endif
  };
#endif
};

}  // namespace specx
