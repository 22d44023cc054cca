// Cache attention (attention.h): rotary, scores, softmax and values for one (row, token, kv
// group) at a time, each head in one order whatever the pass's width or thread count.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// e^x for the softmax's x <= 0 (scores less their maximum), the same bits on every path: range
// reduction x = n ln2 + r (n rounded to nearest even; ln2 in two parts, by fma), Cephes' degree-6
// polynomial for e^r by fma in one order, 2^n as the exponent's bits; below -87 (e^x under the
// normal floats) 0. Relative error under 2e-7; the AVX2 build computes eight at once with the
// same operations.
constexpr float kExpLow = -87.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float softmax_exp(float x) {
  if (!(x >= kExpLow)) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpP[i]);
  const float rr = r * r;
  const float e = std::fma(p, rr, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return e * scale;
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

// dot_avx2 of NH heads' queries against NK consecutive keys, their NH x NK chains interleaved:
// each dot is a chain of dependent fmas (latency-bound alone), and a dozen independent ones fill
// the pipelines; each keeps its own lanes and order: the same bits as dot_avx2 one by one.
// out[h * stride + k] = dot(rq + h * dim, keys + k * dim).
template <int NH, int NK>
__attribute__((target("avx2,fma"))) inline void block_dots(const float* rq, const float* keys,
                                                           int64_t dim, float* out,
                                                           int64_t stride) {
  __m256 acc[NH][NK];
  for (int h = 0; h < NH; ++h) {
    for (int k = 0; k < NK; ++k) acc[h][k] = _mm256_setzero_ps();
  }
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    __m256 key[NK];
    for (int k = 0; k < NK; ++k) key[k] = _mm256_loadu_ps(keys + k * dim + d);
    for (int h = 0; h < NH; ++h) {
      const __m256 q = _mm256_loadu_ps(rq + h * dim + d);
      for (int k = 0; k < NK; ++k) acc[h][k] = _mm256_fmadd_ps(q, key[k], acc[h][k]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    for (int k = 0; k < NK; ++k) {
      alignas(32) float lanes[kLanes];
      _mm256_store_ps(lanes, acc[h][k]);
      for (int64_t e = d; e < dim; ++e) {
        lanes[e % kLanes] = std::fma(rq[h * dim + e], keys[k * dim + e], lanes[e % kLanes]);
      }
      out[h * stride + k] = reduce(lanes);
    }
  }
}

template <int NH>
__attribute__((target("avx2,fma"))) inline void head_dots(const float* rq, const float* keys,
                                                          int64_t n, int64_t dim, float* out,
                                                          int64_t stride) {
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) block_dots<NH, 4>(rq, keys + k * dim, dim, out + k, stride);
  switch (n - k) {
    case 3: return block_dots<NH, 3>(rq, keys + k * dim, dim, out + k, stride);
    case 2: return block_dots<NH, 2>(rq, keys + k * dim, dim, out + k, stride);
    case 1: return block_dots<NH, 1>(rq, keys + k * dim, dim, out + k, stride);
    default: return;
  }
}

// The scores of `heads` queries against n consecutive keys: out[h * stride + k], three heads
// and four keys at a time.
__attribute__((target("avx2,fma"))) inline void scores_avx2(const float* rq, int64_t heads,
                                                            const float* keys, int64_t n,
                                                            int64_t dim, float* out,
                                                            int64_t stride) {
  int64_t h = 0;
  for (; h + 3 <= heads; h += 3) head_dots<3>(rq + h * dim, keys, n, dim, out + h * stride, stride);
  switch (heads - h) {
    case 2: return head_dots<2>(rq + h * dim, keys, n, dim, out + h * stride, stride);
    case 1: return head_dots<1>(rq + h * dim, keys, n, dim, out + h * stride, stride);
    default: return;
  }
}

// w[j] = softmax_exp(w[j] - top) for j in [0, n), eight at a time.
__attribute__((target("avx2,fma"))) inline void softmax_exp_avx2(float* w, int64_t n, float top) {
  const __m256 low = _mm256_set1_ps(kExpLow), t = _mm256_set1_ps(top);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(w + j), t);
    const __m256 n8 = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n8, _mm256_set1_ps(-kLn2Hi), x);
    r = _mm256_fmadd_ps(n8, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpP[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[i]));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n8), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
    const __m256 keep = _mm256_cmp_ps(x, low, _CMP_GE_OQ);  // x >= -87 (NaN: not)
    _mm256_storeu_ps(w + j, _mm256_and_ps(y, keep));
  }
  for (; j < n; ++j) w[j] = softmax_exp(w[j] - top);
}

