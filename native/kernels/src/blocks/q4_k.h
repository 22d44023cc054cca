// Q4_K: 256 weights a super-block (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128].
// Eight groups of 32, group g with 6-bit scale s_g and minimum m_g (kquant_scale_min):
//   W = (d * s_g) * q - dmin * m_g
// Groups 2i and 2i + 1 share qs[32 i .. 32 i + 32): low nibbles, then high nibbles.
// The scalar decoder is the reference; the AVX2 one yields the same codes and scales.
#pragma once

#include "blocks.h"
#include "kquant_scales.h"
#include "simd.h"

namespace specx {

struct Q4_K {
  static constexpr int kElements = 256, kBytes = 144;
  static constexpr bool kOffset = true, kSigned = false;
  static constexpr int kCentre = 0;

  // the 8 groups' integer scales and minimums
  static void scales_of(const uint8_t* block, int16_t* sc, int16_t* mn) {
    for (int g = 0; g < 8; ++g) {
      int s = 0, m = 0;
      kquant_scale_min(g, block + 4, &s, &m);
      sc[g] = static_cast<int16_t>(s);
      mn[g] = static_cast<int16_t>(m);
    }
  }

  // everything but the codes: sc per 16 (each group's twice), mn, d, dmin, ws, wm
  static void header(const uint8_t* block, Decoded* out) {
    int16_t sc[8];
    scales_of(block, sc, out->mn);
    out->d = read_half(block);
    out->dmin = read_half(block + 2);
    for (int g = 0; g < 8; ++g) {
      out->sc[2 * g] = out->sc[2 * g + 1] = sc[g];
      out->wm[g] = -(out->dmin * static_cast<float>(out->mn[g]));
    }
    for (int i = 0; i < 16; ++i) out->ws[i] = out->d * static_cast<float>(out->sc[i]);
  }

  static void decode(const uint8_t* block, Decoded* out) {
    header(block, out);
    const uint8_t* qs = block + 16;
    for (int g = 0; g < 8; ++g) {
      const uint8_t* q = qs + 32 * (g / 2);
      const int shift = (g % 2) * 4;
      for (int l = 0; l < 32; ++l) out->w[32 * g + l] = static_cast<int8_t>((q[l] >> shift) & 0x0f);
    }
  }

#if SPECX_X86_SIMD
  struct Simd {
    const uint8_t* qs;
    uint8_t sc[8];
    __m256i sc16;  // each 16 codes' scale as int16 (a group's twice)
    __m256 wmin;   // dmin * m_g for the 8 groups
    float d;
    explicit Simd(const uint8_t* b) : qs(b + 16), d(read_half(b)) {
      alignas(8) uint8_t mins[8];
      kquant_scales_mins(b + 4, sc, mins);
      const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
      sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s));
      const __m128i m = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins));
      wmin = _mm256_mul_ps(_mm256_set1_ps(read_half(b + 2)),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m)));
    }
    __m256i codes(int g) const { return nibbles(qs + 32 * (g / 2), g % 2); }
    __m256i sub_scales(int g) const { return _mm256_set1_epi16(sc[g]); }
#if SPECX_AVX512
    // chunks 2p and 2p + 1: the low, then the high nibbles of the same 32 bytes
    __m512i pair(int p) const {
      return _mm512_and_si512(_mm512_srlv_epi16(broadcast32(qs + 32 * p), shifts(0, 4)),
                              _mm512_set1_epi8(0x0f));
    }
#endif
  };
#endif
};

}  // namespace specx
