// The matmul kernel (matmul.h's contract), compiled once per instruction set: SPECX_ISA picks
// the lane primitives below, the scalar reference first. Every path runs the same sequence of
// float operations on each output; integer sums are exact, so their grouping is free.
#if SPECX_ISA == 2 && defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 insert intrinsics take an "undefined" vector as their merge source, which
// -Wmaybe-uninitialized reports inside the header; every lane of it is overwritten.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "blocks/q4_0.h"
#include "blocks/q4_k.h"
#include "blocks/q5_0.h"
#include "blocks/q5_k.h"
#include "blocks/q6_k.h"
#include "blocks/q8_0.h"
#include "matmul.h"

#if SPECX_ISA == 3
#include <arm_neon.h>
#endif

#include "isa_namespace.h"

namespace specx {
namespace SPECX_NS {
namespace {

inline float reduce8(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

#if SPECX_ISA == 0 || SPECX_ISA == 3
// The portable kernel: blocks decoded to Decoded (blocks/*.h's scalar decoders), rows in tiles.
constexpr int kRowTile = 16;

// lanes[j] = sum of w[i] * a[i], i in 4j .. 4j + 3, over one 32-code chunk.
inline void chunk_lanes(const int8_t* w, const int8_t* a, int32_t* lanes) {
#if SPECX_ISA == 3
  for (int half = 0; half < 2; ++half) {
    const int8x16_t wv = vld1q_s8(w + 16 * half);
    const int8x16_t av = vld1q_s8(a + 16 * half);
    const int16x8_t lo = vmull_s8(vget_low_s8(wv), vget_low_s8(av));    // products 0..7
    const int16x8_t hi = vmull_s8(vget_high_s8(wv), vget_high_s8(av));  // products 8..15
    // pairs (0+1), (2+3), ... then quads (0..3), (4..7), (8..11), (12..15)
    vst1q_s32(lanes + 4 * half, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
  }
#else
  for (int j = 0; j < 8; ++j) {
    int32_t sum = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) sum += static_cast<int32_t>(w[i]) * a[i];
    lanes[j] = sum;
  }
#endif
}

struct Accumulators {
  float acc[kRowTile][8];
  float off[kRowTile][8];  // blocks of 32 with an offset
};

// Blocks of 32: one decoded block of a column against rows [m0, m0 + rows).
void small_block(const Decoded& dec, int64_t b, const MatMulJob& job, int64_t m0, int rows,
                 Accumulators& st) {
  const int64_t k = job.k, kc = k / kChunk;
  for (int r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    int32_t lanes[8];
    chunk_lanes(dec.w, job.acts.q + m * k + b * kChunk, lanes);
    const float da = job.acts.d[m * kc + b];
    for (int j = 0; j < 8; ++j) {
      st.acc[r][j] = std::fma(dec.ws[j / 4] * da, static_cast<float>(lanes[j]), st.acc[r][j]);
    }
    if (job.format->has_offset) {
      const float sum = static_cast<float>(job.acts.s[m * kc + b]);
      st.off[r][b & 7] = std::fma(dec.wm[0] * da, sum, st.off[r][b & 7]);
    }
  }
}

// K-quants: one decoded super-block of a column against rows [m0, m0 + rows), codes unsigned.
void super_block(const Decoded& dec, int64_t b, const MatMulJob& job, int64_t m0, int rows,
                 Accumulators& st) {
  const int64_t k = job.k, kc = k / kChunk, blocks = k / kMaxBlock, k16 = k / 16;
  const int centre = job.format->type == kQ6_K ? 32 : 0;
  int8_t u[kMaxBlock];
  for (int i = 0; i < kMaxBlock; ++i) u[i] = static_cast<int8_t>(dec.w[i] + centre);
  for (int r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int16_t* s16 = job.acts.s16 + m * k16 + b * 16;
    int32_t sums[8];
    for (int j = 0; j < 8; ++j) sums[j] = -centre * (dec.sc[2 * j] * s16[2 * j] + dec.sc[2 * j + 1] * s16[2 * j + 1]);
    for (int c = 0; c < 8; ++c) {
      int32_t lanes[8];
      chunk_lanes(u + kChunk * c, job.acts.q + m * k + b * kMaxBlock + kChunk * c, lanes);
      for (int j = 0; j < 8; ++j) sums[j] += dec.sc[2 * c + j / 4] * lanes[j];
    }
    const float da = job.acts.d[m * blocks + b];
    for (int j = 0; j < 8; ++j) {
      st.acc[r][j] = std::fma(static_cast<float>(sums[j]) * dec.d, da, st.acc[r][j]);
    }
    if (job.format->has_offset) {
      for (int j = 0; j < 8; ++j) {
        const float wmin = dec.dmin * static_cast<float>(dec.mn[j]);
        st.acc[r][j] = std::fma(-wmin, job.acts.fs[m * kc + b * 8 + j], st.acc[r][j]);
      }
    }
  }
}

}  // namespace

void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  const BlockFormat& f = *job.format;
  const int64_t blocks = job.k / f.elements;
  const bool super = f.elements == kMaxBlock;
  Decoded dec;
  Accumulators st;
  for (int64_t m0 = 0; m0 < job.m; m0 += kRowTile) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowTile, job.m - m0));
    for (int64_t n = n0; n < n1; ++n) {
      std::memset(&st, 0, sizeof st);
      const uint8_t* row = job.weights + n * job.row_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        f.decode(row + b * f.bytes, &dec);
        if (super) {
          super_block(dec, b, job, m0, rows, st);
        } else {
          small_block(dec, b, job, m0, rows, st);
        }
      }
      for (int r = 0; r < rows; ++r) {
        const float sum = reduce8(st.acc[r]);
        job.y[(m0 + r) * job.n + n] = super ? sum : sum + reduce8(st.off[r]);
      }
    }
  }
}

