// Q8_0: 32 weights a block (34 bytes): fp16 d, int8 qs[32].   W = d * q
#include <cstring>

#include "blocks.h"

namespace specx {

void decode_q8_0(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  std::memcpy(out->w, block + 2, 32);
  out->ws[0] = out->ws[1] = d;
  out->wm[0] = 0.0f;
}

}  // namespace specx
