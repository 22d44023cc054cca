#include "generation.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "failure.h"

namespace specx {
namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool contains(const std::vector<int64_t>& ids, int64_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

}  // namespace

std::pair<int, int64_t> verify_greedy(const std::vector<int64_t>& draft, const float* logits,
                                      int64_t vocab) {
  const int k = int(draft.size());
  for (int i = 0; i < k; ++i) {
    int64_t choice = argmax(logits + size_t(i) * size_t(vocab), vocab);
    if (choice != draft[size_t(i)]) return {i, choice};
  }
  return {k, argmax(logits + size_t(k) * size_t(vocab), vocab)};
}

Generation::Generation(const Model& model, Context* context, const int64_t* prompt, size_t n,
                       const Settings& settings)
    : model_(model),
      own_(context == nullptr ? std::make_unique<Context>(model) : nullptr),
      context_(context != nullptr ? context : own_.get()),
      settings_(settings),
      target_(context_->target()) {
  const Manifest& m = model.manifest();
  if (&context_->model() != &model)
    throw invalid("the context belongs to another model", "create a context of this model");
  if (prompt == nullptr || n == 0)
    throw invalid("the prompt has no tokens", "pass at least one token id");
  if (int64_t(n) > m.max_length)
    throw invalid("the prompt has " + std::to_string(n) + " tokens; this artifact's maximum "
                  "context is " + std::to_string(m.max_length),
                  "shorten the prompt, or re-export with a larger --max-length");
  const int64_t vocab = m.target.vocab_size;
  for (size_t i = 0; i < n; ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw invalid("prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                    "; token ids must lie in [0, " + std::to_string(vocab) + ")");
  if (!context_->acquire())
    throw invalid("another generation is running in this context",
                  "destroy it first, or create another context");
  holds_context_ = true;
  try {
    resolve(settings);
  } catch (...) {
    context_->release();  // no destructor runs for a constructor that throws
    throw;
  }
  uint64_t seed = settings.seed;
  if (!settings.has_seed) {
    std::random_device entropy;
    seed = (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
  }
  noise_ = std::make_unique<Noise>(seed, vocab);
  committed_.assign(size_t(m.max_length) + 1, 0);
  std::copy(prompt, prompt + n, committed_.begin());
  n_context_ = prompt_len_ = int64_t(n);
  stats_.prompt_tokens = prompt_len_;
  stats_.k = k_;
}

// The K and drafter these settings ask for on this artifact (pipeline.py's resolve_policy).
void Generation::resolve(const Settings& s) {
  const Manifest& m = model_.manifest();
  std::string name = s.drafter.empty() ? model_.default_drafter() : s.drafter;
  const auto& names = model_.drafter_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
    throw invalid("unknown drafter '" + name + "'", "choose one of: " + all);
  }
  int k = s.k;
  if (k == SPECX_K_AUTO) {
    if (name == "none") throw invalid("K auto needs a drafter", "name one, e.g. ngram");
    k_ = std::min(s.max_k, m.k_max);
    policy_ = std::make_unique<AdaptiveK>(k_);
    if (std::optional<double> ratio = model_.draft_ratio(name)) policy_->set_draft_ratio(*ratio);
    policy_->set_lazy_draft(true);  // the draft reads the prompt when first asked
    if (std::unique_ptr<AdaptiveK> previous = model_.learned_policy(name)) policy_->inherit(*previous);
    drafter_name_ = name;
    drafter_ = context_->drafter(name);
    return;
  }
  if (k == SPECX_K_DEFAULT) k = name == "none" ? 0 : m.k_default;
  if (k < 0 || k > SPECX_MAX_K)
    throw invalid("K must be in 0.." + std::to_string(SPECX_MAX_K) + ", got " + std::to_string(k),
                  "SPECX_K_DEFAULT, or 0 for the target alone");
  if (k > m.k_max)
    throw invalid("K=" + std::to_string(k) + " exceeds the profile's k_max " +
                  std::to_string(m.k_max), "use a smaller K");
  if (k == 0) {
    name = "none";
  } else if (name == "none") {
    throw invalid("K=" + std::to_string(k) + " needs a drafter, and \"none\" asks for the target alone",
                  "use K 0, or another drafter");
  }
  k_ = k;
  drafter_name_ = name;
  drafter_ = context_->drafter(name);
}

// Keep the prefix of the prompt the context's target cache holds for this scope, start the
// drafter (a draft model keeps its own prefix; with K auto it reads the rest when first asked),
// and read the rest of the prompt but its last token (loop.py's decode_loop).
void Generation::prefill() {
  const double t0 = now();
  const int64_t reading = prompt_len_ - 1;
  const std::optional<std::string>& scope = settings_.scope;
  target_.claim(scope, target_.shared_prefix(committed_.data(), reading, scope));
  const int64_t kept = target_.length();
  stats_.reused_prompt_tokens = kept;
  DraftRequest request{&settings_.sampling, noise_.get(), policy_ == nullptr, scope};
  if (drafter_) drafter_->start(committed_.data(), prompt_len_, request);
  if (reading > kept) {
    const double t1 = now();
    target_.prefill(committed_.data() + kept, reading - kept);
    if (policy_) policy_->observe_prefill(reading - kept, now() - t1);
  }
  stats_.prefill_s = now() - t0;
}

std::vector<int64_t> Generation::next() {
  if (done_) return {};
  if (cancelled_.load(std::memory_order_relaxed)) {
    finish("cancelled");
    return {};
  }
  try {
    if (!started_) {
      started_ = true;
      prefill();
    }
    const double t0 = now();
    std::vector<int64_t> emitted = step();
    stats_.decode_s += now() - t0;
    return emitted;
  } catch (...) {
    finish("error");  // a failed pass leaves no state a next step could trust
    throw;
  }
}

// The verification the sampling settings call for (verifier.py's make_verifier).
std::pair<int, int64_t> Generation::verify(const Proposal& proposal, const float* logits) {
  const Sampling& s = settings_.sampling;
  const int64_t vocab = target_.vocab_size();
  if (s.greedy()) return verify_greedy(proposal.tokens, logits, vocab);
  if (s.invariant) return verify_invariant(proposal.tokens, logits, vocab, s, *noise_, n_context_);
  return verify_rejection(proposal.tokens, proposal.p_draft, logits, vocab, s, *noise_, n_context_);
}

Generation::~Generation() {
  if (policy_) model_.remember_policy(drafter_name_, *policy_);
  if (holds_context_) context_->release();
}

// One step: propose, verify, accept, commit.
std::vector<int64_t> Generation::step() {
  const int64_t* context = committed_.data();
  const std::string source = drafter_ ? drafter_->source(context, n_context_) : "none";
  const int64_t behind = source == "model" ? drafter_->behind(context, n_context_) : 0;
  const int64_t left = settings_.max_new_tokens - stats_.new_tokens;
  auto [wanted, plan] = policy_ ? policy_->decide(source, behind, left) : std::make_pair(k_, DraftPlan());
  const int64_t room = target_.capacity() - target_.length() - 1;
  const int64_t limit = std::max<int64_t>(0, std::min<int64_t>({room, left - 1, int64_t(k_)}));
  const int k = int(std::max<int64_t>(0, std::min<int64_t>(wanted, limit)));
  double t0 = now();
  Proposal proposal;
  if (drafter_ && k > 0) proposal = drafter_->propose(context, n_context_, k, plan);
  const double draft_s = now() - t0;
  // what a lookup would have offered at a step that drafts nothing (sequence.lookup_guess)
  int64_t guess = -1;
  if (proposal.tokens.empty() && drafter_ && is_lookup(source)) {
    Proposal offer = drafter_->propose(context, n_context_, 1, DraftPlan());
    if (!offer.tokens.empty()) guess = offer.tokens.front();
  }
  // [n + 1] the last committed token and the proposal: the committed context is followed by
  // room for K + 1 tokens, so the pass reads it in place
  std::copy(proposal.tokens.begin(), proposal.tokens.end(), committed_.begin() + n_context_);
  const int64_t committed = target_.length();
  t0 = now();
  const float* logits = target_.forward(context + n_context_ - 1, int64_t(proposal.tokens.size()) + 1);
  const double verify_s = now() - t0;
  auto [accepted, next_token] = verify(proposal, logits);
  target_.truncate(committed + 1 + accepted);  // the last committed token and the accepted drafts
  if (drafter_ && k > 0) drafter_->commit(accepted);
  const int proposed = int(proposal.tokens.size());
  if (policy_) {
    StepResult result{source, proposed, accepted, draft_s, verify_s, proposal.catchup,
                      proposal.confidence, guess < 0 ? -1 : int(guess == next_token)};
    policy_->observe(result);
  }
  stats_.draft_s += draft_s;
  stats_.verify_s += verify_s;
  stats_.target_passes += 1;
  stats_.draft_passes += proposal.model_passes;
  stats_.proposed += proposed;
  stats_.accepted += accepted;
  stats_.rejections += accepted < proposed ? 1 : 0;
  for (int i = 0; i < proposed; ++i) stats_.proposed_at[i] += 1;
  for (int i = 0; i < accepted; ++i) stats_.accepted_at[i] += 1;
  std::vector<int64_t> tokens(proposal.tokens.begin(), proposal.tokens.begin() + accepted);
  tokens.push_back(next_token);
  return append(tokens);
}

// Append the step's tokens up to the token limit and the first end (or stop) token, and stop
// where that or the cache says so (sequence.py's _append).
std::vector<int64_t> Generation::append(const std::vector<int64_t>& tokens) {
  const Manifest& m = model_.manifest();
  const int64_t left = settings_.max_new_tokens - stats_.new_tokens;
  std::vector<int64_t> out(tokens.begin(), tokens.begin() + std::min<int64_t>(left, int64_t(tokens.size())));
  const char* stop = nullptr;
  for (size_t i = 0; i < out.size(); ++i) {
    if (contains(m.eos_token_ids, out[i]) || contains(settings_.stop_ids, out[i])) {
      stop = contains(m.eos_token_ids, out[i]) ? "eos" : "stop_id";
      out.resize(i + 1);
      break;
    }
  }
  std::copy(out.begin(), out.end(), committed_.begin() + n_context_);
  n_context_ += int64_t(out.size());
  stats_.new_tokens += int64_t(out.size());
  if (stop != nullptr) finish(stop);
  else if (stats_.new_tokens >= settings_.max_new_tokens) finish("max_new_tokens");
  else if (target_.length() + 1 > target_.capacity()) finish("max_length");
  return out;
}

// It stops here (the first reason stands); a drafter that learns from whole generations is
// handed the output once (sequence.py's finish), unless a pass failed.
void Generation::finish(const char* reason) {
  if (!done_ && drafter_ && std::string(reason) != "error")
    drafter_->finish(committed_.data() + prompt_len_, n_context_ - prompt_len_);
  done_ = true;
  if (stop_reason_.empty()) stop_reason_ = reason;
}

specx_stats Generation::stats() const {
  specx_stats s = stats_;
  const double total = s.prefill_s + s.decode_s;
  s.tokens_per_s = total > 0 ? double(s.new_tokens) / total : 0.0;
  s.decode_tokens_per_s = s.decode_s > 0 ? double(s.new_tokens) / s.decode_s : 0.0;
  s.adaptive = policy_ ? 1 : 0;
  s.drafter = drafter_name_.c_str();
  s.stop_reason = stop_reason_.c_str();
  return s;
}

}  // namespace specx
