// Q4_K: 256 weights a super-block (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128].
// Eight groups of 32, group g with 6-bit scale s_g and minimum m_g (kquant_scales.h):
//   W = (d * s_g) * q - dmin * m_g
// Groups 2i and 2i + 1 share qs[32 i .. 32 i + 32): low nibbles, then high nibbles.
#include "blocks.h"
#include "kquant_scales.h"

namespace specx {

void decode_q4_k(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  const float dmin = read_half(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  for (int g = 0; g < 8; ++g) {
    int s = 0, m = 0;
    kquant_scale_min(g, scales, &s, &m);
    out->ws[2 * g] = out->ws[2 * g + 1] = d * static_cast<float>(s);
    out->wm[g] = -(dmin * static_cast<float>(m));
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l) out->w[32 * g + l] = static_cast<int8_t>((q[l] >> shift) & 0x0f);
  }
}

}  // namespace specx
