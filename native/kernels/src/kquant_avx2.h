// K-quants on AVX2 + FMA (matmul.h's contract), part of matmul.cc's AVX2 object.
// One output column by a tile of up to kSuperRows activation rows: each 32-code chunk of a
// super-block is decoded once into a register and multiplied by every row of the tile.
//
// Tile: R rows x 1 column, R int32 sums in registers (with the chunk's codes, its sub-scale and
// two temporaries: R + 5 of the 16 ymm registers, so R <= 11); the float accumulators live in
// memory, touched once a super-block. Per chunk: the decoding (2-4 instructions, 3 for Q4_K) and
// per row vpmaddubsw (activations from memory) + vpmaddwd (by the sub-scale) + vpaddd: two
// instructions on the two integer-multiply pipes for 32 multiply-adds, so the predicted bound is
// one cycle a row and chunk, 8 R cycles a super-block plus its header and R float epilogues
// (6 instructions each): about 8 R + 30 cycles. The decoding's share falls as 1 / R.
//
// GCC, left alone, computes every product of a super-block first and spills them to add them up
// at its end (the integer sums may be regrouped): a store and a load per product. `keep` pins
// each row's running sum to a register after each chunk, which keeps the loop as written.
#pragma once

#include <cstdint>

#include "matmul.h"

// Most rows a K-quant tile takes (R + 5 ymm registers; measured in docs/bench/measurements.md).
constexpr int kSuperRows = 9;

inline void keep(__m256i& v) { __asm__("" : "+x"(v)); }

template <class F, int R>
void super_tile(const MatMulJob& job, int64_t n, int64_t m0) {
  const int64_t k = job.k, kc = k / kChunk, blocks = k / kMaxBlock, k16 = k / 16;
  alignas(32) float acc[R][8] = {};
  const int8_t* acts = job.acts.q + m0 * k;
  for (int64_t b = 0; b < blocks; ++b) {
    const typename F::Simd block(super_block_at<F>(job, n, b));
    __m256i sums[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (F::kCentre != 0) {  // -32 * (sc_2j * S_2j + sc_2j+1 * S_2j+1)
        const __m256i centre =
            _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(block.sc16, 5));
        sums[r] = _mm256_madd_epi16(centre, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                job.acts.s16 + (m0 + r) * k16 + b * 16)));
      } else {
        sums[r] = _mm256_setzero_si256();
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i w = block.codes(c);
      const __m256i sc = block.sub_scales(c);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(acts + r * k + b * kMaxBlock + kChunk * c));
        const __m256i pairs = _mm256_maddubs_epi16(w, x);  // codes <= 63: no saturation
        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, sc));
        keep(sums[r]);
      }
    }
    const __m256 d = _mm256_set1_ps(block.d);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 da = _mm256_set1_ps(job.acts.d[(m0 + r) * blocks + b]);
      __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums[r]), d), da,
                                 _mm256_load_ps(acc[r]));
      if constexpr (F::kOffset) {
        const __m256 fs = _mm256_loadu_ps(job.acts.fs + (m0 + r) * kc + b * 8);
        a = _mm256_fnmadd_ps(block.wmin, fs, a);
      }
      _mm256_store_ps(acc[r], a);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) job.y[(m0 + r) * job.n + n] = reduce8(acc[r]);
}

// super_tile<F, R> for R = 1 .. kSuperRows, indexed by R - 1.
template <class F, size_t... R>
constexpr auto super_tiles(std::index_sequence<R...>) {
  return std::array{&super_tile<F, static_cast<int>(R) + 1>...};
}

// One column at a time (the weights stream in order), its rows in the fewest tiles of at most
// kSuperRows, as even as they split (10 rows: 5 + 5, not 9 + 1: a one-row tile decodes the
// weights again for a single row).
template <class F>
void kquant_columns(const MatMulJob& job, int64_t n0, int64_t n1) {
  static constexpr auto kTiles = super_tiles<F>(std::make_index_sequence<kSuperRows>{});
  const int64_t tiles = (job.m + kSuperRows - 1) / kSuperRows;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
      const int64_t rows = (job.m - m0) / (tiles - t);  // the rest, evenly
      kTiles[static_cast<size_t>(rows - 1)](job, n, m0);
      m0 += rows;
    }
  }
}
