// The matmul kernel (matmul.h's contract), compiled once per instruction set: SPECX_ISA picks
// the lane primitives below, the scalar reference first. The loop around them is shared, so
// every path runs the same sequence of float operations.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "blocks/q4_0.h"
#include "blocks/q4_k.h"
#include "blocks/q5_0.h"
#include "blocks/q5_k.h"
#include "blocks/q6_k.h"
#include "blocks/q8_0.h"
#include "matmul.h"

#if SPECX_ISA == 1 || SPECX_ISA == 2
#include <immintrin.h>
#elif SPECX_ISA == 3
#include <arm_neon.h>
#endif

#if SPECX_ISA == 0
#define SPECX_NS scalar
#elif SPECX_ISA == 1
#define SPECX_NS avx2
#elif SPECX_ISA == 2
#define SPECX_NS avx512vnni
#elif SPECX_ISA == 3
#define SPECX_NS neon
#else
#error "SPECX_ISA must be 0 (scalar), 1 (avx2), 2 (avx512vnni) or 3 (neon)"
#endif

namespace specx {
namespace SPECX_NS {
namespace {

constexpr int kRowTile = 16;  // activation rows a decoded weight block serves at once

// lanes[j] = sum of w[i] * a[i], i in 4j .. 4j + 3, over one 32-code chunk.
#if SPECX_ISA == 0
inline void chunk_lanes(const int8_t* w, const int8_t* a, int32_t* lanes) {
  for (int j = 0; j < 8; ++j) {
    int32_t sum = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) sum += static_cast<int32_t>(w[i]) * a[i];
    lanes[j] = sum;
  }
}
#elif SPECX_ISA == 1 || SPECX_ISA == 2
inline __m256i chunk_lanes(__m256i w, const int8_t* a) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i magnitude = _mm256_sign_epi8(w, w);  // |w| as unsigned (-128 -> 128)
  const __m256i signed_x = _mm256_sign_epi8(x, w);   // x with w's sign
#if SPECX_ISA == 2
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, signed_x);
#else
  const __m256i pairs = _mm256_maddubs_epi16(magnitude, signed_x);  // |a| <= 127: no saturation
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}
#elif SPECX_ISA == 3
inline int32x4x2_t chunk_lanes(const int8_t* w, const int8_t* a) {
  int32x4x2_t lanes;
  for (int half = 0; half < 2; ++half) {
    const int8x16_t wv = vld1q_s8(w + 16 * half);
    const int8x16_t av = vld1q_s8(a + 16 * half);
    const int16x8_t lo = vmull_s8(vget_low_s8(wv), vget_low_s8(av));    // products 0..7
    const int16x8_t hi = vmull_s8(vget_high_s8(wv), vget_high_s8(av));  // products 8..15
    const int32x4_t pair_lo = vpaddlq_s16(lo);  // (0+1), (2+3), (4+5), (6+7)
    const int32x4_t pair_hi = vpaddlq_s16(hi);
    lanes.val[half] = vpaddq_s32(pair_lo, pair_hi);  // 0..3, 4..7, 8..11, 12..15
  }
  return lanes;
}
#endif

