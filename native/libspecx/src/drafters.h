// The drafter seam, as runtime/drafters/base.py: start, source, propose, commit.
//
//   model    a draft graph with its own preallocated cache (drafters/model.py): catch up on the
//            committed tokens it lacks, then draft token by token (greedy: the argmax over the
//            ids both models share); commit truncates its cache to what the target kept
//   ngram    prompt lookup (drafters/ngram.py): what followed the latest earlier occurrence of
//            the context's last n tokens, n from 3 down to 1, from an index kept up to date
//   suffix   suffix drafting over the context and earlier generations (suffix.h)
//   hybrid   ngram+X or suffix+X (drafters/hybrid.py): a lookup where it has >= 2 tokens to
//            offer, the model X otherwise
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "adaptive.h"
#include "graph.h"
#include "sampling.h"

namespace specx {

struct Proposal {
  std::vector<int64_t> tokens;
  int64_t catchup = 0;       // committed tokens the drafter fed before drafting
  int64_t model_passes = 0;  // draft-model passes it cost
  std::vector<double> confidence;  // [n] the draft's top probability per token, where asked
  std::vector<std::vector<double>> p_draft;  // [n][target vocab]: rejection sampling only
};

// What a generation tells its drafter when it starts (drafters/base.py's DraftRequest).
struct DraftRequest {
  const Sampling* sampling = nullptr;  // nullptr: greedy
  Noise* noise = nullptr;              // the generation's random numbers, shared with verify
  bool prefill = true;  // a draft model reads the prompt at start (else when first asked)
  // whose prompts a draft cache may keep (nullopt: none), and whose history suffix drafting
  // reads and feeds
  std::optional<std::string> scope = std::string();
};

// The first index of the largest value (numpy's argmax: the first NaN wins where there is one).
int64_t argmax(const float* row, int64_t n);
// The softmax of a logits row at `token` (a draft's confidence in its argmax).
double top_probability(const float* row, int64_t n, int64_t token);

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual void start(const int64_t* prompt, int64_t n, const DraftRequest& request) = 0;
  // where the next proposal comes from: "model", "lookupN" (after an N-token match) or "none"
  virtual std::string source(const int64_t* context, int64_t n) = 0;
  // up to k tokens; a drafter that knows its confidence asks `plan` (may be empty) after each
  virtual Proposal propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) = 0;
  virtual void commit(int accepted) = 0;
  // the generation ended with these new tokens (suffix drafting keeps them; base.py's
  // HistoryKeeper)
  virtual void finish(const int64_t*, int64_t) {}
  // committed tokens its model has not read (it reads them before proposing; base.py's
  // CatchesUp): 0 without a model
  virtual int64_t behind(const int64_t*, int64_t) const { return 0; }
};

// A drafter that looks its proposal up in text (ngram, suffix): free, and a hybrid's first try.
class LookupDrafter : public Drafter {
 public:
  // the proposal for this context (searched once per context length)
  virtual const std::vector<int64_t>& continuation(const int64_t* context, int64_t n) = 0;
  virtual void forget() = 0;  // the step is over
};

bool is_lookup(const std::string& source);

class ModelDrafter : public Drafter {
 public:
  ModelDrafter(Graph& graph, int64_t capacity, int64_t target_vocab, std::vector<int64_t> eos);
  void start(const int64_t* prompt, int64_t n, const DraftRequest& request) override;
  std::string source(const int64_t*, int64_t) override { return "model"; }
  Proposal propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) override;
  void commit(int accepted) override;
  int64_t behind(const int64_t*, int64_t n) const override { return n - runner_.length(); }

 private:
  const float* feed(const int64_t* tokens, int64_t n);  // the last row's logits
  // the token for `position` from a logits row over the shared ids (pick_token of model.py)
  int64_t pick(const float* row, int64_t position, bool want_top, double& top,
               std::vector<double>* p_draft);
  Runner runner_;
  int64_t target_vocab_;
  DraftRequest request_;
  int64_t shared_vocab_;
  std::vector<int64_t> eos_, input_;
  int64_t context_len_ = 0;
  int64_t fed_from_proposal_ = 0;
};

class NgramDrafter : public LookupDrafter {
 public:
  explicit NgramDrafter(std::vector<int64_t> eos, int max_ngram = 3, int min_ngram = 1);
  void start(const int64_t* prompt, int64_t n, const DraftRequest& request) override;
  std::string source(const int64_t* context, int64_t n) override;
  Proposal propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) override;
  void commit(int) override {}
  const std::vector<int64_t>& continuation(const int64_t* context, int64_t n) override;
  void forget() override { found_len_ = -1; }

 private:
  struct Key {
    int64_t t[3];
    int n;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  void index_to(const int64_t* context, int64_t end);
  int max_ngram_, min_ngram_;
  std::vector<int64_t> eos_;
  std::unordered_map<Key, int64_t, KeyHash> latest_;  // n-gram -> the position it last ended at
  int64_t indexed_ = 0;
  int64_t found_len_ = -1;
  std::vector<int64_t> found_;
  int matched_ = 0;
};

class HybridDrafter : public Drafter {
 public:
  HybridDrafter(std::unique_ptr<LookupDrafter> lookup, std::unique_ptr<Drafter> model)
      : lookup_(std::move(lookup)), model_(std::move(model)) {}
  void start(const int64_t* prompt, int64_t n, const DraftRequest& request) override;
  std::string source(const int64_t* context, int64_t n) override;
  Proposal propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) override;
  void commit(int accepted) override;
  void finish(const int64_t* output, int64_t n) override { lookup_->finish(output, n); }
  int64_t behind(const int64_t* context, int64_t n) const override { return model_->behind(context, n); }

 private:
  static constexpr size_t kMinMatchTokens = 2;
  std::unique_ptr<LookupDrafter> lookup_;
  std::unique_ptr<Drafter> model_;
  bool used_model_ = false;
};

}  // namespace specx
