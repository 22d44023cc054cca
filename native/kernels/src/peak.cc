// The instruction set's integer products from registers, on one thread: the peak that the
// kernels' throughput is reported against (specx_kernels_peak; scripts/diagnostics/
// kernel_costs.py), measured on the machine at hand rather than taken from a data sheet.
// Independent accumulators, more of them than a product's latency in cycles times the
// instructions a cycle issues, so that only throughput bounds the loop; no memory operand.
//   AVX-512 VNNI: vpdpbusd zmm, 64 multiply-adds an instruction (the ISA's best int8 product;
//     the K-quant kernel's vpmaddubsw + vpdpwssd pair gets at most half of it).
//   AVX2: vpmaddubsw + vpmaddwd + vpaddd, 32 multiply-adds a triple (what its kernels run).
//   NEON: vmull_s8 + vpadalq_s16, 8 multiply-adds a pair (the portable kernel's products).
//   scalar: int32 multiply-adds.
#include <chrono>
#include <cstdint>

#include "matmul.h"

#if SPECX_ISA == 1 || SPECX_ISA == 2
#include <immintrin.h>
#elif SPECX_ISA == 3
#include <arm_neon.h>
#endif

#include "isa_namespace.h"

namespace specx {
namespace SPECX_NS {
namespace {

volatile int64_t sink;  // the sums leave the loop: nothing is optimized away

// Multiply-adds done by `rounds` rounds of the loop.
int64_t products(int64_t rounds) {
#if SPECX_ISA == 2
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  // distinct sums: equal ones would be one chain to the compiler
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
          c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
          c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
          c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11);
  for (int64_t r = 0; r < rounds; ++r) {
    c0 = _mm512_dpbusd_epi32(c0, a, b);
    c1 = _mm512_dpbusd_epi32(c1, a, b);
    c2 = _mm512_dpbusd_epi32(c2, a, b);
    c3 = _mm512_dpbusd_epi32(c3, a, b);
    c4 = _mm512_dpbusd_epi32(c4, a, b);
    c5 = _mm512_dpbusd_epi32(c5, a, b);
    c6 = _mm512_dpbusd_epi32(c6, a, b);
    c7 = _mm512_dpbusd_epi32(c7, a, b);
    c8 = _mm512_dpbusd_epi32(c8, a, b);
    c9 = _mm512_dpbusd_epi32(c9, a, b);
    c10 = _mm512_dpbusd_epi32(c10, a, b);
    c11 = _mm512_dpbusd_epi32(c11, a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));  // a and b may change: each round computes
  }
  const __m512i s = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                       _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7))),
      _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  sink = lanes[0] + lanes[15];
  return rounds * 12 * 64;
#elif SPECX_ISA == 1
  __m256i a = _mm256_set1_epi8(1);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i b0 = _mm256_set1_epi8(2), b1 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4),
          b3 = _mm256_set1_epi8(5), b4 = _mm256_set1_epi8(6), b5 = _mm256_set1_epi8(7);
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
          c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5);
  auto product = [&](__m256i acc, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  };
  for (int64_t r = 0; r < rounds; ++r) {
    c0 = product(c0, b0);
    c1 = product(c1, b1);
    c2 = product(c2, b2);
    c3 = product(c3, b3);
    c4 = product(c4, b4);
    c5 = product(c5, b5);
    __asm__ volatile("" : "+x"(a));  // a may change: each round computes
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                     _mm256_add_epi32(c4, c5));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  sink = lanes[0] + lanes[7];
  return rounds * 6 * 32;
#elif SPECX_ISA == 3
  int8x8_t a = vdup_n_s8(1);
  const int8x8_t b0 = vdup_n_s8(2), b1 = vdup_n_s8(3), b2 = vdup_n_s8(4), b3 = vdup_n_s8(5),
                 b4 = vdup_n_s8(6), b5 = vdup_n_s8(7), b6 = vdup_n_s8(8), b7 = vdup_n_s8(9);
  int32x4_t c0 = vdupq_n_s32(0), c1 = vdupq_n_s32(1), c2 = vdupq_n_s32(2), c3 = vdupq_n_s32(3),
            c4 = vdupq_n_s32(4), c5 = vdupq_n_s32(5), c6 = vdupq_n_s32(6), c7 = vdupq_n_s32(7);
  for (int64_t r = 0; r < rounds; ++r) {
    c0 = vpadalq_s16(c0, vmull_s8(a, b0));
    c1 = vpadalq_s16(c1, vmull_s8(a, b1));
    c2 = vpadalq_s16(c2, vmull_s8(a, b2));
    c3 = vpadalq_s16(c3, vmull_s8(a, b3));
    c4 = vpadalq_s16(c4, vmull_s8(a, b4));
    c5 = vpadalq_s16(c5, vmull_s8(a, b5));
    c6 = vpadalq_s16(c6, vmull_s8(a, b6));
    c7 = vpadalq_s16(c7, vmull_s8(a, b7));
    __asm__ volatile("" : "+w"(a));  // a may change: each round computes
  }
  const int32x4_t s = vaddq_s32(vaddq_s32(vaddq_s32(c0, c1), vaddq_s32(c2, c3)),
                                vaddq_s32(vaddq_s32(c4, c5), vaddq_s32(c6, c7)));
  sink = vaddvq_s32(s);
  return rounds * 8 * 8;
#else
  int32_t a = 1;
  int32_t c0 = 0, c1 = 1, c2 = 2, c3 = 3, c4 = 4, c5 = 5, c6 = 6, c7 = 7;
  for (int64_t r = 0; r < rounds; ++r) {
    c0 += a * 2;
    c1 += a * 3;
    c2 += a * 4;
    c3 += a * 5;
    c4 += a * 6;
    c5 += a * 7;
    c6 += a * 8;
    c7 += a * 9;
    __asm__ volatile("" : "+r"(a));  // a may change: each round computes
  }
  sink = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
  return rounds * 8;
#endif
}

}  // namespace

double product_peak(double seconds) {
  using clock = std::chrono::steady_clock;
  products(1 << 16);  // warm the unit (AVX-512 licences, clocks)
  double best = 0.0;
  const auto end = clock::now() + std::chrono::duration<double>(seconds);
  int64_t rounds = 1 << 16;
  do {  // the best of repeated runs of about a millisecond: the VM's neighbours only slow it
    const auto t0 = clock::now();
    const int64_t done = products(rounds);
    const double took = std::chrono::duration<double>(clock::now() - t0).count();
    if (took < 5e-4) {
      rounds *= 2;
      continue;
    }
    best = done / took > best ? done / took : best;
  } while (clock::now() < end);
  return best;
}

}  // namespace SPECX_NS
}  // namespace specx
