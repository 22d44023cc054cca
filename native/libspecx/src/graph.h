// One exported graph run by ONNX Runtime through I/O binding, and its cache.
//
// A Graph is the loaded session, shared read-only by every generation of a model (ONNX
// Runtime's Run is thread-safe). A Runner is one context's use of it: its own binding, its
// preallocated cache (length is the only truth; rollback sets it) and its logits buffer. The
// cache records the token id each position was computed from and the scope whose prompts it
// holds (kv_cache.py), so that a later generation of that scope keeps the prefix of its prompt
// the cache holds (a reused prefix is a length too). As in runtime/backends/ort_session.py:
//   plain graphs   past = the valid prefix of each buffer, new = the slots right after it
//   gqa graphs     past and present = the same full buffer; seqlens_k and
//                  total_sequence_length say what is valid
//   genai graphs   (imported, GenAI's builder) as gqa, with an all-ones attention_mask
//   concat graphs  (imported: present = past + new) two buffer sets in turn, past from the set
//                  the last pass wrote; rolled-back slots stay as holes attention_mask masks,
//                  compacted once they pass a quarter of the valid positions (concat_cache.py)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "device.h"
#include "manifest.h"

namespace specx {

constexpr int kMaxChunk = 128;  // prompt tokens per pass (backends/base.py's DEFAULT_CHUNK)
constexpr int64_t kMinHoles = 32;  // a concat cache's holes kept before compacting (MIN_HOLES)
constexpr int64_t kConcatRoom = 2 * kMaxChunk;  // its slots beyond the capacity (CONCAT_ROOM)

struct SessionConfig {
  int threads = 0;
  bool alternating = false;  // takes turns with another session: no spinning threads
  std::string provider = "cpu";  // "cpu", "cuda" or "tensorrt" (ONNX Runtime's providers)
  int device_id = 0;              // the GPU, for cuda and tensorrt
  std::string kernels_library;  // "" where no graph needs it
};

class Graph {
 public:
  Graph(Ort::Env& env, const std::string& folder, const ModelSpec& spec,
        const std::string& pair_id, const SessionConfig& config);
  const ModelSpec& spec() const { return spec_; }
  Ort::Session& session() { return session_; }
  // Where the caches live: host memory, or the GPU the provider computes on.
  const std::shared_ptr<DeviceMemory>& memory() const { return memory_; }

 private:
  void check_io();
  ModelSpec spec_;
  std::string path_;
  Ort::Session session_{nullptr};
  std::shared_ptr<DeviceMemory> memory_;
};

class Runner {
 public:
  Runner(Graph& graph, int64_t capacity);
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t vocab_size() const { return graph_.spec().vocab_size; }
  void truncate(int64_t length);  // rollback: the length is the only truth
  int64_t passes() const { return passes_; }
  int64_t compactions() const { return compactions_; }
  // How many leading tokens of prompt[0, n) the cache holds for `scope` (0 for another scope,
  // or none).
  int64_t shared_prefix(const int64_t* prompt, int64_t n, const std::optional<std::string>& scope) const;
  // The cache now serves a generation of `scope`, keeping its first `keep` positions.
  void claim(const std::optional<std::string>& scope, int64_t keep);

  // Score 1..kMaxChunk new tokens on top of the cache; returns their logits, [seq, vocab],
  // a view the next call overwrites.
  const float* forward(const int64_t* tokens, int64_t seq) { return forward(tokens, seq, seq); }
  // The same pass, returning only its last `keep` positions' logits ([keep, vocab]) where the
  // graph takes a logits count (ModelSpec::logits_to_keep); all `seq` where it does not.
  const float* forward(const int64_t* tokens, int64_t seq, int64_t keep);
  // Any number of tokens in chunks of kMaxChunk; the last row's logits (nullptr for none).
  const float* prefill(const int64_t* tokens, int64_t n);

 private:
  void bind_cache(int64_t past, int64_t seq);
  void bind_concat(int64_t seq);
  void compact();
  uint8_t* buffer(int set, int layer, int kv) const;
  Graph& graph_;
  int64_t capacity_;
  int64_t length_ = 0;
  int64_t passes_ = 0;
  std::vector<int64_t> tokens_;  // [capacity] the id each position was computed from
  std::optional<std::string> scope_;  // whose prompts the cache holds (nullopt: nobody's)
  size_t elem_bytes_;
  int64_t layer_elems_;  // elements of one layer's key (or value) buffer
  std::vector<std::unique_ptr<DeviceBuffer>> keys_, values_;  // [layer]
  std::vector<float> logits_;    // [kMaxChunk, vocab]
  std::vector<float> features_;  // [kMaxChunk, F] where the target has a features output
  std::vector<int64_t> ids_, positions_;
  int32_t seqlens_k_ = 0, total_length_ = 0;
  int64_t keep_ = 0;  // the graph's logits_to_keep: the pass's token count, or 1 (a prefill)
  Ort::IoBinding io_;
  Ort::MemoryInfo cpu_;  // ids, positions, logits: always host memory
  bool cache_bound_ = false;
  // concat graphs: the second buffer set, which set holds the slots, the slots computed so far
  // (holes included), which are valid, and each valid position's slot
  std::vector<std::unique_ptr<DeviceBuffer>> keys2_, values2_;
  int front_ = 0;
  int64_t slots_ = 0, slot_capacity_ = 0, compactions_ = 0;
  std::vector<int64_t> mask_, slot_of_;
  std::vector<int64_t> ones_;  // genai graphs: the attention mask, all ones
  std::vector<uint16_t> logits16_;  // fp16 graphs: their logits, converted into logits_
  // an imported graph's int32 ids, positions or mask: each one's int32 copy, by input name
  // (sized at construction; no entry for an int64 input)
  std::map<std::string, std::vector<int32_t>> narrow_;

  // An int64 index input (input_ids, position_ids, attention_mask) as the graph declares it:
  // the values themselves, or their int32 copy where the graph takes int32.
  Ort::Value index_tensor(const std::string& name, int64_t* values, size_t count,
                          const int64_t* shape, size_t rank);
};

}  // namespace specx
