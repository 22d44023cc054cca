// Q6_K: 256 weights a super-block (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d.
// Sixteen groups of 16, group g with scale s_g:   W = (d * s_g) * (q - 32)
// Each half of 128 weights takes 64 bytes of ql (low 4 bits) and 32 of qh (2 high bits each):
// weight 32 k + l (k = 0..3, l = 0..31) reads ql[l + 32 (k % 2)] (low nibble for k < 2, high
// for k >= 2) and bits 2k, 2k + 1 of qh[l].
#include "blocks.h"

namespace specx {

void decode_q6_k(const uint8_t* block, Decoded* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = read_half(block + 208);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* l4 = ql + 64 * half;
    const uint8_t* h2 = qh + 32 * half;
    int8_t* w = out->w + 128 * half;
    for (int k = 0; k < 4; ++k) {
      const uint8_t* low = l4 + 32 * (k % 2);
      const int shift = k < 2 ? 0 : 4;
      for (int l = 0; l < 32; ++l) {
        const int q = ((low[l] >> shift) & 0x0f) | (((h2[l] >> (2 * k)) & 3) << 4);
        w[32 * k + l] = static_cast<int8_t>(q - 32);
      }
    }
  }
  for (int g = 0; g < 16; ++g) out->ws[g] = d * static_cast<float>(scales[g]);
  for (int g = 0; g < 8; ++g) out->wm[g] = 0.0f;
}

}  // namespace specx
