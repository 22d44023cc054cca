#include "model.h"

#include "failure.h"

namespace specx {

Ort::Env& ort_env() {
  static Ort::Env* env = new Ort::Env(ORT_LOGGING_LEVEL_ERROR, "specx");
  return *env;
}

// The export a graph must carry: its own where the import took it from another artifact.
const std::string& Model::pair_id_of(const ModelSpec& spec) const {
  return spec.pair_id.empty() ? manifest_.pair_id : spec.pair_id;
}

Model::Model(const std::string& folder, const SessionConfig& config)
    : folder_(folder), config_(config), manifest_(read_manifest(folder)) {
  for (const ModelSpec& d : manifest_.drafts)
    if (d.graph != manifest_.target.graph) config_.alternating = true;
  target_ = std::make_unique<Graph>(ort_env(), folder_, manifest_.target,
                                    pair_id_of(manifest_.target), config_);
  // registry.py's drafter_names: the drafts, the lookups, each draft behind each lookup, none
  for (const ModelSpec& d : manifest_.drafts) drafter_names_.push_back(d.name);
  drafter_names_.push_back("ngram");
  drafter_names_.push_back("suffix");
  for (const char* lookup : {"ngram+", "suffix+"})
    for (const ModelSpec& d : manifest_.drafts) drafter_names_.push_back(lookup + d.name);
  drafter_names_.push_back("none");
  default_drafter_ = !manifest_.default_drafter.empty() ? manifest_.default_drafter
                     : !manifest_.drafts.empty()        ? manifest_.drafts.front().name
                                                        : "none";
  bool known = false;
  for (const std::string& n : drafter_names_) known = known || n == default_drafter_;
  if (!known)
    throw artifact_error("the manifest's default_drafter '" + default_drafter_ +
                         "' is not a drafter of this artifact");
}

Graph& Model::draft_graph(const ModelSpec& spec) const {
  if (spec.graph == manifest_.target.graph) return *target_;  // the target drafting for itself
  std::lock_guard<std::mutex> hold(drafts_lock_);
  std::unique_ptr<Graph>& graph = drafts_[spec.graph];
  if (!graph) graph = std::make_unique<Graph>(ort_env(), folder_, spec, pair_id_of(spec), config_);
  return *graph;
}

std::unique_ptr<Drafter> Model::model_drafter(const std::string& name) const {
  const ModelSpec* spec = manifest_.find_draft(name);
  if (spec == nullptr) throw invalid("unknown drafter '" + name + "'");
  if (spec->has_head)
    throw Failure(SPECX_UNSUPPORTED, "'" + name + "' is a feature draft (an EAGLE head), which "
                                     "this libspecx does not run yet: use the Python runtime, or "
                                     "another drafter");
  return std::make_unique<ModelDrafter>(draft_graph(*spec), manifest_.max_length,
                                        manifest_.target.vocab_size, manifest_.eos_token_ids);
}

void Model::remember_policy(const std::string& drafter, const AdaptiveK& policy) const {
  if (!policy.used()) return;
  std::lock_guard<std::mutex> hold(learned_lock_);
  learned_.insert_or_assign(drafter, policy);
}

std::unique_ptr<AdaptiveK> Model::learned_policy(const std::string& drafter) const {
  std::lock_guard<std::mutex> hold(learned_lock_);
  auto it = learned_.find(drafter);
  return it == learned_.end() ? nullptr : std::make_unique<AdaptiveK>(it->second);
}

std::unique_ptr<Drafter> Model::new_drafter(const std::string& name) const {
  const std::vector<int64_t>& eos = manifest_.eos_token_ids;
  if (name == "none") return nullptr;
  if (name == "ngram") return std::make_unique<NgramDrafter>(eos);
  if (name == "suffix") return std::make_unique<SuffixDrafter>(&history_, eos);
  if (name.rfind("ngram+", 0) == 0)
    return std::make_unique<HybridDrafter>(std::make_unique<NgramDrafter>(eos), model_drafter(name.substr(6)));
  if (name.rfind("suffix+", 0) == 0)
    return std::make_unique<HybridDrafter>(std::make_unique<SuffixDrafter>(&history_, eos),
                                           model_drafter(name.substr(7)));
  return model_drafter(name);
}

std::optional<double> Model::draft_ratio(const std::string& drafter) const {
  std::string inner = drafter;
  for (const char* lookup : {"ngram+", "suffix+"})
    if (inner.rfind(lookup, 0) == 0) inner = inner.substr(std::string(lookup).size());
  const ModelSpec* spec = manifest_.find_draft(inner);
  const int64_t target = manifest_.target.weight_bytes;
  if (spec == nullptr || spec->has_head || spec->weight_bytes == 0 || target == 0) return std::nullopt;
  return double(spec->weight_bytes) / double(target);
}

const TokenBytes& Model::token_bytes() const {
  std::lock_guard<std::mutex> hold(tokens_lock_);
  if (!token_bytes_) token_bytes_ = std::make_unique<TokenBytes>(TokenBytes::read(folder_ + "/" + manifest_.tokenizer));
  return *token_bytes_;
}

}  // namespace specx
