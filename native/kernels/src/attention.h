// Attention over a preallocated cache, as ONNX Runtime's com.microsoft GroupQueryAttention
// defines it (the subset specx graphs use: separate query, key and value, past and present in
// one buffer, rotary halves not interleaved, a left window), computed so that a query row's
// output depends only on that row and the cache: the same bits in a verify pass as in the
// one-token pass at that position. Each (row, head) runs one fixed sequence of float
// operations: rotary, eight-lane fma dot products reduced in a fixed order, a softmax summed in
// key order, values accumulated by fma in key order, one division.
#pragma once

#include <cstdint>

#include "matmul.h"

namespace specx {

struct AttentionShape {
  int64_t batch, seq;         // new tokens a row
  int64_t heads, kv_heads, head_dim;
  int64_t capacity;           // cache positions (past_key's third dimension)
  int64_t rotary_dim;         // dims rotated from the start of each head (0: no rotary)
  int64_t window;             // keys a query sees, its own included (<= 0: all)
  float scale;
};

struct AttentionJob {
  AttentionShape shape;
  const float* query;      // [batch, seq, heads * head_dim]
  const float* key;        // [batch, seq, kv_heads * head_dim]
  const float* value;
  const int32_t* total;    // [batch]: valid positions after this pass (seqlens_k + 1)
  const float* cos;        // [positions, rotary_dim / 2] or null
  const float* sin;
  float* cache_key;        // [batch, kv_heads, capacity, head_dim]: present, updated in place
  float* cache_value;
  float* out;              // [batch, seq, heads * head_dim]
};

// Writes row b's new keys and values (rotated) into the cache at total[b] - seq ...
void attention_store(const AttentionJob& job, int64_t b);

// Output of the heads of kv group g for (row b, new token i): each query rotated, against cache
// positions [lo, position] of the group; x86 instruction sets from AVX2 take an AVX2 + FMA
// build of the loops, the others the baseline one: the same bits.
void attention_group(Isa isa, const AttentionJob& job, int64_t b, int64_t i, int64_t g);

}  // namespace specx
