// K-quants on AVX-512 VL + BW + VNNI (matmul.h's contract), part of matmul.cc's AVX-512 object.
// A super-block's chunks are decoded two at a time (F::Simd::pair: one 512-bit register).
// Rows go in pairs: each 512-bit product takes one chunk of the weights, duplicated, against the
// same chunk of two rows (quantize_rows' PairBlock), so its 16 lanes are both rows' 8 and a pair
// costs one instruction where two rows would cost two. An odd row takes the chunk pairs against
// its own codes and folds the two halves; integer sums are exact, so both ways give the same I_j.
#pragma once

#include <cstdint>

#include "matmul.h"

// Word indexes that spread the 16 scales of a super-block (int16, one per 16 codes) over the
// four 128-bit quarters of a product: 0..3 chunks 2p and 2p + 1; 4..11 chunk c twice.
struct ScaleIndex {
  alignas(64) int16_t v[12][32];
};
constexpr ScaleIndex make_scale_index() {
  ScaleIndex x{};
  for (int l = 0; l < 32; ++l) {
    const int quarter = l / 8;
    for (int p = 0; p < 4; ++p) x.v[p][l] = static_cast<int16_t>(4 * p + quarter);
    for (int c = 0; c < 8; ++c) x.v[4 + c][l] = static_cast<int16_t>(2 * c + quarter % 2);
  }
  return x;
}
alignas(64) constexpr ScaleIndex kScaleIndex = make_scale_index();

inline __m512i spread_scales(int index, __m256i sc16) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kScaleIndex.v[index]),
                                  _mm512_castsi256_si512(sc16));
}

inline __m512 both_halves(__m256 v) {
  const __m512 z = _mm512_castps256_ps512(v);
  return _mm512_shuffle_f32x4(z, z, 0x44);
}

// Output column n for P row pairs from m0 and, where S, the row m0 + 2P alone.
template <class F, int P, int S>
void kquant_tile(const MatMulJob& job, int64_t n, int64_t m0) {
  constexpr int kPairs = P > 0 ? P : 1;
  const int64_t k = job.k, kc = k / kChunk, blocks = k / kMaxBlock, k16 = k / 16;
  const int64_t lone = m0 + 2 * P;
  const int8_t* row = job.acts.q + lone * k;
  const PairBlock* pairs = P > 0 ? job.acts.pairs + (m0 / 2) * blocks : nullptr;
  __m512 acc2[kPairs];
  __m256 acc1 = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int q = 0; q < kPairs; ++q) acc2[q] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const typename F::Simd block(super_block_at<F>(job, n, b));
    __m512i wide[kPairs];
    __m512i one = _mm512_setzero_si512();
    if constexpr (F::kCentre != 0) {  // -32 * (sc_2j * S_2j + sc_2j+1 * S_2j+1)
      const __m256i centre =
          _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(block.sc16, 5));
      const __m512i centre2 = _mm512_broadcast_i64x4(centre);
#pragma GCC unroll 8
      for (int q = 0; q < P; ++q) {
        wide[q] = _mm512_madd_epi16(centre2, _mm512_load_si512(pairs[q * blocks + b].s16));
      }
      if constexpr (S) {
        one = _mm512_zextsi256_si512(_mm256_madd_epi16(
            centre, _mm256_loadu_si256(
                        reinterpret_cast<const __m256i*>(job.acts.s16 + lone * k16 + b * 16))));
      }
    } else {
#pragma GCC unroll 8
      for (int q = 0; q < kPairs; ++q) wide[q] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i w = block.pair(p);  // codes <= 63: maddubs does not saturate
      if constexpr (S) {
        const __m512i x = _mm512_loadu_si512(row + b * kMaxBlock + 2 * kChunk * p);
        one = _mm512_dpwssd_epi32(one, _mm512_maddubs_epi16(w, x), spread_scales(p, block.sc16));
      }
#pragma GCC unroll 2
      for (int h = 0; h < (P > 0 ? 2 : 0); ++h) {
        const int c = 2 * p + h;
        const __m512i dup = h == 0 ? _mm512_shuffle_i64x2(w, w, 0x44) : _mm512_shuffle_i64x2(w, w, 0xee);
        const __m512i sc = spread_scales(4 + c, block.sc16);
#pragma GCC unroll 8
        for (int q = 0; q < P; ++q) {
          const __m512i x = _mm512_load_si512(pairs[q * blocks + b].q[c]);
          wide[q] = _mm512_dpwssd_epi32(wide[q], _mm512_maddubs_epi16(dup, x), sc);
        }
      }
    }
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q) {
      const PairBlock& pb = pairs[q * blocks + b];
      const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(wide[q]), _mm512_set1_ps(block.d));
      acc2[q] = _mm512_fmadd_ps(scaled, _mm512_load_ps(pb.da), acc2[q]);
      if constexpr (F::kOffset) {
        acc2[q] = _mm512_fnmadd_ps(both_halves(block.wmin), _mm512_load_ps(pb.fs), acc2[q]);
      }
    }
    if constexpr (S) {
      const __m256i folded =
          _mm256_add_epi32(_mm512_castsi512_si256(one), _mm512_extracti64x4_epi64(one, 1));
      const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(folded), _mm256_set1_ps(block.d));
      const __m256 da = _mm256_set1_ps(job.acts.d[lone * blocks + b]);
      acc1 = _mm256_fmadd_ps(scaled, da, acc1);
      if constexpr (F::kOffset) {
        acc1 = _mm256_fnmadd_ps(block.wmin, _mm256_loadu_ps(job.acts.fs + lone * kc + b * 8),
                                     acc1);
      }
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < P; ++q) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc2[q]);
    job.y[(m0 + 2 * q) * job.n + n] = reduce8(lanes);
    job.y[(m0 + 2 * q + 1) * job.n + n] = reduce8(lanes + 8);
  }
  if constexpr (S) store_sum(job, n, lone, acc1);
}

template <class F>
void kquant_rows(const MatMulJob& job, int64_t n, int64_t m0, int rows) {
  switch (rows) {
    case 1: return kquant_tile<F, 0, 1>(job, n, m0);
    case 2: return kquant_tile<F, 1, 0>(job, n, m0);
    case 3: return kquant_tile<F, 1, 1>(job, n, m0);
    case 4: return kquant_tile<F, 2, 0>(job, n, m0);
    case 5: return kquant_tile<F, 2, 1>(job, n, m0);
    case 6: return kquant_tile<F, 3, 0>(job, n, m0);
    case 7: return kquant_tile<F, 3, 1>(job, n, m0);
    case 8: return kquant_tile<F, 4, 0>(job, n, m0);
    case 9: return kquant_tile<F, 4, 1>(job, n, m0);
    default: return;
  }
}

// One column at a time: the weights stream from memory in order (interleaving two columns'
// rows slows the stream; docs/bench/measurements.md). Tiles of 8 rows (m0 stays even: pairs
// start there), the last of up to 9: K = 8 is one tile.
template <class F>
void kquant_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m0 = 0; m0 < job.m; m0 += 8) {
      const int rows = static_cast<int>(job.m - m0 <= 9 ? job.m - m0 : 8);
      kquant_rows<F>(job, n, m0, rows);
      if (rows == 9) break;
    }
  }
}
