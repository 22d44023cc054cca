// Y = A W^T over GGUF blocks: the contract every instruction set computes bit for bit.
//
// Activations are quantized per row in blocks of the weight format's own size (32, or 256 for
// the K-quants; quantize_rows): d = amax / 127, a = nearbyint(x * (127 / amax)) in [-127, 127];
// s = the sum of each 32 codes, S = the sum of each 16 and fs = d * float(s) (one rounding).
// Lane j of a 32-code chunk is the exact integer
//     L_j = sum of w[i] * a[i] for i in 4j .. 4j + 3.
// Blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): output (m, n) walks row n's blocks c in order,
//     acc_j = fma(ws_c * d_c, float(L_j), acc_j)                       eight float lanes
//     off_(c % 8) = fma(wm_c * d_c, float(s_c), off_(c % 8))           (Q4_1, Q5_1)
//     y = reduce(acc) + reduce(off)
// K-quants (Q4_K, Q5_K, Q6_K) take their codes unsigned (Q6_K's q, not q - 32). Each
// super-block b sums in integers, then once in floats:
//     I_j = sum over its chunks c of sc[2c + j / 4] * L_j                 (exact int32)
//     I_j -= 32 * (sc[2j] * S_2j + sc[2j + 1] * S_2j+1)                   (Q6_K's centre)
//     acc_j = fma(float(I_j) * d_b, da_b, acc_j)
//     acc_j = fma(-(dmin_b * float(mn_j)), fs_j, acc_j)                    (Q4_K, Q5_K)
//     y = reduce(acc)
// with reduce(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)). Nothing in it depends on
// how many rows a pass has, where a row sits or which thread runs it, so a verify pass's row
// equals the one-token pass at that position, bit for bit; the scalar reference and each SIMD
// path compute the same operations (products rounded, fma fused, integers exact).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "blocks.h"

namespace specx {

constexpr int kChunk = 32;

// Two rows of one 256-code block side by side, as the AVX-512 K-quant kernel reads them: one
// 64-byte load feeds both rows' lanes (quantize_rows lays them out where it is given room).
struct alignas(64) PairBlock {
  int8_t q[8][2][32];  // chunk c: row 2p's 32 codes, then row 2p + 1's
  float da[16];        // row 2p's block scale 8 times, then row 2p + 1's
  float fs[16];        // fs of row 2p's 8 chunks, then of row 2p + 1's
  int16_t s16[2][16];  // the sums of each 16 codes, row 2p then row 2p + 1
};

struct QuantRows {  // M rows of K activations as int8 blocks of `block` (32 or 256)
  int8_t* q;        // [M, K]
  float* d;         // [M, K / block]
  int32_t* s;       // [M, K / 32]: sums of each 32 codes
  int block;
  float* fs;         // [M, K / 32]: the chunk's block scale d times float(s)
  int16_t* s16;      // [M, K / 16]: sums of each 16 codes
  PairBlock* pairs;  // [M / 2, K / 256] where the kernel takes rows in pairs, else nullptr
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

// Rows [0, m) of x [m, k] to QuantRows in blocks of out.block (k a multiple of it), with every
// field the pointers name (pairs: where not null); the same on every instruction set.
void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out);

// The sums, fs and pairs of rows whose codes and scales are quantized.
void finish_rows(int64_t m, int64_t k, QuantRows out);

// The same, with the given instruction set's code (the same bits on each).
void quantize_rows(Isa isa, const float* x, int64_t m, int64_t k, QuantRows out);
namespace avx2 { void quantize_rows(const float* x, int64_t m, int64_t k, QuantRows out); }

// The activation block a weight format multiplies with: its own block size.
inline int activation_block(const BlockFormat& format) { return format.elements; }

// Whether an instruction set's kernel reads K-quant rows in pairs (QuantRows::pairs).
inline bool takes_row_pairs(Isa isa, const BlockFormat& format, int64_t m) {
  return isa == Isa::kAvx512Vnni && format.elements == kMaxBlock && m >= 2;
}

// The quantized rows of one call, in buffers grown to the widest call seen and then reused.
class Activations {
 public:
  QuantRows quantize(Isa isa, const BlockFormat& format, const float* x, int64_t m, int64_t k);

 private:
  std::vector<int8_t> q_;
  std::vector<float> d_, fs_;
  std::vector<int32_t> s_;
  std::vector<int16_t> s16_;
  std::vector<PairBlock> pairs_;
};

// Output columns [n0, n1) of the job, with the given instruction set's kernel.
void matmul_columns(Isa isa, const MatMulJob& job, int64_t n0, int64_t n1);

// Kernels per instruction set (matmul.cc, compiled once for each).
namespace scalar { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace avx2 { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace avx512vnni { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }
namespace neon { void matmul_columns(const MatMulJob& job, int64_t n0, int64_t n1); }

// Multiply-adds a second on one thread by the instruction set's integer products from registers
// (src/peak.cc), the best of runs over about `seconds`.
double product_peak(Isa isa, double seconds);
namespace scalar { double product_peak(double seconds); }
namespace avx2 { double product_peak(double seconds); }
namespace avx512vnni { double product_peak(double seconds); }
namespace neon { double product_peak(double seconds); }

// Row r of a [rows, row_bytes] block matrix as k floats: W = ws * w + wm, as gguf dequantizes.
void dequantize_row(const BlockFormat& format, const uint8_t* row, int64_t k, float* out);

}  // namespace specx
