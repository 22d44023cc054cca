// Which vector instructions share execution pipes on this CPU: loops of 8 (or 16, 24) independent
// 512-bit instructions from registers, cycles per loop (at the clock given below: measure it,
// e.g. from a chain of dependent adds, and pass it as the first argument). Two kinds that take
// about the sum of their times together share pipes; about the larger one, they run side by side.
// docs/bench/measurements.md, "The measured peak, and a contract with fewer multiplies".
//   g++ -O2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi \
//       -o /tmp/vector_ports scripts/diagnostics/vector_ports.cc && /tmp/vector_ports 3.63
#include <chrono>
#include <cstdio>
#include <cstdlib>
using clk = std::chrono::steady_clock;
constexpr long N = 50'000'000;
#define LOOP(NAME, BODY) static void NAME() { long n = N; __asm__ volatile( \
  "vpxord %%zmm0,%%zmm0,%%zmm0\n\t vpternlogd $0xff,%%zmm30,%%zmm30,%%zmm30\n\t vpabsb %%zmm30,%%zmm31\n\t vmovdqa64 %%zmm31,%%zmm29\n\t" \
  "1:\n\t" BODY "dec %0\n\t jnz 1b" : "+r"(n) :: "cc", "memory", \
  "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm24","xmm25","xmm26","xmm27","xmm28","xmm29","xmm30","xmm31"); }
#define R8(OP) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8)
#define DP(i) "vpdpbusd %%zmm31,%%zmm30,%%zmm" #i "\n\t"
#define DPY(i) "vpdpbusd %%ymm31,%%ymm30,%%ymm" #i "\n\t"
#define MB(i) "vpmaddubsw %%zmm31,%%zmm30,%%zmm" #i "\n\t"
#define DW(i) "vpdpwssd %%zmm31,%%zmm30,%%zmm" #i "\n\t"
#define MADD(i) "vpmaddwd %%zmm31,%%zmm30,%%zmm" #i "\n\t"
#define MUL(i) "vpmulld %%zmm31,%%zmm30,%%zmm" #i "\n\t"
#define FMA(i) "vfmadd231ps %%zmm31,%%zmm30,%%zmm1" #i "\n\t"
#define FADD(i) "vaddps %%zmm31,%%zmm1" #i ",%%zmm1" #i "\n\t"
#define FMUL(i) "vmulps %%zmm31,%%zmm30,%%zmm1" #i "\n\t"
#define CVT(i) "vcvtdq2ps %%zmm31,%%zmm1" #i "\n\t"
#define ADD(i) "vpaddd %%zmm31,%%zmm2" #i ",%%zmm2" #i "\n\t"
#define AND(i) "vpandd %%zmm31,%%zmm2" #i ",%%zmm2" #i "\n\t"
#define SRL(i) "vpsrlw $4,%%zmm29,%%zmm2" #i "\n\t"
#define PERMW(i) "vpermw %%zmm31,%%zmm29,%%zmm2" #i "\n\t"
#define PERMB(i) "vpermb %%zmm31,%%zmm29,%%zmm2" #i "\n\t"
#define SHUFB(i) "vpshufb %%zmm31,%%zmm29,%%zmm2" #i "\n\t"
#define SHUF64(i) "vshufi64x2 $0x44,%%zmm31,%%zmm29,%%zmm2" #i "\n\t"
#define LD(i) "vmovdqu64 -64(%%rsp),%%zmm2" #i "\n\t"
#define BCST(i) "vbroadcastss -8(%%rsp),%%zmm2" #i "\n\t"
LOOP(t_dp, R8(DP)) LOOP(t_dpy, R8(DPY)) LOOP(t_mb, R8(MB)) LOOP(t_dw, R8(DW)) LOOP(t_madd, R8(MADD)) LOOP(t_mul, R8(MUL))
LOOP(t_fma, R8(FMA)) LOOP(t_fadd, R8(FADD)) LOOP(t_fmul, R8(FMUL)) LOOP(t_cvt, R8(CVT)) LOOP(t_add, R8(ADD))
LOOP(t_dp_fma, R8(DP) R8(FMA)) LOOP(t_dp_mb, R8(DP) R8(MB)) LOOP(t_mb_dw, R8(MB) R8(DW)) LOOP(t_dp_cvt, R8(DP) R8(CVT))
LOOP(t_dp_fadd, R8(DP) R8(FADD)) LOOP(t_dp_add, R8(DP) R8(ADD)) LOOP(t_dp_and, R8(DP) R8(AND)) LOOP(t_dp_srl, R8(DP) R8(SRL))
LOOP(t_dp_permw, R8(DP) R8(PERMW)) LOOP(t_dp_permb, R8(DP) R8(PERMB)) LOOP(t_dp_shufb, R8(DP) R8(SHUFB)) LOOP(t_dp_shuf64, R8(DP) R8(SHUF64))
LOOP(t_dp_mul, R8(DP) R8(MUL)) LOOP(t_dp_madd, R8(DP) R8(MADD)) LOOP(t_dp_ld, R8(DP) R8(LD)) LOOP(t_dp_ld_ld, R8(DP) R8(LD) R8(LD)) LOOP(t_dp_bcst, R8(DP) R8(BCST))
LOOP(t_dp_cvt_fma, R8(DP) R8(CVT) R8(FMA)) LOOP(t_dp_add_cvt, R8(DP) R8(ADD) R8(CVT))
static double ghz = 3.63;
static void run(const char* name, void (*f)()) {
  auto t0 = clk::now(); f(); double s = std::chrono::duration<double>(clk::now() - t0).count();
  printf("%-24s %5.2f cycles per iteration (%.2f GHz)\n", name, s / N * ghz * 1e9, ghz);
}
int main(int argc, char** argv) {
  if (argc > 1) ghz = std::atof(argv[1]);
  run("8 dpbusd zmm", t_dp); run("8 dpbusd ymm", t_dpy); run("8 maddubs", t_mb); run("8 dpwssd", t_dw); run("8 pmaddwd", t_madd); run("8 pmulld", t_mul);
  run("8 fma", t_fma); run("8 fadd", t_fadd); run("8 fmul", t_fmul); run("8 cvtdq2ps", t_cvt); run("8 paddd", t_add);
  run("8 dp + 8 fma", t_dp_fma); run("8 dp + 8 maddubs", t_dp_mb); run("8 maddubs + 8 dpwssd", t_mb_dw); run("8 dp + 8 cvt", t_dp_cvt);
  run("8 dp + 8 fadd", t_dp_fadd); run("8 dp + 8 paddd", t_dp_add); run("8 dp + 8 pand", t_dp_and); run("8 dp + 8 psrlw", t_dp_srl);
  run("8 dp + 8 vpermw", t_dp_permw); run("8 dp + 8 vpermb", t_dp_permb); run("8 dp + 8 pshufb", t_dp_shufb); run("8 dp + 8 shufi64x2", t_dp_shuf64);
  run("8 dp + 8 pmulld", t_dp_mul); run("8 dp + 8 pmaddwd", t_dp_madd); run("8 dp + 8 load", t_dp_ld); run("8 dp + 16 load", t_dp_ld_ld); run("8 dp + 8 bcst", t_dp_bcst);
  run("8 dp + 8 cvt + 8 fma", t_dp_cvt_fma); run("8 dp + 8 paddd + 8 cvt", t_dp_add_cvt);
}
