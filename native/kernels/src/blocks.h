// GGUF block formats as the file stores them, and what the kernels decode a block into.
//
// Every format decodes to one contract (Decoded): integer codes w (int8), a float scale per 16
// codes and a float offset per 32, so that each weight is exactly
//     W[i] = ws[i / 16] * w[i] + wm[i / 32]
// as llama.cpp and the gguf package dequantize it (each product is exact in float32: an fp16
// scale times a 6-bit or 8-bit integer); K-quants also give their integer sub-scales and
// minimums (sc, mn) and super-block scales (d, dmin), which their matmul sums in integers.
// Decoding is integer work and exact products only, so every instruction set decodes the same
// bits.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace specx {

// GGML type ids (ggml.h's enum ggml_type) of the formats held.
enum GgufType : int {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
};

constexpr int kMaxBlock = 256;  // QK_K: the K-quants' super-block

struct Decoded {
  int8_t w[kMaxBlock];        // codes, centred where the format has no offset
  float ws[kMaxBlock / 16];   // scale of each 16 codes
  float wm[kMaxBlock / 32];   // offset of each 32 codes (0 where the format has none)
  // K-quants: W = d * sc[i / 16] * w[i] - dmin * mn[i / 32], integer sc and mn
  int16_t sc[kMaxBlock / 16];
  int16_t mn[kMaxBlock / 32];
  float d, dmin;
};

using DecodeFn = void (*)(const uint8_t* block, Decoded* out);

struct BlockFormat {
  GgufType type;
  const char* name;
  int elements;      // weights a block holds (32 or 256)
  int bytes;         // bytes a block takes in the file
  bool has_offset;   // Q4_1, Q5_1, Q4_K, Q5_K: the weights carry an offset (a block minimum)
  DecodeFn decode;
};

// The format of a GGML type id, or nullptr where the kernels do not hold it.
const BlockFormat* find_format(int type);
// "Q4_0, Q4_1, ..." for messages.
const char* held_formats();

// IEEE half to float, exact (every half is a float).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

inline float read_half(const uint8_t* p) {
#if defined(__F16C__)
  uint16_t h;
  __builtin_memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);  // exact, as half_to_float
#else
  return half_to_float(static_cast<uint16_t>(p[0] | (p[1] << 8)));
#endif
}

}  // namespace specx
