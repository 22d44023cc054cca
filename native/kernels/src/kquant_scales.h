// The 6-bit scales and minimums of Q4_K and Q5_K: 12 bytes hold 8 (scale, min) pairs.
#pragma once

#include <cstdint>

namespace specx {

inline void kquant_scale_min(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// All 8 at once with 32-bit word operations (the same values as kquant_scale_min): bytes 0..3 of
// the words hold scales 0..3, then scales 4..7, minimums 0..3, minimums 4..7.
inline void kquant_scales_mins(const uint8_t* q, uint8_t* scales, uint8_t* mins) {
  uint32_t w[3];
  __builtin_memcpy(w, q, sizeof w);
  const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
  const uint32_t sc[2] = {w[0] & low6, (w[2] & low4) | (((w[0] >> 6) & low2) << 4)};
  const uint32_t mn[2] = {w[1] & low6, ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4)};
  __builtin_memcpy(scales, sc, sizeof sc);
  __builtin_memcpy(mins, mn, sizeof mn);
}

}  // namespace specx