#else  // SPECX_ISA 1 (AVX2 + FMA) or 2 (AVX-512 VL + VNNI)
// The x86 kernel: each format's blocks decoded straight into registers (blocks/*.h), one output
// column by a tile of R activation rows, accumulators in registers.
// Weights stream from memory once a pass: the hardware prefetcher alone leaves the kernel
// waiting on them (docs/bench/measurements.md), so the kernel prefetches kAhead blocks on.
constexpr int kAhead = 3;
constexpr int kAheadBytes = 512;  // blocks of 32: this far on, one prefetch a block

#if SPECX_ISA == 2
constexpr int kMaxRows = 8;  // AVX-512VL has 32 vector registers
// Passes of this many rows or more take two columns a tile (small_pair_tile; 2 rows measured
// slower, docs/bench/measurements.md), at most kPairMaxRows rows a tile.
constexpr int64_t kPairRows = 3;
constexpr int kPairMaxRows = 16;
#else
// AVX2's 16 ymm registers: R accumulators and seven for the block's codes, scales and
// temporaries (docs/bench/measurements.md, "AVX2 tiles of up to nine rows")
constexpr int kMaxRows = 8;
#endif

// The unsigned operand of u8 x s8 products: the codes, or their magnitude for signed formats.
template <class F>
inline __m256i magnitude(__m256i w) {
  return F::kSigned ? _mm256_sign_epi8(w, w) : w;
}

// The signed operand: activations, with the weight's sign for signed formats.
template <class F>
inline __m256i signed_acts(const int8_t* at, __m256i w) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
  return F::kSigned ? _mm256_sign_epi8(a, w) : a;
}

inline void store_rows(const MatMulJob& job, int64_t n, int64_t m, __m256 acc, float off) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  job.y[m * job.n + n] = reduce8(lanes) + off;
}

// Blocks of 32: per block and row, eight lanes in float.
template <class F, int R>
void small_tile(const MatMulJob& job, int64_t n, int64_t m0) {
  const int64_t k = job.k, kc = k / kChunk;
  __m256 acc[R];
  float off[R][8] = {};
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int8_t* acts = job.acts.q + m0 * k;
  for (int64_t b = 0; b < kc; ++b) {
    const uint8_t* at = job.weights + n * job.row_bytes + b * F::kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(at + kAheadBytes), _MM_HINT_T0);
    const typename F::Simd block(at);
    const __m256i w = block.codes(0);
    const __m256 ws = block.scales(0);
    const __m256i u = magnitude<F>(w);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i x = signed_acts<F>(acts + r * k + b * kChunk, w);
#if SPECX_ISA == 2
      const __m256i lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
      const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
      const float da = job.acts.d[(m0 + r) * kc + b];
      const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(da));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), acc[r]);
      if constexpr (F::kOffset) {
        const float sum = static_cast<float>(job.acts.s[(m0 + r) * kc + b]);
        off[r][b & 7] = std::fma(block.offset(0) * da, sum, off[r][b & 7]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    store_rows(job, n, m0 + r, acc[r], F::kOffset ? reduce8(off[r]) : 0.0f);
  }
}

// Super-block b of column n, its kAhead-th successor prefetched.
template <class F>
inline const uint8_t* super_block_at(const MatMulJob& job, int64_t n, int64_t b) {
  const uint8_t* at = job.weights + n * job.row_bytes + b * F::kBytes;
  for (int line = 0; line < F::kBytes; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(at + kAhead * F::kBytes + line), _MM_HINT_T0);
  }
  return at;
}

