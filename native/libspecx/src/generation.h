// One generation: prefill, then speculative steps until it stops (runtime/decode/loop.py and
// sequence.py). A step is propose, verify, accept, commit: the drafter proposes up to K tokens,
// the target verifies [last committed, d_1 .. d_k] in one pass that also extends its cache, the
// greedy verification accepts the longest prefix equal to the target's argmax plus the
// target's own token, and the cache is rolled back by setting its length. A generation runs in
// a context (context.h), whose caches keep the prefix of its prompt they hold.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "context.h"
#include "drafters.h"
#include "model.h"
#include "sampling.h"
#include "specx.h"

namespace specx {

struct Settings {
  int64_t max_new_tokens = 128;
  int k = SPECX_K_DEFAULT;
  int max_k = 8;  // the most K auto may choose
  std::string drafter;  // "": the artifact's default
  std::vector<int64_t> stop_ids;
  Sampling sampling;
  uint64_t seed = 0;
  bool has_seed = false;  // false: a fresh seed per generation
  // whose earlier prompts it may reuse, and whose later ones may reuse it (nullopt: neither)
  std::optional<std::string> scope = std::string();
};

// Greedy verification (verify.py's verify_greedy): (draft tokens accepted, the target's token).
// logits: [k + 1, vocab].
std::pair<int, int64_t> verify_greedy(const std::vector<int64_t>& draft, const float* logits,
                                      int64_t vocab);

class Generation {
 public:
  // In `context` (held until the generation is destroyed; nullptr: a context of its own).
  Generation(const Model& model, Context* context, const int64_t* prompt, size_t n,
             const Settings& settings);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;
  // One step (the first also runs the prompt): the tokens it commits; empty once done.
  std::vector<int64_t> next();
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool done() const { return done_; }
  specx_stats stats() const;

 private:
  void resolve(const Settings& settings);
  void prefill();
  std::vector<int64_t> step();
  std::pair<int, int64_t> verify(const Proposal& proposal, const float* logits);
  std::vector<int64_t> append(const std::vector<int64_t>& tokens);
  void finish(const char* reason);

  const Model& model_;
  std::unique_ptr<Context> own_;  // where no context was given
  Context* context_;
  bool holds_context_ = false;
  Settings settings_;
  int k_ = 0;  // a fixed K, or K auto's most
  std::unique_ptr<AdaptiveK> policy_;  // K auto (nullptr: a fixed K)
  std::string drafter_name_;
  Drafter* drafter_ = nullptr;  // the context's
  std::unique_ptr<Noise> noise_;
  Runner& target_;
  std::vector<int64_t> committed_;  // [capacity + 1] every committed token
  int64_t n_context_ = 0;
  int64_t prompt_len_ = 0;
  bool started_ = false, done_ = false;
  std::atomic<bool> cancelled_{false};
  specx_stats stats_{};
  std::string stop_reason_;
};

}  // namespace specx
