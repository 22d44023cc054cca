// Q8_0: 32 weights a block (34 bytes): fp16 d, int8 qs[32].   W = d * q
// The scalar decoder is the reference; the AVX2 one yields the same codes and scales.
#pragma once

#include <cstring>

#include "blocks.h"
#include "simd.h"

namespace specx {

struct Q8_0 {
  static constexpr int kElements = 32, kBytes = 34;
  static constexpr bool kOffset = false, kSigned = true;

  static void decode(const uint8_t* block, Decoded* out) {
    std::memcpy(out->w, block + 2, 32);
    out->ws[0] = out->ws[1] = read_half(block);
    out->wm[0] = 0.0f;
  }

#if SPECX_X86_SIMD
  struct Simd {
    const uint8_t* block;
    explicit Simd(const uint8_t* b) : block(b) {}
    __m256i codes(int) const {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    }
    __m256 scales(int) const { return _mm256_set1_ps(read_half(block)); }
    float offset(int) const { return 0.0f; }
  };
#endif
};

}  // namespace specx
