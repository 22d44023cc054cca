// Cache attention (attention.h): rotary, scores, softmax and values for one (row, token, head)
// at a time, in one order whatever the pass's width or thread count.
#include "attention.h"

#include <cmath>
#include <vector>

namespace specx {
namespace {

constexpr int kLanes = 8;

// Rotates the first rotary_dim dims of x (halves, not interleaved) at `position` into y.
void rotate(const AttentionShape& s, const float* cos, const float* sin, int64_t position,
            const float* x, float* y) {
  const int64_t half = s.rotary_dim / 2;
  const float* c = cos + position * half;
  const float* n = sin + position * half;
  for (int64_t d = 0; d < half; ++d) {
    y[d] = x[d] * c[d] - x[d + half] * n[d];
    y[d + half] = x[d + half] * c[d] + x[d] * n[d];
  }
  for (int64_t d = s.rotary_dim; d < s.head_dim; ++d) y[d] = x[d];
}

// sum of a[d] * b[d] in eight lanes (d % 8), reduced as matmul.h's reduce
float dot(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[d + l] * b[d + l];
  }
  for (; d < n; ++d) lanes[d % kLanes] += a[d] * b[d];
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

}  // namespace

void attention_store(const AttentionJob& job, int64_t b) {
  const AttentionShape& s = job.shape;
  const int64_t past = job.total[b] - s.seq;
  const int64_t width = s.kv_heads * s.head_dim;
  for (int64_t i = 0; i < s.seq; ++i) {
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const int64_t at = ((b * s.kv_heads + g) * s.capacity + past + i) * s.head_dim;
      const float* k = job.key + (b * s.seq + i) * width + g * s.head_dim;
      const float* v = job.value + (b * s.seq + i) * width + g * s.head_dim;
      if (s.rotary_dim > 0) {
        rotate(s, job.cos, job.sin, past + i, k, job.cache_key + at);
      } else {
        for (int64_t d = 0; d < s.head_dim; ++d) job.cache_key[at + d] = k[d];
      }
      for (int64_t d = 0; d < s.head_dim; ++d) job.cache_value[at + d] = v[d];
    }
  }
}

void attention_head(const AttentionJob& job, int64_t b, int64_t i, int64_t h) {
  const AttentionShape& s = job.shape;
  const int64_t dim = s.head_dim;
  const int64_t position = job.total[b] - s.seq + i;
  const int64_t lo = s.window > 0 && position + 1 > s.window ? position + 1 - s.window : 0;
  const int64_t g = h / (s.heads / s.kv_heads);
  const float* q = job.query + (b * s.seq + i) * s.heads * dim + h * dim;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(dim + position + 1));
  float* rq = scratch.data();
  float* scores = rq + dim;
  if (s.rotary_dim > 0) {
    rotate(s, job.cos, job.sin, position, q, rq);
  } else {
    for (int64_t d = 0; d < dim; ++d) rq[d] = q[d];
  }
  const float* keys = job.cache_key + (b * s.kv_heads + g) * s.capacity * dim;
  const float* values = job.cache_value + (b * s.kv_heads + g) * s.capacity * dim;
  float top = -INFINITY;
  for (int64_t j = lo; j <= position; ++j) {
    scores[j] = dot(rq, keys + j * dim, dim) * s.scale;
    top = std::fmax(top, scores[j]);
  }
  float total = 0.0f;
  for (int64_t j = lo; j <= position; ++j) {
    scores[j] = std::exp(scores[j] - top);
    total += scores[j];
  }
  float* out = job.out + (b * s.seq + i) * s.heads * dim + h * dim;
  for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
  for (int64_t j = lo; j <= position; ++j) {
    const float w = scores[j];
    const float* v = values + j * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] += w * v[d];
  }
  for (int64_t d = 0; d < dim; ++d) out[d] /= total;
}

}  // namespace specx
