// Suffix drafting over the context and earlier generations of the same scope
// (runtime/drafters/suffix.py, rule for rule, so that both runtimes propose the same tokens):
// the longest suffix of the context (up to 64 tokens) found in the context and in the scope's
// history of earlier outputs, and the continuation seen most often after it, while its
// estimated probability stays at or above 0.1, for at most as many tokens as matched.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "drafters.h"

namespace specx {

constexpr int kSuffixDepth = 64;         // the longest suffix matched
constexpr int kSuffixOccurrences = 256;  // the most recent occurrences read
constexpr double kSuffixMinProbability = 0.1;
constexpr int64_t kSuffixPromptTail = 32;  // prompt tokens kept before each output in history
constexpr int64_t kSeparator = -1;         // between the history's documents

// A corpus of token ids and the hashes of its 4-, 2- and 1-grams, growing at the end.
class TokenIndex {
 public:
  void extend(const int64_t* tokens, int64_t n);
  void truncate(int64_t size) { size_ = std::min(size_, size); }
  int64_t size() const { return size_; }
  const int64_t* tokens() const { return tokens_.data(); }
  // The most recent occurrences (oldest first) of the longest suffix of context[0, n) ending
  // before position `end`, and its length (empty, 0: none).
  std::pair<std::vector<int64_t>, int> longest_match(const int64_t* context, int64_t n,
                                                     int64_t end) const;
  // The continuation most often seen after those occurrences: tokens and their probabilities.
  void follow(const std::vector<int64_t>& ends, int matched, const std::vector<int64_t>& eos,
              std::vector<int64_t>& tokens, std::vector<double>& probs) const;

 private:
  std::vector<int64_t> tokens_;
  std::vector<uint64_t> hashes_[3];  // n = 4, 2, 1
  int64_t size_ = 0;
};

// Earlier generations' outputs per scope (bounded), shared by a model's suffix drafters.
class SuffixHistory {
 public:
  void add(const std::string& scope, std::vector<int64_t> document);
  std::shared_ptr<const TokenIndex> index(const std::string& scope) const;

 private:
  static constexpr int64_t kPerScope = int64_t(1) << 18, kTotal = int64_t(1) << 21;
  mutable std::mutex lock_;
  std::list<std::string> order_;  // least recently added scope first
  std::map<std::string, std::list<std::vector<int64_t>>> docs_;
  std::map<std::string, std::shared_ptr<const TokenIndex>> indexes_;
};

class SuffixDrafter : public LookupDrafter {
 public:
  SuffixDrafter(SuffixHistory* history, std::vector<int64_t> eos)
      : history_(history), eos_(std::move(eos)) {}
  void start(const int64_t* prompt, int64_t n, const DraftRequest& request) override;
  std::string source(const int64_t* context, int64_t n) override;
  Proposal propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) override;
  void commit(int) override {}
  void finish(const int64_t* output, int64_t n) override;
  const std::vector<int64_t>& continuation(const int64_t* context, int64_t n) override;
  void forget() override { found_len_ = -1; }

 private:
  SuffixHistory* history_;
  std::vector<int64_t> eos_;
  std::optional<std::string> scope_;
  std::vector<int64_t> prompt_tail_;
  TokenIndex context_;
  int64_t found_len_ = -1;
  std::vector<int64_t> found_;
  std::vector<double> probs_;
  int matched_ = 0;
};

}  // namespace specx
