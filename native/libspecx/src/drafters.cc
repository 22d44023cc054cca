#include "drafters.h"

#include <algorithm>
#include <cmath>

namespace specx {

constexpr int64_t kLookahead = 64;  // the most tokens a continuation is read ahead (ngram.py)

int64_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) return i;
    if (row[i] > row[best]) best = i;
  }
  return best;
}

double top_probability(const float* row, int64_t n, int64_t token) {
  double sum = 0.0;
  const double top = row[token];
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - top);
  return 1.0 / sum;
}

bool is_lookup(const std::string& source) { return source.rfind("lookup", 0) == 0; }

static bool contains(const std::vector<int64_t>& ids, int64_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

// -- model --------------------------------------------------------------------------------------
ModelDrafter::ModelDrafter(Graph& graph, int64_t capacity, int64_t target_vocab,
                           std::vector<int64_t> eos)
    : runner_(graph, capacity),
      target_vocab_(target_vocab),
      shared_vocab_(std::min(graph.spec().vocab_size, target_vocab)),
      eos_(std::move(eos)) {}

const float* ModelDrafter::feed(const int64_t* tokens, int64_t n) {
  // A target padding-row id (only untrained targets emit one) is no valid draft input: token 0
  // instead. The draft then guesses worse; the output stays exact.
  input_.assign(tokens, tokens + n);
  for (int64_t& t : input_)
    if (t >= runner_.vocab_size()) t = 0;
  return runner_.prefill(input_.data(), n);
}

int64_t ModelDrafter::pick(const float* row, int64_t position, bool want_top, double& top,
                           std::vector<double>* p_draft) {
  const Sampling* s = request_.sampling;
  if (s == nullptr || s->greedy()) {
    const int64_t token = argmax(row, shared_vocab_);
    top = want_top ? top_probability(row, shared_vocab_, token) : 1.0;
    return token;
  }
  std::vector<double> probs = warp(row, shared_vocab_, *s);  // [shared vocab]
  top = *std::max_element(probs.begin(), probs.end());
  if (s->invariant)  // the race under the position's draws: the target's own coupling
    return race(probs.data(), request_.noise->exponentials(position).data(), shared_vocab_);
  const int64_t token = sample(probs.data(), shared_vocab_, request_.noise->uniform(kDraft, position));
  p_draft->assign(size_t(target_vocab_), 0.0);
  std::copy(probs.begin(), probs.end(), p_draft->begin());
  return token;
}

void ModelDrafter::start(const int64_t* prompt, int64_t n, const DraftRequest& request) {
  // keep the prefix of the prompt the draft cache holds for this scope (model.py's start),
  // then read the rest now or at the first proposal
  request_ = request;
  input_.assign(prompt, prompt + std::max<int64_t>(0, n - 1));
  for (int64_t& t : input_)
    if (t >= runner_.vocab_size()) t = 0;
  const int64_t reading = int64_t(input_.size());
  runner_.claim(request.scope, runner_.shared_prefix(input_.data(), reading, request.scope));
  const int64_t kept = runner_.length();
  if (request.prefill && reading > kept) runner_.prefill(input_.data() + kept, reading - kept);
}

Proposal ModelDrafter::propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) {
  context_len_ = n;
  fed_from_proposal_ = 0;
  Proposal p;
  if (k <= 0) return p;
  const int64_t pending = n - runner_.length();  // committed tokens it has not seen (>= 1)
  const float* logits = feed(context + runner_.length(), pending);
  p.catchup = pending;
  p.model_passes = 1;
  const bool want_top = bool(plan);  // confidences for the plan and -k auto's estimates
  const bool rejection = request_.sampling != nullptr && !request_.sampling->greedy() &&
                         !request_.sampling->invariant;
  for (int i = 0; i < k; ++i) {
    double top = 1.0;
    std::vector<double> row;
    const int64_t token = pick(logits, n + i, want_top, top, &row);
    const auto [take, more] = plan ? plan(i, top) : std::make_pair(true, true);
    if (!take) break;
    p.tokens.push_back(token);
    if (want_top) p.confidence.push_back(top);
    if (rejection) p.p_draft.push_back(std::move(row));
    if (!more || i >= k - 1 || contains(eos_, token)) break;
    logits = feed(&token, 1);
    ++p.model_passes;
    ++fed_from_proposal_;
  }
  return p;
}

