// Q5_0 and Q5_1: 32 weights a block, 5-bit codes (low 4 bits in qs, fifth bits in qh).
//   Q5_0 (22 bytes): fp16 d, qh[4], qs[16]          W = d * (q - 16)
//   Q5_1 (24 bytes): fp16 d, fp16 m, qh[4], qs[16]  W = d * q + m
// qh is a little-endian 32-bit word: bit j is code j's fifth bit.
#include "blocks.h"

namespace specx {

static void codes5(const uint8_t* qh_bytes, const uint8_t* qs, int centre, int8_t* w) {
  const uint32_t qh = static_cast<uint32_t>(qh_bytes[0]) | (static_cast<uint32_t>(qh_bytes[1]) << 8) |
                      (static_cast<uint32_t>(qh_bytes[2]) << 16) |
                      (static_cast<uint32_t>(qh_bytes[3]) << 24);
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
    const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
    w[j] = static_cast<int8_t>(lo - centre);
    w[j + 16] = static_cast<int8_t>(hi - centre);
  }
}

void decode_q5_0(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  codes5(block + 2, block + 6, 16, out->w);
  out->ws[0] = out->ws[1] = d;
  out->wm[0] = 0.0f;
}

void decode_q5_1(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  codes5(block + 4, block + 8, 0, out->w);
  out->ws[0] = out->ws[1] = d;
  out->wm[0] = read_half(block + 2);
}

}  // namespace specx
