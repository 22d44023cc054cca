// K chosen before every step from what the run has seen (-k auto): runtime/decode/adaptive.py,
// ported decision for decision. Expected tokens of a proposal of K are the products of the
// per-position acceptances (decayed counts, shrunk toward the previous position), its cost
// drafting K tokens plus a verify pass over K + 1 (as measured at that K and width, shrunk toward
// a line); the policy takes the K with the most tokens per second, explores a neighbour now and
// then, probes K = 2 after runs of K = 0, and keeps its estimates per source (a model's passes,
// a lookup after an N-token match). For a draft that reports its confidence it also gives the
// plan that takes each drafted token while the chance it is accepted pays for widening the pass.
// It never loses to the target alone where the costs say speculation cannot pay: a verify row is
// priced from the prompt's passes until widths are measured, a draft model from its size, a
// source that could not pay even if always accepted is not probed, probes stay within a budget,
// lookups are never probed, and a lazy draft model is not asked at a generation's first step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace specx {

// (position in the proposal, the draft's top probability there) -> (take it, draft another)
using DraftPlan = std::function<std::pair<bool, bool>(int, double)>;

// What a step did, for the policy (policy.py's StepResult).
struct StepResult {
  std::string source;
  int proposed = 0, accepted = 0;
  double draft_s = 0.0, verify_s = 0.0;
  int64_t catchup = 0;
  std::vector<double> confidence;  // [proposed] where the draft reported it, else empty
  int lookup_first_hit = -1;       // -1: no offer; 0/1: the lookup's first token was right
};

struct SourceEstimate {
  explicit SourceEstimate(int max_k = 8);
  double draft_cost(int k, double prior) const;
  SourceEstimate scaled(int max_k, double keep) const;
  double accept_given_confidence(double top, double prior_weight) const;

  int max_k;
  std::vector<double> reached, accepted;
  double draft_pass_s = 0.0;
  bool draft_seen = false;
  std::vector<std::pair<double, double>> draft_by_k;
  std::vector<double> confidence_reached, confidence_accepted;
  bool confidence_seen = false;
  int steps = 0, zero_streak = 0, probe_after = 0;
  bool probing = false;
  double probe_cost_s = 0.0;  // the last probe's seconds beyond a one-token pass
  int judged = 0;  // proposals whose first position was judged, in all generations (no decay)
  std::vector<double> anchor;  // where an earlier generation left the acceptances (may be empty)
};

class AdaptiveK {
 public:
  explicit AdaptiveK(int max_k);
  int max_k() const { return max_k_; }
  bool used() const { return !history_.empty(); }
  void inherit(const AdaptiveK& previous, double keep = 0.5);
  // the prompt's passes read `tokens` in `seconds` (the cost of a verify row until measured)
  void observe_prefill(int64_t tokens, double seconds);
  void set_draft_ratio(double ratio) { has_draft_ratio_ = true; draft_ratio_ = ratio; }
  void set_lazy_draft(bool lazy) { lazy_draft_ = lazy; }
  bool can_pay(const std::string& source);
  // K for a step from `source`, and the drafting plan (empty function: none); a draft model
  // `behind` the committed tokens reads them first, the generation able to make `left` more
  std::pair<int, DraftPlan> decide(const std::string& source, int64_t behind = 0, int64_t left = 0);
  void observe(const StepResult& step);

 private:
  SourceEstimate& estimate(const std::string& source);
  std::vector<double> acceptances(const std::string& source);
  std::vector<double> acceptances_of(const SourceEstimate& est) const;
  std::vector<double> expected_rates(const std::string& source, int64_t behind = 0, int64_t left = 0,
                                     bool prior = false);
  double catchup_s(int64_t behind) const;
  double verify_line_s(int width) const;
  double verify_s(int width) const;
  bool fitted_slope(double& slope) const;
  double draft_cost(SourceEstimate& est, const std::string& source, int k) const;
  bool probe_due(const std::string& source, SourceEstimate& est, int64_t behind, int64_t left);
  int next_gap(const SourceEstimate& est) const;
  int choose_k(const std::string& source, int64_t behind, int64_t left);
  DraftPlan plan(const std::string& source);
  void observe_verify(const StepResult& step);
  void observe_draft_cost(SourceEstimate& est, const StepResult& step);

  int max_k_, start_k_ = 3;
  double decay_ = 0.95, prior_accept_ = 0.6, prior_weight_ = 4.0;
  int explore_every_ = 8, probe_every_ = 4;
  double confidence_decay_ = 0.98, width_prior_ = 1.0;
  std::map<std::string, SourceEstimate> sources_;
  std::vector<double> fit_;  // decayed sums: n, sum w, sum t, sum w*w, sum w*t
  std::vector<std::pair<double, double>> by_width_;
  bool has_token_s_ = false;
  double token_s_ = 0.0;
  bool has_row_s_ = false;  // a verify row's cost where the widths seen do not say
  double row_s_ = 0.0;
  bool has_catchup_token_s_ = false;  // a draft's measured seconds per token caught up on
  double catchup_token_s_ = 0.0;
  bool has_draft_ratio_ = false;  // a draft pass over a target pass, until measured
  double draft_ratio_ = 0.0;
  bool lazy_draft_ = false;
  std::vector<int> history_;
};

}  // namespace specx