inline float reduce8(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

struct Accumulators {
  alignas(32) float acc[kRowTile][8];
  alignas(32) float off[kRowTile][8];
};

// One decoded block of row n against rows [m0, m0 + rows) of the activations; `chunk0` is the
// block's first chunk in the row.
inline void block_rows(const Decoded& dec, int chunks, int64_t chunk0, const MatMulJob& job,
                       int64_t m0, int rows, Accumulators& st) {
  const int64_t k = job.k, kc = job.k / kChunk;
  const bool offset = job.format->has_offset;
  for (int c = 0; c < chunks; ++c) {
    const int64_t cg = chunk0 + c;  // chunk index in the row
#if SPECX_ISA == 1 || SPECX_ISA == 2
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dec.w + kChunk * c));
    const __m256 ws = _mm256_setr_m128(_mm_set1_ps(dec.ws[2 * c]), _mm_set1_ps(dec.ws[2 * c + 1]));
#endif
    for (int r = 0; r < rows; ++r) {
      const int64_t m = m0 + r;
      const int8_t* a = job.acts.q + m * k + cg * kChunk;
      const float da = job.acts.d[m * kc + cg];
#if SPECX_ISA == 0
      int32_t lanes[8];
      chunk_lanes(dec.w + kChunk * c, a, lanes);
      for (int j = 0; j < 8; ++j) {
        const float scale = dec.ws[2 * c + j / 4] * da;
        st.acc[r][j] = std::fma(scale, static_cast<float>(lanes[j]), st.acc[r][j]);
      }
#elif SPECX_ISA == 1 || SPECX_ISA == 2
      const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(da));
      const __m256 lanes = _mm256_cvtepi32_ps(chunk_lanes(w, a));
      _mm256_store_ps(st.acc[r], _mm256_fmadd_ps(scale, lanes, _mm256_load_ps(st.acc[r])));
#elif SPECX_ISA == 3
      const int32x4x2_t lanes = chunk_lanes(dec.w + kChunk * c, a);
      const float32x4_t lo_scale = vdupq_n_f32(dec.ws[2 * c] * da);
      const float32x4_t hi_scale = vdupq_n_f32(dec.ws[2 * c + 1] * da);
      vst1q_f32(st.acc[r], vfmaq_f32(vld1q_f32(st.acc[r]), lo_scale, vcvtq_f32_s32(lanes.val[0])));
      vst1q_f32(st.acc[r] + 4,
                vfmaq_f32(vld1q_f32(st.acc[r] + 4), hi_scale, vcvtq_f32_s32(lanes.val[1])));
#endif
      if (offset) {
        const float scale = dec.wm[c] * da;
        const float sum = static_cast<float>(job.acts.s[m * kc + cg]);
        st.off[r][cg & 7] = std::fma(scale, sum, st.off[r][cg & 7]);
      }
    }
  }
}

#if SPECX_ISA == 1 || SPECX_ISA == 2
// The x86 kernel: each format's blocks decoded straight into registers (blocks/*.h), a tile
// of C output columns by R activation rows with its accumulators in registers. The operations
// on each output are matmul.h's sequence, whatever the tile: only the interleaving differs.
#if SPECX_ISA == 2
constexpr int kMaxRows = 8;  // AVX-512VL has 32 vector registers
#else
constexpr int kMaxRows = 4;
#endif

template <class F, int R, int C>
void tile(const MatMulJob& job, int64_t n, int64_t m0) {
  constexpr int chunks = F::kElements / kChunk;
  const int64_t k = job.k, kc = k / kChunk, blocks = k / F::kElements;
  __m256 acc[C][R];
  alignas(32) float off[C][R][8];
  for (int col = 0; col < C; ++col) {
    for (int r = 0; r < R; ++r) acc[col][r] = _mm256_setzero_ps();
  }
  if (F::kOffset) std::memset(off, 0, sizeof off);
  const int8_t* acts = job.acts.q + m0 * k;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* at = job.weights + n * job.row_bytes + b * F::kBytes;
    const typename F::Simd first(at), second(at + (C > 1 ? job.row_bytes : 0));
    const typename F::Simd* block[2] = {&first, &second};
    for (int c = 0; c < chunks; ++c) {
      const int64_t cg = b * chunks + c;
      for (int col = 0; col < C; ++col) {
        const __m256i w = block[col]->codes(c);
        const __m256 ws = block[col]->scales(c);
        const __m256i u = F::kSigned ? _mm256_sign_epi8(w, w) : w;  // unsigned operand
        for (int r = 0; r < R; ++r) {
          const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acts + r * k + cg * kChunk));
          const __m256i x = F::kSigned ? _mm256_sign_epi8(a, w) : a;
#if SPECX_ISA == 2
          const __m256i lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
          const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
          const float da = job.acts.d[(m0 + r) * kc + cg];
          const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(da));
          acc[col][r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), acc[col][r]);
          if constexpr (F::kOffset && chunks < 8) {  // 32-weight blocks: lane cg % 8, one at a time
            const float sum = static_cast<float>(job.acts.s[(m0 + r) * kc + cg]);
            off[col][r][cg & 7] = std::fma(block[col]->offset(c) * da, sum, off[col][r][cg & 7]);
          }
        }
      }
    }
    if constexpr (F::kOffset && chunks == 8) {  // super-blocks: the 8 groups' offsets are lanes 0..7
      for (int col = 0; col < C; ++col) {
        const __m256 wm = _mm256_loadu_ps(block[col]->wm);
        for (int r = 0; r < R; ++r) {
          const int64_t at_row = (m0 + r) * kc + b * chunks;
          const __m256 scale = _mm256_mul_ps(wm, _mm256_loadu_ps(job.acts.d + at_row));
          const __m256 sums = _mm256_cvtepi32_ps(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(job.acts.s + at_row)));
          _mm256_store_ps(off[col][r], _mm256_fmadd_ps(scale, sums, _mm256_load_ps(off[col][r])));
        }
      }
    }
  }
  for (int col = 0; col < C; ++col) {
    for (int r = 0; r < R; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[col][r]);
      const float offset = F::kOffset ? reduce8(off[col][r]) : 0.0f;
      job.y[(m0 + r) * job.n + n + col] = reduce8(lanes) + offset;
    }
  }
}

