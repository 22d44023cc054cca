// Q5_K: 256 weights a super-block (176 bytes): fp16 d, fp16 dmin, scales[12], qh[32], qs[128].
// As Q4_K with a fifth bit: code l of group g takes bit g of qh[l].
//   W = (d * s_g) * q - dmin * m_g
#include "blocks.h"
#include "kquant_scales.h"

namespace specx {

void decode_q5_k(const uint8_t* block, Decoded* out) {
  const float d = read_half(block);
  const float dmin = read_half(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int g = 0; g < 8; ++g) {
    int s = 0, m = 0;
    kquant_scale_min(g, scales, &s, &m);
    out->ws[2 * g] = out->ws[2 * g + 1] = d * static_cast<float>(s);
    out->wm[g] = -(dmin * static_cast<float>(m));
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int high = ((qh[l] >> g) & 1) << 4;
      out->w[32 * g + l] = static_cast<int8_t>(((q[l] >> shift) & 0x0f) | high);
    }
  }
}

}  // namespace specx
