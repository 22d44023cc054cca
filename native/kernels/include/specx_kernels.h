/* specx kernels: matmul and gather over GGUF blocks as the file stores them.
 *
 * The library is an ONNX Runtime custom-op library (RegisterCustomOps: ops GgufMatMul and
 * GgufGather in the domain "specx"); this header is its small C ABI beside the ops, for tools
 * and tests: what the library holds, which instruction set it dispatches to, and the kernels
 * themselves on plain buffers. Every fallible call returns SPECX_KERNELS_OK or an error code
 * and writes a message into the caller's buffer; nothing is thrown across it.
 */
#ifndef SPECX_KERNELS_H
#define SPECX_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPECX_KERNELS_API __attribute__((visibility("default")))
#else
#define SPECX_KERNELS_API
#endif

#define SPECX_KERNELS_ABI_VERSION 1
#define SPECX_KERNELS_DOMAIN "specx"

enum specx_kernels_status {
  SPECX_KERNELS_OK = 0,
  SPECX_KERNELS_BAD_ARGUMENT = 1,   /* a null pointer, a size that does not fit */
  SPECX_KERNELS_UNKNOWN_TYPE = 2,   /* a GGML type the kernels do not hold */
  SPECX_KERNELS_UNSUPPORTED_ISA = 3 /* an instruction set this CPU (or build) lacks */
};

SPECX_KERNELS_API int specx_kernels_abi_version(void);
SPECX_KERNELS_API const char* specx_kernels_version(void);
/* The instruction set the ops dispatch to ("avx512vnni", "avx2", "neon" or "scalar"). */
SPECX_KERNELS_API const char* specx_kernels_isa(void);
/* 1 where `isa` names an instruction set this CPU and build run, else 0. */
SPECX_KERNELS_API int specx_kernels_isa_supported(const char* isa);
/* The GGML types held, by name: "Q4_0, Q4_1, ...". */
SPECX_KERNELS_API const char* specx_kernels_formats(void);
/* Weights a block of `type` holds and the bytes it takes. */
SPECX_KERNELS_API int specx_kernels_block_shape(int type, int* elements, int* bytes);

/* y [m, n] = x [m, k] times the block matrix [n, k] (row r: k / elements blocks, as stored),
 * on one thread with instruction set `isa` (NULL: the ops' own). */
SPECX_KERNELS_API int specx_kernels_matmul(const char* isa, int type, const uint8_t* weights, int64_t n,
                                           int64_t k, const float* x, int64_t m, float* y, char* message, size_t message_len);

/* Multiply-adds a second on one thread by `isa`'s integer product instructions from registers
 * (NULL: the ops' own), the best of runs over about `seconds` (> 0, <= 10): the peak a kernel's
 * throughput is a fraction of (vpdpbusd for AVX-512 VNNI, vpmaddubsw + vpmaddwd for AVX2). */
SPECX_KERNELS_API int specx_kernels_peak(const char* isa, double seconds, double* macs_per_second,
                                         char* message, size_t message_len);

/* y [rows, k]: the block matrix's values, as the gguf package dequantizes them. */
SPECX_KERNELS_API int specx_kernels_dequantize(int type, const uint8_t* weights, int64_t rows, int64_t k, float* y,
                             char* message, size_t message_len);

#ifdef __cplusplus
}
#endif

#endif /* SPECX_KERNELS_H */
