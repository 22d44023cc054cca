#include "suffix.h"

#include <algorithm>
#include <cmath>

namespace specx {
namespace {

constexpr int kAnchors[3] = {4, 2, 1};  // n-gram lengths looked up, longest first
constexpr uint64_t kPrime = 0x100000001B3ull;  // a gram's hash: sum (token + 1) * kPrime^j
constexpr int64_t kLookahead = 64;
const int kBuckets[6] = {1, 2, 3, 4, 8, 16};  // match lengths -k auto keeps apart

// The hash of the n-gram of tokens[0, size) ending at `end` (tokens before 0 count as the
// separator, whose term is 0).
uint64_t gram_hash(const int64_t* tokens, int64_t end, int n) {
  uint64_t hash = 0, factor = 1;
  for (int j = 0; j < n; ++j) {
    const int64_t at = end - j;
    const int64_t token = at >= 0 ? tokens[at] : kSeparator;
    hash += uint64_t(token + 1) * factor;
    factor *= kPrime;
  }
  return hash;
}

std::string match_source(int length) {
  int bucket = 1;
  for (int b : kBuckets)
    if (b <= length) bucket = b;
  return "lookup" + std::to_string(bucket);
}

bool contains(const std::vector<int64_t>& ids, int64_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

}  // namespace

void TokenIndex::extend(const int64_t* tokens, int64_t n) {
  tokens_.resize(size_t(size_ + n));
  std::copy(tokens, tokens + n, tokens_.begin() + size_);
  for (int a = 0; a < 3; ++a) {
    hashes_[a].resize(size_t(size_ + n));
    for (int64_t p = size_; p < size_ + n; ++p) hashes_[a][size_t(p)] = gram_hash(tokens_.data(), p, kAnchors[a]);
  }
  size_ += n;
}

std::pair<std::vector<int64_t>, int> TokenIndex::longest_match(const int64_t* context, int64_t n,
                                                               int64_t end) const {
  end = std::min(end, size_);
  for (int a = 0; a < 3; ++a) {
    const int gram = kAnchors[a];
    if (n < gram || end <= 0) continue;
    const uint64_t wanted = gram_hash(context, n - 1, gram);
    std::vector<int64_t> ends;
    for (int64_t p = 0; p < end; ++p)
      if (hashes_[a][size_t(p)] == wanted) ends.push_back(p);
    if (ends.empty()) continue;
    if (ends.size() > size_t(kSuffixOccurrences)) ends.erase(ends.begin(), ends.end() - kSuffixOccurrences);
    const int64_t depth = std::min<int64_t>(kSuffixDepth, n);
    std::vector<int> lengths(ends.size());
    int best = 0;
    for (size_t i = 0; i < ends.size(); ++i) {
      int length = 0;
      while (length < depth && ends[i] - length >= 0 && tokens_[size_t(ends[i] - length)] == context[n - 1 - length])
        ++length;
      lengths[i] = length;
      best = std::max(best, length);
    }
    if (best < gram) continue;  // hash collisions only
    std::vector<int64_t> out;
    for (size_t i = 0; i < ends.size(); ++i)
      if (lengths[i] == best) out.push_back(ends[i]);
    return {out, best};
  }
  return {{}, 0};
}

void TokenIndex::follow(const std::vector<int64_t>& ends, int matched, const std::vector<int64_t>& eos,
                        std::vector<int64_t>& tokens, std::vector<double>& probs) const {
  std::vector<int64_t> rows(ends.rbegin(), ends.rend());  // most recent first: ties go to it
  const int64_t most = std::min<int64_t>(kLookahead, int64_t(std::ceil(1.0 * matched)));
  double p = 1.0;
  std::vector<int64_t> next_rows, following, values, counts, firsts;
  for (int64_t depth = 0; depth < most; ++depth) {
    const size_t reached = rows.size();  // occurrences that got this far (some end here)
    next_rows.clear();
    following.clear();
    for (int64_t row : rows) {
      const int64_t at = row + 1 + depth;
      if (at >= size_ || tokens_[size_t(at)] == kSeparator) continue;
      next_rows.push_back(row);
      following.push_back(tokens_[size_t(at)]);
    }
    if (next_rows.empty()) break;
    values.clear();
    counts.clear();
    firsts.clear();
    for (size_t i = 0; i < following.size(); ++i) {
      auto it = std::find(values.begin(), values.end(), following[i]);
      if (it == values.end()) {
        values.push_back(following[i]);
        counts.push_back(1);
        firsts.push_back(int64_t(i));
      } else {
        ++counts[size_t(it - values.begin())];
      }
    }
    size_t pick = 0;  // the most seen; among equals, the first seen (the most recent)
    for (size_t i = 1; i < values.size(); ++i)
      if (counts[i] > counts[pick] || (counts[i] == counts[pick] && firsts[i] < firsts[pick])) pick = i;
    p *= double(counts[pick]) / double(reached);
    if (p < kSuffixMinProbability) break;
    const int64_t token = values[pick];
    tokens.push_back(token);
    probs.push_back(p);
    rows.clear();
    for (size_t i = 0; i < next_rows.size(); ++i)
      if (following[i] == token) rows.push_back(next_rows[i]);
    if (contains(eos, token)) break;
  }
}

void SuffixHistory::add(const std::string& scope, std::vector<int64_t> document) {
  if (document.empty()) return;
  std::lock_guard<std::mutex> hold(lock_);
  std::list<std::vector<int64_t>>& docs = docs_[scope];
  docs.push_back(std::move(document));
  order_.remove(scope);
  order_.push_back(scope);
  auto tokens = [](const std::list<std::vector<int64_t>>& ds) {
    int64_t n = 0;
    for (const auto& d : ds) n += int64_t(d.size());
    return n;
  };
  while (tokens(docs) > kPerScope) docs.pop_front();
  int64_t total = 0;
  for (const auto& [name, ds] : docs_) total += tokens(ds);
  while (total > kTotal && order_.size() > 1) {
    const std::string gone = order_.front();
    order_.pop_front();
    total -= tokens(docs_[gone]);
    docs_.erase(gone);
    indexes_.erase(gone);
  }
  auto index = std::make_shared<TokenIndex>();
  for (const auto& doc : docs) {
    index->extend(doc.data(), int64_t(doc.size()));
    index->extend(&kSeparator, 1);
  }
  indexes_[scope] = std::move(index);  // drafters reading the old one keep it
}

std::shared_ptr<const TokenIndex> SuffixHistory::index(const std::string& scope) const {
  std::lock_guard<std::mutex> hold(lock_);
  auto it = indexes_.find(scope);
  return it == indexes_.end() ? nullptr : it->second;
}

void SuffixDrafter::start(const int64_t* prompt, int64_t n, const DraftRequest& request) {
  scope_ = request.scope;
  prompt_tail_.assign(prompt + std::max<int64_t>(0, n - kSuffixPromptTail), prompt + n);
  context_ = TokenIndex();
  forget();
}

const std::vector<int64_t>& SuffixDrafter::continuation(const int64_t* context, int64_t n) {
  if (found_len_ == n) return found_;
  found_len_ = n;
  found_.clear();
  probs_.clear();
  matched_ = 0;
  // the context's new tokens; a context that does not extend the one indexed: anew
  const int64_t done = context_.size();
  if (done > n || !std::equal(context_.tokens(), context_.tokens() + done, context)) context_.truncate(0);
  context_.extend(context + context_.size(), n - context_.size());
  std::shared_ptr<const TokenIndex> history;
  if (history_ != nullptr && scope_) history = history_->index(*scope_);
  double best_score = 0.0;
  std::vector<int64_t> tokens;
  std::vector<double> probs;
  for (int corpus = 0; corpus < 2; ++corpus) {
    const TokenIndex* index = corpus == 0 ? &context_ : history.get();
    if (index == nullptr) continue;
    const int64_t end = corpus == 0 ? n - 1 : index->size();  // a match must be followed
    auto [ends, matched] = index->longest_match(context, n, end);
    if (matched == 0) continue;
    tokens.clear();
    probs.clear();
    index->follow(ends, matched, eos_, tokens, probs);
    double score = 0.0;
    for (double q : probs) score += q;
    if (score > best_score) {
      best_score = score;
      found_ = tokens;
      probs_ = probs;
      matched_ = matched;
    }
  }
  return found_;
}

std::string SuffixDrafter::source(const int64_t* context, int64_t n) {
  return continuation(context, n).empty() ? "none" : match_source(matched_);
}

Proposal SuffixDrafter::propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) {
  continuation(context, n);
  Proposal p;
  const int most = std::min<int>(k, int(found_.size()));
  for (int i = 0; i < most; ++i) {
    const auto [take, more] = plan ? plan(i, probs_[size_t(i)]) : std::make_pair(true, true);
    if (take) {
      p.tokens.push_back(found_[size_t(i)]);
      p.confidence.push_back(probs_[size_t(i)]);
    }
    if (!take || !more) break;
  }
  forget();
  return p;
}

void SuffixDrafter::finish(const int64_t* output, int64_t n) {
  if (history_ == nullptr || !scope_ || n == 0) return;
  std::vector<int64_t> document = prompt_tail_;
  document.insert(document.end(), output, output + n);
  history_->add(*scope_, std::move(document));
}

}  // namespace specx
