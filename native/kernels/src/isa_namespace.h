// SPECX_NS: the namespace of the instruction set a translation unit is compiled for (SPECX_ISA:
// 0 scalar, 1 AVX2 + FMA, 2 AVX-512 VL + VNNI, 3 NEON), shared by matmul.cc and peak.cc.
#pragma once

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
