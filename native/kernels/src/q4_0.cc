// Q4_0 and Q4_1: 32 weights a block, 4-bit codes; Q4_0 centred on 8, Q4_1 with an offset.
//   Q4_0 (18 bytes): fp16 d, qs[16]          W = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, qs[16]  W = d * q + m
// Byte j holds code j in its low nibble and code j + 16 in its high nibble.
#include "blocks.h"

namespace specx {

static void nibbles(const uint8_t* qs, int centre, int8_t* w) {
  for (int j = 0; j < 16; ++j) {
    w[j] = static_cast<int8_t>((qs[j] & 0x0f) - centre);
    w[j + 16] = static_cast<int8_t>((qs[j] >> 4) - centre);
  }
}

void decode_q4_0(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  nibbles(block + 2, 8, out->w);
  out->ws[0] = out->ws[1] = d;
  out->wm[0] = 0.0f;
}

void decode_q4_1(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  nibbles(block + 4, 0, out->w);
  out->ws[0] = out->ws[1] = d;
  out->wm[0] = read_half(block + 2);
}

}  // namespace specx
