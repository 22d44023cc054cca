// Cache attention (attention.h): rotary, scores, softmax and values for one (row, token, kv
// group) at a time, each head in one order whatever the pass's width or thread count.
#include "attention.h"

#include <cmath>
#include <vector>

#include "matmul.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif


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

inline float reduce(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// The two loops every key costs, lane by lane with one rounding per fma: the baseline with
// std::fma, the AVX2 build with its fma instructions; the same bits.
inline float dot(const float* q, const float* k, int64_t dim) {  // lane d % 8, then reduce
  float lanes[kLanes] = {};
  for (int64_t d = 0; d < dim; ++d) lanes[d % kLanes] = std::fma(q[d], k[d], lanes[d % kLanes]);
  return reduce(lanes);
}

inline void accumulate(float w, const float* v, float* o, int64_t dim) {  // o += w * v
  for (int64_t d = 0; d < dim; ++d) o[d] = std::fma(w, v[d], o[d]);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* q, const float* k,
                                                          int64_t dim) {
  __m256 acc = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, acc);
  for (; d < dim; ++d) lanes[d % kLanes] = std::fma(q[d], k[d], lanes[d % kLanes]);
  return reduce(lanes);
}

__attribute__((target("avx2,fma"))) inline void accumulate_avx2(float w, const float* v,
                                                                float* o, int64_t dim) {
  const __m256 weight = _mm256_set1_ps(w);
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    _mm256_storeu_ps(o + d, _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
  }
  for (; d < dim; ++d) o[d] = std::fma(w, v[d], o[d]);
}
#endif

// The heads of group g for token i of row b, against cache positions [lo, position]: each
// head's sums run in its own lanes and key order, so sharing each key's load across the group
// changes no bit. Inlined into a baseline and an AVX2 + FMA build (std::fma: one rounding
// either way, the same bits).
template <bool kAvx2>
__attribute__((always_inline)) inline void group_impl(const AttentionJob& job, int64_t b,
                                                      int64_t i, int64_t g) {
  const AttentionShape& s = job.shape;
  const int64_t dim = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t position = job.total[b] - s.seq + i;
  const int64_t lo = s.window > 0 && position + 1 > s.window ? position + 1 - s.window : 0;
  const int64_t span = position + 1 - lo;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(group * (dim + span + 1)));
  float* rq = scratch.data();             // [group, dim]: the rotated queries
  float* scores = rq + group * dim;       // [group, span]
  float* totals = scores + group * span;  // [group]
  for (int64_t h = 0; h < group; ++h) {
    const float* q = job.query + (b * s.seq + i) * s.heads * dim + (g * group + h) * dim;
    if (s.rotary_dim > 0) {
      rotate(s, job.cos, job.sin, position, q, rq + h * dim);
    } else {
      for (int64_t d = 0; d < dim; ++d) rq[h * dim + d] = q[d];
    }
  }
  const float* keys = job.cache_key + (b * s.kv_heads + g) * s.capacity * dim;
  const float* values = job.cache_value + (b * s.kv_heads + g) * s.capacity * dim;
  for (int64_t j = 0; j < span; ++j) {
    const float* k = keys + (lo + j) * dim;
    for (int64_t h = 0; h < group; ++h) {
      float score;
#if defined(__x86_64__) && defined(__GNUC__)
      if constexpr (kAvx2) {
        score = dot_avx2(rq + h * dim, k, dim);
      } else
#endif
      {
        score = dot(rq + h * dim, k, dim);
      }
      scores[h * span + j] = score * s.scale;
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* w = scores + h * span;
    float top = -INFINITY;
    for (int64_t j = 0; j < span; ++j) top = std::fmax(top, w[j]);
    float total = 0.0f;
    for (int64_t j = 0; j < span; ++j) {
      w[j] = std::exp(w[j] - top);
      total += w[j];
    }
    totals[h] = total;
  }
  float* out = job.out + (b * s.seq + i) * s.heads * dim + g * group * dim;  // [group, dim]
  for (int64_t e = 0; e < group * dim; ++e) out[e] = 0.0f;
  for (int64_t j = 0; j < span; ++j) {
    const float* v = values + (lo + j) * dim;
    for (int64_t h = 0; h < group; ++h) {
#if defined(__x86_64__) && defined(__GNUC__)
      if constexpr (kAvx2) {
        accumulate_avx2(scores[h * span + j], v, out + h * dim, dim);
        continue;
      }
#endif
      accumulate(scores[h * span + j], v, out + h * dim, dim);
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] /= totals[h];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void group_avx2(const AttentionJob& job, int64_t b,
                                                     int64_t i, int64_t g) {
  group_impl<true>(job, b, i, g);
}
#endif

void group_baseline(const AttentionJob& job, int64_t b, int64_t i, int64_t g) {
  group_impl<false>(job, b, i, g);
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

void attention_group(Isa isa, const AttentionJob& job, int64_t b, int64_t i, int64_t g) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512Vnni) return group_avx2(job, b, i, g);
#endif
  (void)isa;
  group_baseline(job, b, i, g);
}

}  // namespace specx
