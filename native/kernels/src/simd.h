// Which SIMD headers a translation unit has: the x86 paths compile where AVX2 is enabled for it
// (the kernels' AVX2 and AVX-512 objects), the NEON one on ARM64.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define SPECX_X86_SIMD 1
#include <immintrin.h>
#else
#define SPECX_X86_SIMD 0
#endif

// The AVX-512 object (BW for byte and word lanes, VNNI for dpwssd) adds 512-bit decoders.
#if SPECX_X86_SIMD && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECX_AVX512 1
#else
#define SPECX_AVX512 0
#endif

#if SPECX_X86_SIMD
#include <cstdint>

namespace specx {

// 16 bytes of two 4-bit codes each -> 32 codes: the low nibbles, then the high ones.
inline __m256i split_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
}

// 32 bytes -> their low (high = false) or high nibbles.
inline __m256i nibbles(const uint8_t* q, bool high) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  return _mm256_and_si256(high ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0f));
}

#if SPECX_AVX512
// 16-bit shift counts: `low` in the low 256 bits, `high` in the high 256 bits.
inline __m512i shifts(int low, int high) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(low)),
                            _mm256_set1_epi16(static_cast<short>(high)), 1);
}

// 32 bytes in both halves of a 512-bit register.
inline __m512i broadcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// a | (b & mask), bytewise.
inline __m512i or_masked(__m512i a, __m512i b, char mask) {
  return _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi8(mask), 0xf8);
}
#endif

}  // namespace specx
#endif
