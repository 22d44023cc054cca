// manifest.json as the C library reads it: the fields the speculative loop needs, checked as
// runtime/artifact/contract.py checks them (docs/artifact-format.md is the format).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specx {

constexpr int kFormatVersion = 4;  // the newest format this library reads (contract.py's)

struct TensorSpec {
  std::string name;
  std::string dtype;  // "int64", "int32", "float32", "float16", "bool"
  size_t rank = 0;
};

struct OpLibrary {
  std::string domain, name, version;
  int abi = 0;
};

struct ModelSpec {
  std::string role, name, graph, architecture, variant, dtype, attention;
  int num_layers = 0, num_heads = 0, kv_heads = 0, head_dim = 0, hidden_size = 0;
  int64_t vocab_size = 0, max_length = 0;
  int64_t weight_bytes = 0;  // what its weights take (0: not recorded)
  std::vector<TensorSpec> inputs, outputs;
  std::vector<OpLibrary> op_libraries;
  bool has_head = false;  // a feature draft (EAGLE head): not run by this library yet
  int64_t feature_size = 0;  // a target's `features` output width (0: none)
  std::vector<std::string> specx_ops;  // the graph's nodes in the specx domain (its kernels)
  // the export whose id the graph carries where not the manifest's (a draft specx import took
  // from another artifact); empty: the manifest's
  std::string pair_id;

  bool has_input(const std::string& n) const;
  // The graph's count of last positions to return logits for (an exported gqa graph's
  // logits_to_keep; an imported graph's num_logits_to_keep or logits_to_keep; int64 [] or [1]);
  // nullptr where the graph has none.
  const TensorSpec* logits_to_keep() const {
    for (const TensorSpec& t : inputs)
      if (t.name == "num_logits_to_keep" || t.name == "logits_to_keep") return &t;
    return nullptr;
  }
  bool half_logits() const {  // an imported fp16 graph: its logits are read as float32
    for (const TensorSpec& t : outputs)
      if (t.name == "logits") return t.dtype == "float16";
    return false;
  }
  bool full_buffer() const { return attention == "gqa" || attention == "batched" || genai(); }
  bool concat() const { return attention == "concat"; }  // imported: present = past + new
  bool genai() const { return attention == "genai"; }  // imported: GenAI's shared buffer
  bool imported() const { return concat() || genai(); }  // past_key_values.N.key names
};

struct Manifest {
  int format_version = 0;
  std::string pair_id;
  int64_t max_length = 0;
  std::string tokenizer;  // the tokenizer file, relative to the artifact
  ModelSpec target;
  std::vector<ModelSpec> drafts;
  std::vector<int64_t> eos_token_ids;
  std::string default_drafter;  // "" where the manifest gives none
  int k_default = 4, k_max = 16;  // the profile's speculation settings, else the runtime's

  const ModelSpec* find_draft(const std::string& name) const;
};

// Read and check FOLDER/manifest.json; throws Failure (SPECX_ARTIFACT) naming the field.
Manifest read_manifest(const std::string& folder);

}  // namespace specx
