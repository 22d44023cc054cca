// Which SIMD headers a translation unit has: the x86 paths compile where AVX2 is enabled for it
// (the kernels' AVX2 and AVX-512 objects), the NEON one on ARM64.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define SPECX_X86_SIMD 1
#include <immintrin.h>
#else
#define SPECX_X86_SIMD 0
#endif
