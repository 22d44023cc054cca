// Which kernel runs: the best instruction set this CPU has, chosen once at load;
// SPECX_KERNELS_ISA=scalar|avx2|avx512vnni|neon asks for another that the CPU also runs.
#include <cstdlib>
#include <initializer_list>
#include <cstring>

#include "matmul.h"

namespace specx {

static const char* const kNames[] = {"scalar", "avx2", "avx512vnni", "neon"};

const char* isa_name(Isa isa) { return kNames[static_cast<int>(isa)]; }

bool isa_from_name(const char* name, Isa* isa) {
  for (int i = 0; i < 4; ++i) {
    if (std::strcmp(name, kNames[i]) == 0) {
      *isa = static_cast<Isa>(i);
      return true;
    }
  }
  return false;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512Vnni:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return true;  // Advanced SIMD is part of every ARMv8-A core
#endif
    default:
      return false;
  }
}

Isa best_isa() {
  for (Isa isa : {Isa::kAvx512Vnni, Isa::kAvx2, Isa::kNeon}) {
    if (isa_supported(isa)) return isa;
  }
  return Isa::kScalar;
}

Isa active_isa() {
  static const Isa chosen = [] {
    const char* asked = std::getenv("SPECX_KERNELS_ISA");
    Isa isa;
    if (asked != nullptr && isa_from_name(asked, &isa) && isa_supported(isa)) return isa;
    return best_isa();
  }();
  return chosen;
}

void quantize_rows(Isa isa, const float* x, int64_t m, int64_t k, QuantRows out) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512Vnni) return avx2::quantize_rows(x, m, k, out);
#endif
  (void)isa;
  quantize_rows(x, m, k, out);
}

void matmul_columns(Isa isa, const MatMulJob& job, int64_t n0, int64_t n1) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx2:
      return avx2::matmul_columns(job, n0, n1);
    case Isa::kAvx512Vnni:
      return avx512vnni::matmul_columns(job, n0, n1);
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return neon::matmul_columns(job, n0, n1);
#endif
    default:
      return scalar::matmul_columns(job, n0, n1);
  }
}

double product_peak(Isa isa, double seconds) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::kAvx2:
      return avx2::product_peak(seconds);
    case Isa::kAvx512Vnni:
      return avx512vnni::product_peak(seconds);
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return neon::product_peak(seconds);
#endif
    default:
      return scalar::product_peak(seconds);
  }
}

}  // namespace specx