// y = reduce(acc), the K-quants' output.
inline void store_sum(const MatMulJob& job, int64_t n, int64_t m, __m256 acc) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  job.y[m * job.n + n] = reduce8(lanes);
}

#if SPECX_ISA == 2
#include "kquant_avx512.h"
#else
#include "kquant_avx2.h"
#endif

template <class F>
void rows_tile(const MatMulJob& job, int64_t n, int64_t m0, int rows) {
  switch (rows) {
    case 1: return small_tile<F, 1>(job, n, m0);
    case 2: return small_tile<F, 2>(job, n, m0);
    case 3: return small_tile<F, 3>(job, n, m0);
    case 4: return small_tile<F, 4>(job, n, m0);
    case 5: return small_tile<F, 5>(job, n, m0);
    case 6: return small_tile<F, 6>(job, n, m0);
    case 7: return small_tile<F, 7>(job, n, m0);
    case 8: return small_tile<F, 8>(job, n, m0);
    default: return;
  }
}

#if SPECX_ISA == 2
// The minimums' terms of blocks b0 .. b0 + count - 1 (b0 a multiple of 8), for R rows and the
// tile's two columns: lane j takes block b0 + j, as small_tile's off[b & 7] does one at a time
// (the same product and fma per lane and block, in block order).
template <int R>
inline void pair_offsets(const MatMulJob& job, int64_t m0, int64_t b0, int count,
                         const float (&ow)[2][8], float (&off)[2][R][8]) {
  const int64_t kc = job.k / kChunk;
  const __mmask8 live = static_cast<__mmask8>((1u << count) - 1);
  const __m256 w0 = _mm256_load_ps(ow[0]), w1 = _mm256_load_ps(ow[1]);
  for (int r = 0; r < R; ++r) {
    const int64_t at = (m0 + r) * kc + b0;
    const __m256 da = _mm256_maskz_loadu_ps(live, job.acts.d + at);
    const __m256 sum = _mm256_cvtepi32_ps(_mm256_maskz_loadu_epi32(live, job.acts.s + at));
    _mm256_store_ps(off[0][r], _mm256_mask3_fmadd_ps(_mm256_mul_ps(w0, da), sum,
                                                     _mm256_load_ps(off[0][r]), live));
    _mm256_store_ps(off[1][r], _mm256_mask3_fmadd_ps(_mm256_mul_ps(w1, da), sum,
                                                     _mm256_load_ps(off[1][r]), live));
  }
}

// Blocks of 32, two columns a 512-bit register (column n in lanes 0..7, n + 1 in 8..15), each
// row's codes broadcast to both halves: per row and block one product and three float
// instructions serve both columns, each lane's operations those of small_tile. Signed codes
// take the activations unsigned (a + 128, a byte's top bit flipped) and start each lane at
// -128 x the sum of its four codes, shared by the rows: the same exact integer sums without a
// sign instruction per row. The minimums' terms (Q4_1, Q5_1) every eight blocks, eight lanes at
// once (pair_offsets).
// Tile: R <= 16 rows x 2 columns, R accumulators; per row and block 4 instructions on the two
// product / fma pipes (product, scale, convert, fma) for 64 multiply-adds, the block's decoding
// shared by R rows.
template <class F, int R>
void small_pair_tile(const MatMulJob& job, int64_t n, int64_t m0) {
  const int64_t k = job.k, kc = k / kChunk;
  __m512 acc[R];
  alignas(32) float off[2][R][8] = {};
  alignas(32) float ow[2][8] = {};
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t* acts = job.acts.q + m0 * k;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < kc; ++b) {
    const uint8_t* at0 = job.weights + n * job.row_bytes + b * F::kBytes;
    const uint8_t* at1 = at0 + job.row_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(at0 + kAheadBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(at1 + kAheadBytes), _MM_HINT_T0);
    const typename F::Simd block0(at0), block1(at1);
    const __m512i w =
        _mm512_inserti64x4(_mm512_zextsi256_si512(block0.codes(0)), block1.codes(0), 1);
    const __m512 ws = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_zextps256_ps512(block0.scales(0))),
                           _mm256_castps_pd(block1.scales(0)), 1));
    const __m512i base =
        F::kSigned ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, w)) : zero;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256i row =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acts + r * k + b * kChunk));
      const __m512i a = _mm512_broadcast_i64x4(row);
      const __m512i lanes = F::kSigned ? _mm512_dpbusd_epi32(base, _mm512_xor_si512(a, flip), w)
                                       : _mm512_dpbusd_epi32(zero, w, a);
      const float da = job.acts.d[(m0 + r) * kc + b];
      const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(da));
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(lanes), acc[r]);
    }
    if constexpr (F::kOffset) {
      ow[0][b & 7] = block0.offset(0);
      ow[1][b & 7] = block1.offset(0);
      if ((b & 7) == 7 || b + 1 == kc) {
        pair_offsets<R>(job, m0, b & ~int64_t{7}, static_cast<int>(b & 7) + 1, ow, off);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[r]);
    float* y = job.y + (m0 + r) * job.n + n;
    y[0] = reduce8(lanes) + (F::kOffset ? reduce8(off[0][r]) : 0.0f);
    y[1] = reduce8(lanes + 8) + (F::kOffset ? reduce8(off[1][r]) : 0.0f);
  }
}

