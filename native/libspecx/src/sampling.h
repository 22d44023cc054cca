// Sampling as runtime/verification/sampling.py and verify.py define it (docs/artifact-format.md,
// "Sampling"): the warp of a logits row, the counter-based random numbers keyed by (seed, stream,
// position), the exponential race, inverse-CDF sampling, and the two verifications of sampled
// drafts: drafter-invariant (Daliri, Musco, Suresh 2024) and rejection (Leviathan et al. 2023).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace specx {

// Random streams: independent draws for the same position.
constexpr uint64_t kRace = 0, kDraft = 1, kAccept = 2, kResample = 3;

struct Sampling {
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;
  double top_p = 1.0, min_p = 0.0;
  bool invariant = true;  // false: rejection sampling
  bool greedy() const { return temperature == 0.0; }
};

// The counter-based generator: key(seed, stream, position), then word i of the key.
uint64_t counter_key(uint64_t seed, uint64_t stream, uint64_t position);
double counter_uniform(uint64_t key, uint64_t index);

// One generation's random numbers; a position's exponentials are kept while the loop is near it.
class Noise {
 public:
  Noise(uint64_t seed, int64_t vocab) : seed_(seed), vocab_(vocab) {}
  const std::vector<double>& exponentials(int64_t position);  // [vocab] Exp(1)
  double uniform(uint64_t stream, int64_t position) const;

 private:
  uint64_t seed_;
  int64_t vocab_;
  std::map<int64_t, std::vector<double>> kept_;
};

// logits [n] -> probabilities [n] after temperature, top-k, softmax, top-p, min-p (in float64).
std::vector<double> warp(const float* logits, int64_t n, const Sampling& s);
// argmax p[x] / e[x] over x < n (numpy's argmax: the first NaN wins where there is one).
int64_t race(const double* p, const double* e, int64_t n);
// The index a uniform u picks by inverse CDF (p need not be normalized; it must have mass).
int64_t sample(const double* p, int64_t n, double u);

// Verifications: (draft tokens accepted, the target's token). logits [k + 1, vocab];
// position: the absolute position row 0 decides.
std::pair<int, int64_t> verify_invariant(const std::vector<int64_t>& draft, const float* logits,
                                         int64_t vocab, const Sampling& s, Noise& noise,
                                         int64_t position);
// p_draft: [k][vocab] the draft's warped rows, or empty for a deterministic drafter (point masses)
std::pair<int, int64_t> verify_rejection(const std::vector<int64_t>& draft,
                                         const std::vector<std::vector<double>>& p_draft,
                                         const float* logits, int64_t vocab, const Sampling& s,
                                         const Noise& noise, int64_t position);

}  // namespace specx