template <class F, int C>
void rows_tile(const MatMulJob& job, int64_t n, int64_t m0, int rows) {
  switch (rows) {
    case 1: return tile<F, 1, C>(job, n, m0);
    case 2: return tile<F, 2, C>(job, n, m0);
    case 3: return tile<F, 3, C>(job, n, m0);
    case 4: return tile<F, 4, C>(job, n, m0);
#if SPECX_ISA == 2
    case 5: return tile<F, 5, C>(job, n, m0);
    case 6: return tile<F, 6, C>(job, n, m0);
    case 7: return tile<F, 7, C>(job, n, m0);
    case 8: return tile<F, 8, C>(job, n, m0);
#endif
    default: return;
  }
}

template <class F>
void columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {  // a pair of columns: their row of blocks stays in L1 for all rows
    for (int64_t m0 = 0; m0 < job.m; m0 += kMaxRows) {
      rows_tile<F, 2>(job, n, m0, static_cast<int>(std::min<int64_t>(kMaxRows, job.m - m0)));
    }
  }
  for (; n < n1; ++n) {
    for (int64_t m0 = 0; m0 < job.m; m0 += kMaxRows) {
      rows_tile<F, 1>(job, n, m0, static_cast<int>(std::min<int64_t>(kMaxRows, job.m - m0)));
    }
  }
}
#endif

}  // namespace

#if SPECX_ISA == 1 || SPECX_ISA == 2
void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  switch (job.format->type) {
    case kQ4_0: return columns<Q4_0>(job, n0, n1);
    case kQ4_1: return columns<Q4_1>(job, n0, n1);
    case kQ5_0: return columns<Q5_0>(job, n0, n1);
    case kQ5_1: return columns<Q5_1>(job, n0, n1);
    case kQ8_0: return columns<Q8_0>(job, n0, n1);
    case kQ4_K: return columns<Q4_K>(job, n0, n1);
    case kQ5_K: return columns<Q5_K>(job, n0, n1);
    case kQ6_K: return columns<Q6_K>(job, n0, n1);
  }
}
#else
void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  const BlockFormat& f = *job.format;
  const int64_t blocks = job.k / f.elements;
  const int chunks = f.elements / kChunk;
  Decoded dec;
  Accumulators st;
  for (int64_t m0 = 0; m0 < job.m; m0 += kRowTile) {
    const int rows = static_cast<int>(job.m - m0 < kRowTile ? job.m - m0 : kRowTile);
    for (int64_t n = n0; n < n1; ++n) {
      std::memset(&st, 0, sizeof st);
      const uint8_t* row = job.weights + n * job.row_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        f.decode(row + b * f.bytes, &dec);
        block_rows(dec, chunks, b * chunks, job, m0, rows, st);
      }
      for (int r = 0; r < rows; ++r) {
        job.y[(m0 + r) * job.n + n] = reduce8(st.acc[r]) + reduce8(st.off[r]);
      }
    }
  }
}
#endif

}  // namespace SPECX_NS
}  // namespace specx