// small_pair_tile<F, R> for R = 1 .. kPairMaxRows, indexed by R - 1.
template <class F, size_t... R>
constexpr auto pair_tiles(std::index_sequence<R...>) {
  return std::array{&small_pair_tile<F, static_cast<int>(R) + 1>...};
}

template <class F>
void pair_rows_tile(const MatMulJob& job, int64_t n, int64_t m0, int rows) {
  static constexpr auto kTiles = pair_tiles<F>(std::make_index_sequence<kPairMaxRows>{});
  kTiles[static_cast<size_t>(rows - 1)](job, n, m0);
}
#endif

// One column at a time, all rows in tiles: the weights stream from memory in order
// (interleaving several columns' rows slows the stream; docs/bench/measurements.md). With
// AVX-512 and several rows, where the products rather than the stream bound the pass, two
// columns a tile (small_pair_tile).
template <class F>
void small_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  int64_t n = n0;
#if SPECX_ISA == 2
  if (job.m >= kPairRows) {
    for (; n + 1 < n1; n += 2) {
      for (int64_t m0 = 0; m0 < job.m; m0 += kPairMaxRows) {
        pair_rows_tile<F>(job, n, m0, static_cast<int>(std::min<int64_t>(kPairMaxRows, job.m - m0)));
      }
    }
  }
#endif
  const int64_t tiles = (job.m + kMaxRows - 1) / kMaxRows;
  for (; n < n1; ++n) {
    for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
      const int64_t rows = (job.m - m0) / (tiles - t);  // the rest, evenly: 9 rows as 4 + 5
      rows_tile<F>(job, n, m0, static_cast<int>(rows));
      m0 += rows;
    }
  }
}

template <class F>
void columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  if constexpr (F::kElements == kMaxBlock) {
    kquant_columns<F>(job, n0, n1);  // kquant_avx2.h, kquant_avx512.h
  } else {
    small_columns<F>(job, n0, n1);
  }
}

}  // namespace

#if SPECX_ISA == 1
// activations.cc's quantize_rows with AVX2: max |x|, one IEEE division, products, round to
// nearest even (nearbyint's default mode): the same bits; then the shared sums.
void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out) {
  const int block = out.block;
  const int64_t blocks = k / block;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * k + b * block;
      int8_t* q = out.q + r * k + b * block;
      __m256 top = _mm256_setzero_ps();
      __m256 bad = _mm256_setzero_ps();  // any lane not finite: x - x is NaN for inf and NaN
      for (int i = 0; i < block; i += 8) {
        const __m256 value = _mm256_loadu_ps(v + i);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, value));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(value, value), _mm256_setzero_ps(),
                                              _CMP_NEQ_UQ));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, top);
      float amax = 0.0f;
      for (float lane : lanes) amax = std::fmax(amax, lane);
      const bool finite = _mm256_movemask_ps(bad) == 0;
      out.d[r * blocks + b] = finite ? amax / 127.0f : std::nanf("");
      const float inverse = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m256 scale = _mm256_set1_ps(inverse);
      for (int i = 0; i < block; i += 32) {
        __m256i codes[4];
        for (int j = 0; j < 4; ++j) {
          const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * j), scale);
          codes[j] = _mm256_cvtps_epi32(
              _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
          if (!finite) codes[j] = _mm256_setzero_si256();
        }
        // int32 -> int8 in order: packs interleave 128-bit lanes, the permute restores them
        const __m256i pairs01 = _mm256_packs_epi32(codes[0], codes[1]);
        const __m256i pairs23 = _mm256_packs_epi32(codes[2], codes[3]);
        const __m256i bytes = _mm256_packs_epi16(pairs01, pairs23);
        const __m256i ordered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), ordered);
      }
    }
  }
  finish_rows(m, k, out);
}
#endif

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
#endif

}  // namespace SPECX_NS
}  // namespace specx
