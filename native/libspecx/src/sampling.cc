#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace specx {
namespace {

constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull, kMix2 = 0x94D049BB133111EBull;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kZeroResidual = 1e-12;  // a residual with less mass is numerically zero
constexpr size_t kKeep = 40;             // positions whose exponentials are kept

uint64_t mix(uint64_t z) {  // SplitMix64's finalizer
  z ^= z >> 30;
  z *= kMix1;
  z ^= z >> 27;
  z *= kMix2;
  return z ^ (z >> 31);
}

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

void normalize(std::vector<double>& p) {
  const double total = sum(p);
  for (double& x : p) x /= total;
}

}  // namespace

uint64_t counter_key(uint64_t seed, uint64_t stream, uint64_t position) {
  return mix(mix(mix(seed) + stream) + position);
}

double counter_uniform(uint64_t key, uint64_t index) {
  return double(mix(key + (index + 1) * kGolden) >> 11) * 0x1p-53;
}

const std::vector<double>& Noise::exponentials(int64_t position) {
  auto it = kept_.find(position);
  if (it != kept_.end()) return it->second;
  if (kept_.size() >= kKeep) kept_.erase(kept_.begin());  // the oldest position
  std::vector<double> e(static_cast<size_t>(vocab_));
  const uint64_t key = counter_key(seed_, kRace, uint64_t(position));
  for (int64_t i = 0; i < vocab_; ++i) e[size_t(i)] = -std::log1p(-counter_uniform(key, uint64_t(i)));
  return kept_.emplace(position, std::move(e)).first->second;
}

double Noise::uniform(uint64_t stream, int64_t position) const {
  return counter_uniform(counter_key(seed_, stream, uint64_t(position)), 0);
}

std::vector<double> warp(const float* logits, int64_t n, const Sampling& s) {
  std::vector<double> x(logits, logits + n);
  const double inf = std::numeric_limits<double>::infinity();
  // Shift by the max before dividing: any finite temperature > 0 is then safe.
  const double top = *std::max_element(x.begin(), x.end());
  for (double& v : x) v = (v - top) / s.temperature;
  if (s.top_k > 0 && s.top_k < n) {  // keep every logit reaching the k-th largest (ties stay)
    std::vector<double> sorted = x;
    std::nth_element(sorted.begin(), sorted.begin() + (n - s.top_k), sorted.end());
    const double kth = sorted[size_t(n - s.top_k)];
    for (double& v : x)
      if (v < kth) v = -inf;
  }
  const double shift = *std::max_element(x.begin(), x.end());
  std::vector<double> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = std::exp(x[size_t(i)] - shift);
  normalize(p);
  if (s.top_p < 1.0) {  // the smallest prefix, by descending probability, that reaches top_p
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    std::vector<bool> keep(static_cast<size_t>(n), false);
    double mass = 0.0;
    for (size_t r = 0; r < order.size(); ++r) {
      const double q = p[size_t(order[r])];
      const double before = (mass + q) - q;  // numpy's cumsum(sorted) - sorted, term for term
      keep[size_t(order[r])] = r == 0 || before < s.top_p;
      mass += q;
    }
    for (int64_t i = 0; i < n; ++i)
      if (!keep[size_t(i)]) p[size_t(i)] = 0.0;
    normalize(p);
  }
  if (s.min_p > 0.0) {
    const double threshold = s.min_p * *std::max_element(p.begin(), p.end());
    for (double& q : p)
      if (!(q >= threshold)) q = 0.0;
    normalize(p);
  }
  return p;
}

int64_t race(const double* p, const double* e, int64_t n) {
  int64_t best = 0;
  double best_score = p[0] / e[0];
  if (std::isnan(best_score)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    const double score = p[i] / e[i];
    if (std::isnan(score)) return i;
    if (score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

int64_t sample(const double* p, int64_t n, double u) {
  std::vector<double> cdf(static_cast<size_t>(n));
  double run = 0.0;
  for (int64_t i = 0; i < n; ++i) cdf[size_t(i)] = run += p[i];
  const double total = cdf.back();
  if (!(total > 0.0)) throw std::invalid_argument("cannot sample from a distribution with no mass");
  // numpy's searchsorted(cdf, u * total, side="right"): the first index whose cdf exceeds it
  int64_t index = int64_t(std::upper_bound(cdf.begin(), cdf.end(), u * total) - cdf.begin());
  index = std::min(index, n - 1);
  while (p[index] <= 0.0) --index;  // past trailing zero-probability entries
  return index;
}

std::pair<int, int64_t> verify_invariant(const std::vector<int64_t>& draft, const float* logits,
                                         int64_t vocab, const Sampling& s, Noise& noise,
                                         int64_t position) {
  const int k = int(draft.size());
  for (int i = 0; i <= k; ++i) {
    std::vector<double> p = warp(logits + size_t(i) * size_t(vocab), vocab, s);
    const int64_t winner = race(p.data(), noise.exponentials(position + i).data(), vocab);
    if (i == k || winner != draft[size_t(i)]) return {i, winner};
  }
  return {k, -1};  // not reached
}

std::pair<int, int64_t> verify_rejection(const std::vector<int64_t>& draft,
                                         const std::vector<std::vector<double>>& p_draft,
                                         const float* logits, int64_t vocab, const Sampling& s,
                                         const Noise& noise, int64_t position) {
  const int k = int(draft.size());
  for (int i = 0; i < k; ++i) {
    std::vector<double> target = warp(logits + size_t(i) * size_t(vocab), vocab, s);
    const int64_t x = draft[size_t(i)];
    std::vector<double> point;
    const std::vector<double>* q = nullptr;
    if (p_draft.empty()) {
      point.assign(size_t(vocab), 0.0);
      point[size_t(x)] = 1.0;  // a deterministic drafter: a point mass on its token
      q = &point;
    } else {
      q = &p_draft[size_t(i)];
    }
    const double u_sample = noise.uniform(kResample, position + i);
    if ((*q)[size_t(x)] <= 0.0) return {i, sample(target.data(), vocab, u_sample)};
    if (noise.uniform(kAccept, position + i) * (*q)[size_t(x)] < target[size_t(x)]) continue;
    std::vector<double> residual(static_cast<size_t>(vocab));
    for (int64_t j = 0; j < vocab; ++j) residual[size_t(j)] = std::max(target[size_t(j)] - (*q)[size_t(j)], 0.0);
    const double mass = sum(residual);
    if (mass <= kZeroResidual) return {i, sample(target.data(), vocab, u_sample)};
    for (double& r : residual) r /= mass;
    return {i, sample(residual.data(), vocab, u_sample)};
  }
  std::vector<double> last = warp(logits + size_t(k) * size_t(vocab), vocab, s);
  return {k, sample(last.data(), vocab, noise.uniform(kResample, position + k))};
}

}  // namespace specx