// out[d] += sum over keys j in order of w[j] * v_j[d] (out from 0 where `first`), by fma, for
// one head over a block of keys: each output lane is its own chain in key order (the same bits
// as accumulating key by key), the head's outputs held in registers 64 at a time while the
// block's keys, in the L1 cache for every head of the group, stream past.
template <int N>
__attribute__((target("avx2,fma"))) inline void weighted_chunks(const float* w, const float* v,
                                                                int64_t keys, int64_t dim,
                                                                bool first, float* out) {
  __m256 acc[N];
  for (int c = 0; c < N; ++c) {
    acc[c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + kLanes * c);
  }
  for (int64_t j = 0; j < keys; ++j) {
    const __m256 weight = _mm256_set1_ps(w[j]);
    const float* row = v + j * dim;
    for (int c = 0; c < N; ++c) {
      acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + kLanes * c), acc[c]);
    }
  }
  for (int c = 0; c < N; ++c) _mm256_storeu_ps(out + kLanes * c, acc[c]);
}

__attribute__((target("avx2,fma"))) inline void weighted_sum_avx2(const float* w, const float* v,
                                                                  int64_t keys, int64_t dim,
                                                                  bool first, float* out) {
  int64_t d = 0;
  for (; d + 8 * kLanes <= dim; d += 8 * kLanes) {
    weighted_chunks<8>(w, v + d, keys, dim, first, out + d);
  }
  switch ((dim - d) / kLanes) {
    case 7: weighted_chunks<7>(w, v + d, keys, dim, first, out + d); break;
    case 6: weighted_chunks<6>(w, v + d, keys, dim, first, out + d); break;
    case 5: weighted_chunks<5>(w, v + d, keys, dim, first, out + d); break;
    case 4: weighted_chunks<4>(w, v + d, keys, dim, first, out + d); break;
    case 3: weighted_chunks<3>(w, v + d, keys, dim, first, out + d); break;
    case 2: weighted_chunks<2>(w, v + d, keys, dim, first, out + d); break;
    case 1: weighted_chunks<1>(w, v + d, keys, dim, first, out + d); break;
    default: break;
  }
  for (d += (dim - d) / kLanes * kLanes; d < dim; ++d) {
    float o = first ? 0.0f : out[d];
    for (int64_t j = 0; j < keys; ++j) o = std::fma(w[j], v[j * dim + d], o);
    out[d] = o;
  }
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
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (kAvx2) {
    scores_avx2(rq, group, keys + lo * dim, span, dim, scores, span);
    for (int64_t e = 0; e < group * span; ++e) scores[e] *= s.scale;
  } else
#endif
  {
    for (int64_t j = 0; j < span; ++j) {
      const float* k = keys + (lo + j) * dim;
      for (int64_t h = 0; h < group; ++h) scores[h * span + j] = dot(rq + h * dim, k, dim) * s.scale;
    }
  }
  for (int64_t h = 0; h < group; ++h) {
    float* w = scores + h * span;
    float top = -INFINITY;
    for (int64_t j = 0; j < span; ++j) top = std::fmax(top, w[j]);
#if defined(__x86_64__) && defined(__GNUC__)
    if constexpr (kAvx2) {
      softmax_exp_avx2(w, span, top);
    } else
#endif
    {
      for (int64_t j = 0; j < span; ++j) w[j] = softmax_exp(w[j] - top);
    }
    float total = 0.0f;
    for (int64_t j = 0; j < span; ++j) total += w[j];
    totals[h] = total;
  }
  float* out = job.out + (b * s.seq + i) * s.heads * dim + g * group * dim;  // [group, dim]
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (kAvx2) {  // blocks of keys, a head at a time in registers (the same chains)
    constexpr int64_t kBlock = 32;  // keys whose values stay in L1 while the heads read them
    for (int64_t j0 = 0; j0 < span; j0 += kBlock) {
      const int64_t keys = std::min(kBlock, span - j0);
      for (int64_t h = 0; h < group; ++h) {
        weighted_sum_avx2(scores + h * span + j0, values + (lo + j0) * dim, keys, dim, j0 == 0,
                          out + h * dim);
      }
    }
  } else
#endif
  {
    for (int64_t e = 0; e < group * dim; ++e) out[e] = 0.0f;
    for (int64_t j = 0; j < span; ++j) {
      const float* v = values + (lo + j) * dim;
      for (int64_t h = 0; h < group; ++h) accumulate(scores[h * span + j], v, out + h * dim, dim);
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
