// A loaded artifact: its manifest, the target's graph, and the draft graphs, opened on first
// use. Read-only to the generations that share it, apart from that one guarded map.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "adaptive.h"
#include "detokenizer.h"
#include "drafters.h"
#include "graph.h"
#include "manifest.h"
#include "suffix.h"

namespace specx {

class Model {
 public:
  Model(const std::string& folder, const SessionConfig& config);

  const Manifest& manifest() const { return manifest_; }
  Graph& target() const { return *target_; }
  const std::vector<std::string>& drafter_names() const { return drafter_names_; }
  const std::string& default_drafter() const { return default_drafter_; }
  // The drafter `name` for one context (nullptr: "none", the target alone).
  std::unique_ptr<Drafter> new_drafter(const std::string& name) const;
  // The weight bytes of the drafter's model over the target's (K auto's draft cost until
  // measured; pipeline.py's draft_ratio); nullopt without a model.
  std::optional<double> draft_ratio(const std::string& drafter) const;
  // What -k auto learned with a drafter, kept for the model's next generations with it
  // (pipeline.py's remember_policy / learned_policy).
  void remember_policy(const std::string& drafter, const AdaptiveK& policy) const;
  std::unique_ptr<AdaptiveK> learned_policy(const std::string& drafter) const;
  // Every id's bytes from the artifact's tokenizer, read on first use (throws Failure).
  const TokenBytes& token_bytes() const;

 private:
  Graph& draft_graph(const ModelSpec& spec) const;
  const std::string& pair_id_of(const ModelSpec& spec) const;
  std::unique_ptr<Drafter> model_drafter(const std::string& name) const;
  std::string folder_;
  SessionConfig config_;
  Manifest manifest_;
  std::unique_ptr<Graph> target_;
  std::vector<std::string> drafter_names_;
  std::string default_drafter_;
  mutable std::mutex drafts_lock_;
  mutable std::map<std::string, std::unique_ptr<Graph>> drafts_;  // by graph file
  mutable std::mutex learned_lock_;
  mutable std::map<std::string, AdaptiveK> learned_;
  mutable std::mutex tokens_lock_;
  mutable std::unique_ptr<TokenBytes> token_bytes_;
  mutable SuffixHistory history_;  // earlier generations' outputs, per scope
};

// The process's one ONNX Runtime environment (created on first use, never destroyed).
Ort::Env& ort_env();

}  // namespace specx