void ModelDrafter::commit(int accepted) {
  int64_t kept = context_len_ + std::min<int64_t>(accepted, fed_from_proposal_);
  runner_.truncate(std::min(kept, runner_.length()));
}

// -- ngram --------------------------------------------------------------------------------------
bool NgramDrafter::Key::operator==(const Key& o) const {
  if (n != o.n) return false;
  for (int i = 0; i < n; ++i)
    if (t[i] != o.t[i]) return false;
  return true;
}

size_t NgramDrafter::KeyHash::operator()(const Key& k) const {
  uint64_t h = 1469598103934665603ull ^ uint64_t(k.n);
  for (int i = 0; i < k.n; ++i) h = (h ^ uint64_t(k.t[i])) * 1099511628211ull;
  return size_t(h);
}

NgramDrafter::NgramDrafter(std::vector<int64_t> eos, int max_ngram, int min_ngram)
    : max_ngram_(max_ngram), min_ngram_(min_ngram), eos_(std::move(eos)) {}

void NgramDrafter::start(const int64_t*, int64_t, const DraftRequest&) {
  found_len_ = -1;
  latest_.clear();
  indexed_ = 0;
}

void NgramDrafter::index_to(const int64_t* context, int64_t end) {
  // every n-gram (n <= max_ngram) ending at a position before `end`, under its latest end; the
  // context only grows within a generation, so only the new positions are added
  for (int64_t position = indexed_; position < end; ++position) {
    for (int n = 1; n <= std::min<int64_t>(max_ngram_, position + 1); ++n) {
      Key key{{0, 0, 0}, n};
      for (int j = 0; j < n; ++j) key.t[j] = context[position - n + 1 + j];
      latest_[key] = position;
    }
  }
  indexed_ = std::max(indexed_, end);
}

const std::vector<int64_t>& NgramDrafter::continuation(const int64_t* context, int64_t length) {
  if (found_len_ == length) return found_;
  found_len_ = length;
  found_.clear();
  matched_ = 0;
  const int64_t longest = std::min<int64_t>(max_ngram_, length - 1);
  if (longest < min_ngram_) return found_;
  index_to(context, length - 1);  // a match must be followed by a token
  for (int64_t n = longest; n >= min_ngram_; --n) {
    Key key{{0, 0, 0}, int(n)};
    for (int64_t j = 0; j < n; ++j) key.t[j] = context[length - n + j];
    auto it = latest_.find(key);
    if (it == latest_.end()) continue;
    const int64_t from = it->second + 1;
    const int64_t to = std::min(length, from + kLookahead);
    for (int64_t i = from; i < to; ++i) {
      found_.push_back(context[i]);
      if (contains(eos_, context[i])) break;  // a proposal stops after an end token
    }
    matched_ = int(n);
    return found_;
  }
  return found_;
}

std::string NgramDrafter::source(const int64_t* context, int64_t n) {
  return continuation(context, n).empty() ? "none" : "lookup" + std::to_string(matched_);
}

Proposal NgramDrafter::propose(const int64_t* context, int64_t n, int k, const DraftPlan&) {
  Proposal p;
  const std::vector<int64_t>& found = continuation(context, n);
  if (k > 0) p.tokens.assign(found.begin(), found.begin() + std::min<int64_t>(k, int64_t(found.size())));
  forget();
  return p;
}

// -- hybrid -------------------------------------------------------------------------------------
void HybridDrafter::start(const int64_t* prompt, int64_t n, const DraftRequest& request) {
  lookup_->start(prompt, n, request);
  model_->start(prompt, n, request);
}

std::string HybridDrafter::source(const int64_t* context, int64_t n) {
  bool matched = lookup_->continuation(context, n).size() >= kMinMatchTokens;
  return matched ? lookup_->source(context, n) : "model";
}

Proposal HybridDrafter::propose(const int64_t* context, int64_t n, int k, const DraftPlan& plan) {
  used_model_ = source(context, n) == "model";
  if (used_model_) {
    lookup_->forget();
    return model_->propose(context, n, k, plan);
  }
  return lookup_->propose(context, n, k, plan);
}

void HybridDrafter::commit(int accepted) {
  if (used_model_) model_->commit(accepted);
}

}  // namespace specx
