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

}  // namespace specx
