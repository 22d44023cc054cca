#include "adaptive.h"

#include <algorithm>
#include <iterator>
#include <memory>

namespace specx {
namespace {

constexpr int kProbeMost = 1024;  // the longest run of K = 0 steps between probes
constexpr double kProbeBudget = 0.02;  // probes' share of the time spent at K = 0
constexpr double kHold = 0.98;  // keep a model at K = 1 within this share of K = 0's rate
constexpr int kMinJudged = 6;  // a model draft's proposals judged before giving it up
constexpr int64_t kCatchupMeasured = 16;  // a catch-up this long measures a token's cost
const double kConfidenceEdges[] = {0.3, 0.5, 0.7, 0.9, 0.97};
const double kConfidencePrior[] = {0.35, 0.6, 0.8, 0.9, 0.95, 0.98};

bool is_lookup(const std::string& source) { return source.rfind("lookup", 0) == 0; }

size_t bucket(double top) {  // bisect_right over the edges
  return size_t(std::upper_bound(std::begin(kConfidenceEdges), std::end(kConfidenceEdges), top) -
                std::begin(kConfidenceEdges));
}

}  // namespace

SourceEstimate::SourceEstimate(int k)
    : max_k(k),
      reached(size_t(k), 0.0),
      accepted(size_t(k), 0.0),
      draft_by_k(size_t(k) + 1, {0.0, 0.0}),
      confidence_reached(6, 0.0),
      confidence_accepted(6, 0.0) {}

double SourceEstimate::draft_cost(int k, double prior) const {
  const double per_token = k * draft_pass_s;
  if (k >= int(draft_by_k.size())) return per_token;
  const auto [n, total] = draft_by_k[size_t(k)];
  return (total + prior * per_token) / (n + prior);
}

SourceEstimate SourceEstimate::scaled(int k, double keep) const {
  SourceEstimate out(k);
  for (int i = 0; i < k && i < int(reached.size()); ++i) {
    out.reached[size_t(i)] = keep * reached[size_t(i)];
    out.accepted[size_t(i)] = keep * accepted[size_t(i)];
  }
  out.draft_pass_s = draft_pass_s;
  out.draft_seen = draft_seen;
  for (int i = 0; i <= k && i < int(draft_by_k.size()); ++i)
    out.draft_by_k[size_t(i)] = {keep * draft_by_k[size_t(i)].first, keep * draft_by_k[size_t(i)].second};
  for (size_t b = 0; b < 6; ++b) {
    out.confidence_reached[b] = keep * confidence_reached[b];
    out.confidence_accepted[b] = keep * confidence_accepted[b];
  }
  out.confidence_seen = confidence_seen;
  out.steps = steps ? 1 : 0;
  out.zero_streak = zero_streak;  // the probes' rhythm goes on: short generations still probe
  out.probe_after = probe_after;
  out.probe_cost_s = probe_cost_s;
  out.judged = judged;  // what was seen stays seen (the anchor: inherit sets it)
  return out;
}

double SourceEstimate::accept_given_confidence(double top, double prior_weight) const {
  const size_t b = bucket(top);
  return (confidence_accepted[b] + prior_weight * kConfidencePrior[b]) /
         (confidence_reached[b] + prior_weight);
}

AdaptiveK::AdaptiveK(int max_k)
    : max_k_(max_k), fit_(5, 0.0), by_width_(size_t(max_k) + 2, {0.0, 0.0}) {}

SourceEstimate& AdaptiveK::estimate(const std::string& source) {
  auto it = sources_.find(source);
  if (it == sources_.end()) it = sources_.emplace(source, SourceEstimate(max_k_)).first;
  return it->second;
}

void AdaptiveK::inherit(const AdaptiveK& previous, double keep) {
  sources_.clear();
  for (const auto& [name, est] : previous.sources_) {
    SourceEstimate mine = est.scaled(max_k_, keep);
    // this generation shrinks toward where the earlier one left each position
    mine.anchor = previous.acceptances_of(est);
    if (int(mine.anchor.size()) > max_k_) mine.anchor.resize(size_t(max_k_));
    sources_.emplace(name, std::move(mine));
  }
  for (size_t i = 0; i < fit_.size(); ++i) fit_[i] = keep * previous.fit_[i];
  has_token_s_ = previous.has_token_s_;
  token_s_ = previous.token_s_;
  has_row_s_ = previous.has_row_s_;
  row_s_ = previous.row_s_;
  has_catchup_token_s_ = previous.has_catchup_token_s_;
  catchup_token_s_ = previous.catchup_token_s_;
  for (size_t w = 0; w < by_width_.size(); ++w)
    by_width_[w] = w < previous.by_width_.size()
                       ? std::make_pair(keep * previous.by_width_[w].first, keep * previous.by_width_[w].second)
                       : std::make_pair(0.0, 0.0);
}

std::vector<double> AdaptiveK::acceptances(const std::string& source) {
  return acceptances_of(estimate(source));
}

std::vector<double> AdaptiveK::acceptances_of(const SourceEstimate& est) const {
  std::vector<double> out;
  double p = prior_accept_;
  for (size_t i = 0; i < est.reached.size(); ++i) {
    const double toward = i < est.anchor.size() ? est.anchor[i] : p;
    p = (est.accepted[i] + prior_weight_ * toward) / (est.reached[i] + prior_weight_);
    out.push_back(p);
  }
  return out;
}

bool AdaptiveK::fitted_slope(double& slope) const {
  const double n = fit_[0], sw = fit_[1], st = fit_[2], sww = fit_[3], swt = fit_[4];
  if (n < 1e-9) return false;
  const double mean_w = sw / n, mean_t = st / n;
  const double var = sww / n - mean_w * mean_w;
  if (!(var > 0.25)) return false;
  slope = (swt / n - mean_w * mean_t) / var;
  return true;
}

double AdaptiveK::verify_line_s(int width) const {
  const double n = fit_[0], sw = fit_[1], st = fit_[2];
  if (n < 1e-9) return 1.0;
  const double mean_w = sw / n, mean_t = st / n;
  double slope = 0.0;
  if (!fitted_slope(slope)) {
    // the last slope measured, or a prompt pass's cost per token; else 5% per extra token
    slope = has_row_s_ ? row_s_ : 0.05 * mean_t / mean_w;
  }
  return std::max(1e-6, mean_t + std::max(0.0, slope) * (width - mean_w));
}

void AdaptiveK::observe_prefill(int64_t tokens, double seconds) {
  if (tokens >= 8 && seconds > 0) {
    has_row_s_ = true;
    row_s_ = seconds / double(tokens);
  }
}

double AdaptiveK::draft_cost(SourceEstimate& est, const std::string& source, int k) const {
  if (!est.draft_seen && source == "model" && has_draft_ratio_) return k * draft_ratio_ * verify_s(1);
  return est.draft_cost(k, width_prior_);
}

bool AdaptiveK::can_pay(const std::string& source) {
  SourceEstimate& est = estimate(source);
  const double alone = 1.0 / verify_s(1);
  for (int k = 1; k <= max_k_; ++k)
    if ((k + 1) / (draft_cost(est, source, k) + verify_s(k + 1)) > alone) return true;
  return false;
}

bool AdaptiveK::probe_due(const std::string& source, SourceEstimate& est, int64_t behind,
                          int64_t left) {
  if (is_lookup(source) || est.zero_streak < std::max(probe_every_, est.probe_after)) return false;
  if (!can_pay(source)) return false;
  const double catch_s = source == "model" ? catchup_s(behind) : 0.0;
  return catch_s <= kProbeBudget * double(est.zero_streak + left) * verify_s(1);
}

int AdaptiveK::next_gap(const SourceEstimate& est) const {
  const int doubled = 2 * std::max(probe_every_, est.probe_after);
  const double one = verify_s(1);
  const int budgeted = one > 0 ? int(est.probe_cost_s / (kProbeBudget * one)) : 0;
  return std::min(kProbeMost, std::max(doubled, budgeted));
}

double AdaptiveK::verify_s(int width) const {
  const double line = verify_line_s(width);
  if (width >= int(by_width_.size())) return line;
  const auto [n, total] = by_width_[size_t(width)];
  return (total + width_prior_ * line) / (n + width_prior_);
}

double AdaptiveK::catchup_s(int64_t behind) const {
  const int64_t extra = behind - 2;  // beyond what every step reads (in the measured costs)
  if (extra <= 0) return 0.0;
  if (has_catchup_token_s_) return double(extra) * catchup_token_s_;
  if (!has_row_s_) return 0.0;
  const double ratio = has_draft_ratio_ ? draft_ratio_ : 1.0;
  return double(extra) * ratio * row_s_;
}

std::vector<double> AdaptiveK::expected_rates(const std::string& source, int64_t behind, int64_t left,
                                              bool prior) {
  std::vector<double> tokens{1.0};
  double chain = 1.0;
  const std::vector<double> seen =
      prior ? std::vector<double>(size_t(max_k_), prior_accept_) : acceptances(source);
  for (double p : seen) {
    chain *= p;
    tokens.push_back(tokens.back() + chain);
  }
  SourceEstimate& est = estimate(source);
  const double catch_s = source == "model" ? catchup_s(behind) : 0.0;
  std::vector<double> rates;
  for (int k = 0; k <= max_k_; ++k) {
    const double made = tokens[size_t(k)];
    double cost = draft_cost(est, source, k) + verify_s(k + 1);
    if (k && catch_s != 0.0) cost += catch_s * made / std::max(double(left), made);
    rates.push_back(made / cost);
  }
  return rates;
}

std::pair<int, DraftPlan> AdaptiveK::decide(const std::string& source, int64_t behind, int64_t left) {
  const int k = choose_k(source, behind, left);
  history_.push_back(k);
  return {k, k > 0 ? plan(source) : DraftPlan()};
}

int AdaptiveK::choose_k(const std::string& source, int64_t behind, int64_t left) {
  if (source == "none") return 0;  // the drafter has nothing to offer
  if (source == "model" && lazy_draft_ && history_.empty()) return 0;  // the first token waits not
  SourceEstimate& est = estimate(source);
  int k;
  if (fit_[0] < 1e-9 && has_row_s_) {
    k = 0;  // a row's cost is known, a pass's is not: one plain step measures it
  } else if (est.steps == 0 && !has_row_s_) {
    k = start_k_;  // nothing measured at all
  } else if (probe_due(source, est, behind, left)) {
    k = std::min(2, max_k_);  // a probe: has the drafter started to agree again?
    est.probing = true;
  } else {
    const std::vector<double> rates = expected_rates(source, behind, left);
    k = int(std::max_element(rates.begin(), rates.end()) - rates.begin());  // the first best
    if (k == 0 && source == "model" && rates[1] >= kHold * rates[0]) {
      k = 1;  // catch-up later
    } else if (k == 0 && source == "model" && est.judged < kMinJudged) {
      // seen too little to give up on its acceptance: what the prior says, costs and catch-up in
      const std::vector<double> hopeful = expected_rates(source, behind, left, true);
      k = int(std::max_element(hopeful.begin(), hopeful.end()) - hopeful.begin());
    }
    if (est.steps % explore_every_ == 0 && k > 0) k = std::min(max_k_, k + 1);
    if (k > 0 && est.confidence_seen && has_token_s_) k = max_k_;  // the plan decides
    if (est.probing) {
      est.probing = false;
      est.probe_after = k == 0 ? next_gap(est) : probe_every_;
    }
  }
  return k;
}

DraftPlan AdaptiveK::plan(const std::string& source) {
  SourceEstimate* est = &estimate(source);
  if (!est->confidence_seen || !has_token_s_)
    return [](int, double) { return std::make_pair(true, true); };  // report confidences
  const double token_s = token_s_;
  auto chain = std::make_shared<double>(1.0);
  return [this, est, token_s, chain](int position, double top) {
    if (position == 0) *chain = 1.0;
    const double accept = est->accept_given_confidence(top, prior_weight_);
    *chain *= accept;
    const double gain_s = *chain * token_s;  // the time this token is expected to save
    const double widen = verify_s(position + 2) - verify_s(position + 1);
    if (gain_s < widen) return std::make_pair(false, false);
    if (position + 1 >= max_k_) return std::make_pair(true, false);
    const double widen_next = verify_s(position + 3) - verify_s(position + 2);
    return std::make_pair(true, gain_s * accept >= est->draft_pass_s + widen_next);
  };
}

void AdaptiveK::observe(const StepResult& step) {
  const double d = decay_;
  observe_verify(step);
  if (step.source == "none") return;
  SourceEstimate& est = estimate(step.source);
  est.steps += 1;
  if (step.proposed == 0) {
    if (step.lookup_first_hit >= 0) {  // a lookup's offer, learned for free
      est.reached[0] = d * est.reached[0] + 1.0;
      est.accepted[0] = d * est.accepted[0] + double(step.lookup_first_hit);
    }
    est.zero_streak += 1;
    return;
  }
  observe_draft_cost(est, step);
  if (est.probing) est.probe_cost_s = step.draft_s + step.verify_s - verify_s(1);
  est.zero_streak = 0;
  const int verified = std::min(step.proposed, step.accepted + 1);  // positions judged
  ++est.judged;
  for (int i = 0; i < verified; ++i) {
    est.reached[size_t(i)] = d * est.reached[size_t(i)] + 1.0;
    est.accepted[size_t(i)] = d * est.accepted[size_t(i)] + (i < step.accepted ? 1.0 : 0.0);
  }
  if (!step.confidence.empty() && int(step.confidence.size()) == step.proposed) {
    est.confidence_seen = true;
    for (size_t b = 0; b < 6; ++b) {
      est.confidence_reached[b] *= confidence_decay_;
      est.confidence_accepted[b] *= confidence_decay_;
    }
    for (int i = 0; i < verified; ++i) {
      const size_t b = bucket(step.confidence[size_t(i)]);
      est.confidence_reached[b] += 1.0;
      est.confidence_accepted[b] += i < step.accepted ? 1.0 : 0.0;
    }
  }
}

void AdaptiveK::observe_verify(const StepResult& step) {
  const double d = decay_;
  const double width = step.proposed + 1;
  const double xs[5] = {1.0, width, step.verify_s, width * width, width * step.verify_s};
  for (size_t i = 0; i < 5; ++i) fit_[i] = d * fit_[i] + xs[i];
  for (auto& [n, t] : by_width_) {
    n *= d;
    t *= d;
  }
  if (size_t(width) < by_width_.size()) {
    by_width_[size_t(width)].first += 1.0;
    by_width_[size_t(width)].second += step.verify_s;
  }
  double slope = 0.0;
  if (fitted_slope(slope)) {  // kept for when the widths seen later stop varying
    has_row_s_ = true;
    row_s_ = std::max(0.0, slope);
  }
  const double per_token = (step.draft_s + step.verify_s) / (step.accepted + 1);
  token_s_ = has_token_s_ ? 0.9 * token_s_ + 0.1 * per_token : per_token;
  has_token_s_ = true;
}

void AdaptiveK::observe_draft_cost(SourceEstimate& est, const StepResult& step) {
  const double d = decay_;
  const double per_token = step.draft_s / step.proposed;
  if (step.catchup >= kCatchupMeasured) {  // what reading a token costs, the passes aside
    const double passes = est.draft_seen ? step.proposed * est.draft_pass_s : 0.0;
    catchup_token_s_ = std::max(0.0, step.draft_s - passes) / double(step.catchup);
    has_catchup_token_s_ = true;
  }
  if (step.catchup <= 2) {
    const double weight = est.draft_seen ? 0.3 : 1.0;
    est.draft_pass_s = (1 - weight) * est.draft_pass_s + weight * per_token;
    est.draft_seen = true;
    for (auto& [n, t] : est.draft_by_k) {
      n *= d;
      t *= d;
    }
    if (size_t(step.proposed) < est.draft_by_k.size()) {
      est.draft_by_k[size_t(step.proposed)].first += 1.0;
      est.draft_by_k[size_t(step.proposed)].second += step.draft_s;
    }
  } else if (est.draft_seen) {
    est.draft_pass_s = std::min(est.draft_pass_s, per_token);  // an upper bound
  } else {
    est.draft_pass_s = step.draft_s / double(step.proposed + step.catchup);  // provisional
  }
}

}  // namespace specx
