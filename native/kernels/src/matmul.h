// Y = A W^T over GGUF blocks: the contract every instruction set computes bit for bit.
//
// Activations are quantized per row, in blocks of 32 (quantize_rows): d = amax / 127,
// a = nearbyint(x * (127 / amax)) in [-127, 127], and s = the sum of a block's codes.
// Output (m, n) then walks row n's 32-weight chunks c in order, with eight float lanes:
//     lane j of chunk c:  L_j = sum of w[i] * a[i] for i in 4j .. 4j + 3   (exact, int32)
//     acc_j  = fma(ws[c, j / 4] * d_c, float(L_j), acc_j)
//     off_(c % 8) = fma(wm[c] * d_c, float(s_c), off_(c % 8))   (formats with an offset)
//     y = reduce(acc) + reduce(off),  reduce(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))
// Nothing in it depends on how many rows a pass has, where a row sits or which thread runs it,
// so a verify pass's row equals the one-token pass at that position, bit for bit; the scalar
// reference and each SIMD path compute the same operations (products rounded, fma fused).
#pragma once

#include <cstddef>
#include <cstdint>

#include "blocks.h"

namespace specx {

constexpr int kChunk = 32;

struct QuantRows {  // M rows of K activations as int8 blocks of 32
  int8_t* q;        // [M, K]
  float* d;         // [M, K / 32]
  int32_t* s;       // [M, K / 32]
};

struct MatMulJob {
  const BlockFormat* format;
  const uint8_t* weights;  // [N, row_bytes]: the file's blocks, row by row
  size_t row_bytes;
  int64_t k, n, m;
  QuantRows acts;
  float* y;  // [M, N]
};

enum class Isa { kScalar, kAvx2, kAvx512Vnni, kNeon };

// Instruction sets: the best this CPU runs (SPECX_KERNELS_ISA may name a lower one), by name.
Isa best_isa();
Isa active_isa();
const char* isa_name(Isa isa);
bool isa_from_name(const char* name, Isa* isa);
bool isa_supported(Isa isa);

// Rows [0, m) of x [m, k] to QuantRows (k a multiple of 32); the same on every instruction set.
void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out);

// Output columns [n0, n1) of the job, with the given instruction set's kernel.
void matmul_columns(Isa isa, const MatMulJob& job, int64_t n0, int64_t n1);

// Kernels per instruction set (matmul.cc, compiled once for each).
namespace scalar { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace avx2 { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace avx512vnni { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace neon { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }

// Row r of a [rows, row_bytes] block matrix as k floats: W = ws * w + wm, as gguf dequantizes.
void dequantize_row(const BlockFormat& format, const uint8_t* row, int64_t k, float* out);

}  // namespace specx
