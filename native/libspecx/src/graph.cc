#include "graph.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "failure.h"

namespace specx {
namespace {

constexpr int kKernelsAbi = 1;  // the specx kernels' C ABI this library speaks

// An IEEE half's value as a float (exact: every half is a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {  // subnormal: normalise
    int shift = 0;
    uint32_t m = mantissa;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      ++shift;
    }
    bits = sign | (uint32_t(113 - shift) << 23) | ((m & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const char* type_name(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "other";
  }
}

// The kernels library a graph needs, checked before any session exists (as
// runtime/kernels/library.py does): present, and of the ABI the manifest records.
void check_kernels(const ModelSpec& spec, const std::string& path) {
  const std::string hint =
      "build it with scripts/build_kernels.sh (scripts/setup.sh does), or export the artifact "
      "again with --kernels ort (ONNX Runtime's own MatMulNBits)";
  for (const OpLibrary& lib : spec.op_libraries) {
    if (lib.name == "specx_kernels" && lib.abi != 0 && lib.abi != kKernelsAbi)
      throw artifact_error(spec.graph + " was exported for specx kernels ABI " +
                               std::to_string(lib.abi) + "; this libspecx speaks ABI " +
                               std::to_string(kKernelsAbi),
                           "export the artifact again with this version of specx");
  }
  if (path.empty() || !is_file(path))
    throw Failure(SPECX_PROVIDER, spec.graph + " computes with specx kernels (" +
                                      spec.specx_ops.front() +
                                      ") and the kernels library is not found" +
                                      (path.empty() ? "" : " at " + path) + ": " + hint +
                                      "; or name it with specx_model_options_set_kernels_library");
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    throw Failure(SPECX_PROVIDER, path + " cannot be loaded: " + dlerror());
  using AbiFn = int (*)();
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "specx_kernels_abi_version"));
  int got = abi != nullptr ? abi() : -1;
  dlclose(handle);
  if (got != kKernelsAbi)
    throw Failure(SPECX_PROVIDER, path + " is not a specx kernels library of ABI " +
                                      std::to_string(kKernelsAbi) + ": " + hint);
}

// The GPU providers a session asks for, first to last (ONNX Runtime keeps its CPU provider
// as the fallback for any operator they lack). Refused here, naming the fix, where the ONNX
// Runtime libspecx was built against lacks the provider or cannot run the graph on it.
void append_providers(Ort::SessionOptions& options, const ModelSpec& spec, const SessionConfig& config) {
  if (config.provider == "cpu") return;
  const std::string full = config.provider == "cuda" ? "CUDAExecutionProvider" : "TensorrtExecutionProvider";
  std::string available;
  bool found = false;
  for (const std::string& name : Ort::GetAvailableProviders()) {
    available += (available.empty() ? "" : ", ") + name;
    found = found || name == full;
  }
  if (!found)
    throw Failure(SPECX_PROVIDER, "execution provider '" + config.provider +
                                      "' is not available in the ONNX Runtime libspecx runs on (available: " +
                                      available + "); build libspecx against onnxruntime-gpu's library "
                                      "(scripts/setup.sh --gpu does) or use \"cpu\"");
  if (spec.attention == "gqa" && spec.dtype == "float32")
    throw Failure(SPECX_PROVIDER, spec.graph + " is an fp32 GroupQueryAttention graph, which ONNX Runtime "
                                      "runs only on the CPU (its CUDA kernel is fp16/bf16); re-export "
                                      "with an fp16 profile or --attention plain for CUDA");
  const OrtApi& api = Ort::GetApi();
  const std::string device = std::to_string(config.device_id);
  const char* keys[] = {"device_id"};
  const char* values[] = {device.c_str()};
  if (config.provider == "tensorrt") {
    OrtTensorRTProviderOptionsV2* raw = nullptr;
    Ort::ThrowOnError(api.CreateTensorRTProviderOptions(&raw));
    std::unique_ptr<OrtTensorRTProviderOptionsV2, void (*)(OrtTensorRTProviderOptionsV2*)> trt(
        raw, api.ReleaseTensorRTProviderOptions);
    Ort::ThrowOnError(api.UpdateTensorRTProviderOptions(trt.get(), keys, values, 1));
    options.AppendExecutionProvider_TensorRT_V2(*trt);
  }
  OrtCUDAProviderOptionsV2* raw = nullptr;  // tensorrt: CUDA takes what TensorRT does not
  Ort::ThrowOnError(api.CreateCUDAProviderOptions(&raw));
  std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> cuda(
      raw, api.ReleaseCUDAProviderOptions);
  Ort::ThrowOnError(api.UpdateCUDAProviderOptions(cuda.get(), keys, values, 1));
  options.AppendExecutionProvider_CUDA_V2(*cuda);
}

Ort::SessionOptions session_options(const ModelSpec& spec, const SessionConfig& config) {
  Ort::SessionOptions options;
  options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  options.SetLogSeverityLevel(3);
  if (config.threads > 0) options.SetIntraOpNumThreads(config.threads);
  if (config.alternating) options.AddConfigEntry("session.intra_op.allow_spinning", "0");
  if (!spec.specx_ops.empty()) {
    check_kernels(spec, config.kernels_library);
    options.RegisterCustomOpsLibrary(config.kernels_library.c_str());
  }
  try {
    append_providers(options, spec, config);
  } catch (const Ort::Exception& e) {
    throw Failure(SPECX_PROVIDER, "the " + config.provider + " provider failed to initialise: " +
                                      std::string(e.what()).substr(0, 300) +
                                      " (check the CUDA/TensorRT installation and that a GPU is visible)");
  }
  return options;
}

}  // namespace

Graph::Graph(Ort::Env& env, const std::string& folder, const ModelSpec& spec,
             const std::string& pair_id, const SessionConfig& config)
    : spec_(spec), path_(folder + "/" + spec.graph) {
  if (!is_file(path_))
    throw artifact_error("graph file " + path_ + " is missing");
  Ort::SessionOptions options = session_options(spec, config);
  try {
    session_ = Ort::Session(env, path_.c_str(), options);
  } catch (const Ort::Exception& e) {
    std::string what = e.what();
    throw artifact_error("onnxruntime cannot load " + spec.graph + ": " +
                             what.substr(0, std::min<size_t>(what.find('\n'), 300)),
                         "the file is corrupt or truncated; re-export the artifact");
  }
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::ModelMetadata meta = session_.GetModelMetadata();
  Ort::AllocatedStringPtr recorded = meta.LookupCustomMetadataMapAllocated("specx.pair_id", allocator);
  if (recorded && !pair_id.empty() && pair_id != recorded.get())
    throw artifact_error(spec.graph + " belongs to another export (pair id " +
                         std::string(recorded.get()) + ", the manifest's is " + pair_id + ")");
  Ort::AllocatedStringPtr length = meta.LookupCustomMetadataMapAllocated("specx.max_length", allocator);
  if (length) {
    char* end = nullptr;
    long long positions = std::strtoll(length.get(), &end, 10);
    if (end != length.get() && *end == '\0' && spec.max_length > positions)
      throw artifact_error("the manifest gives " + spec.graph + " max_length " +
                           std::to_string(spec.max_length) + ", but the graph was exported for " +
                           std::to_string(positions) + " positions");
  }
  check_io();
  memory_ = device_memory(config.provider, config.device_id);
}

void Graph::check_io() {
  Ort::AllocatorWithDefaultOptions allocator;
  for (int side = 0; side < 2; ++side) {
    const std::vector<TensorSpec>& expected = side == 0 ? spec_.inputs : spec_.outputs;
    size_t count = side == 0 ? session_.GetInputCount() : session_.GetOutputCount();
    const char* kind = side == 0 ? "input" : "output";
    if (count != expected.size())
      throw artifact_error(spec_.graph + " has " + std::to_string(count) + " " + kind +
                               "s, the manifest lists " + std::to_string(expected.size()),
                           "the graph and manifest come from different exports; re-export");
    for (size_t i = 0; i < count; ++i) {
      Ort::AllocatedStringPtr name = side == 0 ? session_.GetInputNameAllocated(i, allocator)
                                               : session_.GetOutputNameAllocated(i, allocator);
      const TensorSpec* want = nullptr;
      for (const TensorSpec& t : expected)
        if (t.name == name.get()) want = &t;
      if (want == nullptr)
        throw artifact_error(spec_.graph + " has " + kind + " '" + name.get() +
                                 "' that the manifest does not list",
                             "the graph and manifest come from different exports; re-export");
      Ort::TypeInfo info = side == 0 ? session_.GetInputTypeInfo(i) : session_.GetOutputTypeInfo(i);
      auto tensor = info.GetTensorTypeAndShapeInfo();
      std::string dtype = type_name(tensor.GetElementType());
      if (dtype != want->dtype || tensor.GetDimensionsCount() != want->rank)
        throw artifact_error(spec_.graph + ": " + kind + " '" + want->name + "' is " + dtype +
                                 " of rank " + std::to_string(tensor.GetDimensionsCount()) +
                                 ", the manifest says " + want->dtype + " of rank " +
                                 std::to_string(want->rank),
                             "the graph and manifest come from different exports; re-export");
    }
  }
}

Runner::Runner(Graph& graph, int64_t capacity)
    : graph_(graph),
      capacity_(capacity),
      elem_bytes_(graph.spec().dtype == "float16" ? 2 : 4),
      io_(graph.session()),
      cpu_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)) {
  const ModelSpec& s = graph.spec();
  if (capacity > s.max_length)
    throw invalid("a cache of " + std::to_string(capacity) + " positions exceeds the " +
                  std::to_string(s.max_length) + " " + s.graph + " was exported for");
  const int64_t slots = s.concat() ? capacity + kConcatRoom : capacity;
  if (s.genai()) ones_.assign(size_t(capacity + kMaxChunk), 1);
  for (const TensorSpec& t : s.inputs)  // an imported graph's int32 ids, positions or mask
    if (t.dtype == "int32" && (t.name == "input_ids" || t.name == "position_ids" ||
                               t.name == "attention_mask"))
      narrow_[t.name].assign(size_t(slots + kMaxChunk), 0);
  if (s.concat()) {
    if (graph.memory()->info().GetDeviceType() != OrtMemoryInfoDeviceType_CPU)
      throw Failure(SPECX_PROVIDER, s.graph + " is an imported graph (concat layout), which "
                                        "libspecx runs on the CPU only; use the \"cpu\" provider");
    slot_capacity_ = slots;
    mask_.assign(size_t(slots), 0);
    slot_of_.assign(size_t(capacity), 0);
  }
  layer_elems_ = slots * s.kv_heads * s.head_dim;
  for (int layer = 0; layer < s.num_layers; ++layer) {
    const size_t bytes = size_t(layer_elems_) * elem_bytes_;
    keys_.push_back(std::make_unique<DeviceBuffer>(graph.memory(), bytes));
    values_.push_back(std::make_unique<DeviceBuffer>(graph.memory(), bytes));
    if (s.concat()) {
      keys2_.push_back(std::make_unique<DeviceBuffer>(graph.memory(), bytes));
      values2_.push_back(std::make_unique<DeviceBuffer>(graph.memory(), bytes));
    }
  }
  logits_.resize(size_t(kMaxChunk) * size_t(s.vocab_size));
  if (s.half_logits()) logits16_.resize(logits_.size());
  tokens_.assign(size_t(capacity), -1);
  features_.resize(size_t(kMaxChunk) * size_t(s.feature_size));
  ids_.resize(kMaxChunk);
  positions_.resize(kMaxChunk);
}

void Runner::truncate(int64_t length) {
  if (length < 0 || length > length_)
    throw invalid("cannot truncate a cache of " + std::to_string(length_) + " to " +
                  std::to_string(length));
  if (graph_.spec().concat())  // the rolled-back slots stay, masked out
    for (int64_t p = length; p < length_; ++p) mask_[size_t(slot_of_[size_t(p)])] = 0;
  length_ = length;
}

uint8_t* Runner::buffer(int set, int layer, int kv) const {
  const auto& list = set == 0 ? (kv == 0 ? keys_ : values_) : (kv == 0 ? keys2_ : values2_);
  return static_cast<uint8_t*>(list[size_t(layer)]->data());
}

// The valid slots, in order, to the start of the other set, which becomes the front: no holes.
void Runner::compact() {
  const ModelSpec& s = graph_.spec();
  const size_t row = size_t(s.head_dim) * elem_bytes_;  // one head's slot
  for (int layer = 0; layer < s.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* from = buffer(front_, layer, kv);
      uint8_t* to = buffer(1 - front_, layer, kv);
      for (int64_t h = 0; h < s.kv_heads; ++h)
        for (int64_t i = 0; i < length_; ++i)
          std::memcpy(to + size_t(h * length_ + i) * row,
                      from + size_t(h * slots_ + slot_of_[size_t(i)]) * row, row);
    }
  }
  front_ = 1 - front_;
  slots_ = length_;
  std::fill(mask_.begin(), mask_.end(), 0);
  std::fill(mask_.begin(), mask_.begin() + length_, 1);
  for (int64_t i = 0; i < length_; ++i) slot_of_[size_t(i)] = i;
  ++compactions_;
}

// An imported graph's pass: past = the front set's slots [1, H, slots, D], present = past + new
// into the other set; attention_mask 1 for each valid slot and the new ones.
void Runner::bind_concat(int64_t seq) {
  const ModelSpec& s = graph_.spec();
  if (slots_ + seq > slot_capacity_ || slots_ - length_ > std::max(kMinHoles, length_ / 4))
    compact();
  std::fill(mask_.begin() + slots_, mask_.begin() + slots_ + seq, 1);
  std::array<int64_t, 2> mask_shape{1, slots_ + seq};
  io_.BindInput("attention_mask",
                index_tensor("attention_mask", mask_.data(), size_t(slots_ + seq), mask_shape.data(), 2));
  ONNXTensorElementDataType type = elem_bytes_ == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  std::array<int64_t, 4> past{1, s.kv_heads, slots_, s.head_dim};
  std::array<int64_t, 4> present{1, s.kv_heads, slots_ + seq, s.head_dim};
  const size_t slot_bytes = size_t(s.kv_heads * s.head_dim) * elem_bytes_;
  const Ort::MemoryInfo& where = graph_.memory()->info();
  for (int layer = 0; layer < s.num_layers; ++layer) {
    const std::string n = std::to_string(layer);
    for (int kv = 0; kv < 2; ++kv) {
      const std::string what = kv == 0 ? ".key" : ".value";
      io_.BindInput(("past_key_values." + n + what).c_str(),
                    Ort::Value::CreateTensor(where, buffer(front_, layer, kv), size_t(slots_) * slot_bytes,
                                             past.data(), 4, type));
      io_.BindOutput(("present." + n + what).c_str(),
                     Ort::Value::CreateTensor(where, buffer(1 - front_, layer, kv),
                                              size_t(slots_ + seq) * slot_bytes, present.data(), 4, type));
    }
  }
}

int64_t Runner::shared_prefix(const int64_t* prompt, int64_t n,
                              const std::optional<std::string>& scope) const {
  if (!scope || scope_ != scope) return 0;
  const int64_t most = std::min(n, length_);
  int64_t i = 0;
  while (i < most && tokens_[size_t(i)] == prompt[i]) ++i;
  return i;
}

void Runner::claim(const std::optional<std::string>& scope, int64_t keep) {
  if (keep > 0 && (!scope || scope_ != scope))
    throw invalid("a cache keeps positions only for the scope that computed them");
  truncate(keep);
  scope_ = scope;
}

void Runner::bind_cache(int64_t past, int64_t seq) {
  const ModelSpec& s = graph_.spec();
  const bool full = s.full_buffer();
  if (full && cache_bound_) return;  // the buffers never move: bound once
  ONNXTensorElementDataType type = elem_bytes_ == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  const int64_t row = int64_t(s.kv_heads) * s.head_dim;  // one position, plain layout
  std::array<int64_t, 4> past_shape = full ? std::array<int64_t, 4>{1, s.kv_heads, capacity_, s.head_dim}
                                           : std::array<int64_t, 4>{1, past, s.kv_heads, s.head_dim};
  std::array<int64_t, 4> new_shape = full ? past_shape
                                          : std::array<int64_t, 4>{1, seq, s.kv_heads, s.head_dim};
  const size_t past_bytes = size_t(full ? layer_elems_ : past * row) * elem_bytes_;
  const size_t new_bytes = size_t(full ? layer_elems_ : seq * row) * elem_bytes_;
  const size_t offset = full ? 0 : size_t(past * row) * elem_bytes_;
  for (int layer = 0; layer < s.num_layers; ++layer) {
    const std::string n = std::to_string(layer);
    for (int kv = 0; kv < 2; ++kv) {
      auto* base = static_cast<uint8_t*>((kv == 0 ? keys_ : values_)[size_t(layer)]->data());
      const Ort::MemoryInfo& where = graph_.memory()->info();
      const std::string what = kv == 0 ? "key." : "value.";
      // names: past_key.N / present_key.N (new_key.N), or an imported graph's own
      const std::string past_name = s.imported() ? "past_key_values." + n + "." + what.substr(0, what.size() - 1)
                                                 : "past_" + what + n;
      const std::string out_name = s.imported() ? "present." + n + "." + what.substr(0, what.size() - 1)
                                                : (full ? "present_" : "new_") + what + n;
      io_.BindInput(past_name.c_str(),
                    Ort::Value::CreateTensor(where, base, past_bytes, past_shape.data(), 4, type));
      io_.BindOutput(out_name.c_str(),
                     Ort::Value::CreateTensor(where, base + offset, new_bytes, new_shape.data(), 4, type));
    }
  }
  cache_bound_ = full;
}

Ort::Value Runner::index_tensor(const std::string& name, int64_t* values, size_t count,
                                const int64_t* shape, size_t rank) {
  const auto narrow = narrow_.find(name);  // empty but for imported graphs' int32 inputs
  if (narrow == narrow_.end())
    return Ort::Value::CreateTensor<int64_t>(cpu_, values, count, shape, rank);
  int32_t* out = narrow->second.data();  // sized at construction for the longest binding
  for (size_t i = 0; i < count; ++i) out[i] = int32_t(values[i]);  // ids, positions < 2^31
  return Ort::Value::CreateTensor<int32_t>(cpu_, out, count, shape, rank);
}

const float* Runner::forward(const int64_t* tokens, int64_t seq, int64_t keep) {
  const ModelSpec& s = graph_.spec();
  const TensorSpec* keep_input = s.logits_to_keep();
  if (!keep_input) keep = seq;  // the graph returns every new position's logits
  if (seq < 1 || seq > kMaxChunk)
    throw invalid("a pass takes 1.." + std::to_string(kMaxChunk) + " tokens, got " + std::to_string(seq));
  if (length_ + seq > capacity_)
    throw invalid("cache overflow: " + std::to_string(length_) + " cached + " +
                  std::to_string(seq) + " new positions exceed " + std::to_string(capacity_));
  const int64_t past = length_;
  std::memcpy(ids_.data(), tokens, size_t(seq) * sizeof(int64_t));
  std::array<int64_t, 2> shape{1, seq};
  io_.BindInput("input_ids", index_tensor("input_ids", ids_.data(), size_t(seq), shape.data(), 2));
  if (s.has_input("position_ids")) {
    for (int64_t i = 0; i < seq; ++i) positions_[size_t(i)] = past + i;
    io_.BindInput("position_ids",
                  index_tensor("position_ids", positions_.data(), size_t(seq), shape.data(), 2));
  }
  std::array<int64_t, 1> one{1};
  if (keep_input) {  // the last `keep` new positions' logits
    keep_ = keep;
    io_.BindInput(keep_input->name.c_str(),
                  Ort::Value::CreateTensor<int64_t>(cpu_, &keep_, 1, one.data(), keep_input->rank));
  }
  if (s.attention == "gqa") {
    seqlens_k_ = int32_t(past + seq - 1);
    total_length_ = int32_t(past + seq);
    io_.BindInput("seqlens_k", Ort::Value::CreateTensor<int32_t>(cpu_, &seqlens_k_, 1, one.data(), 1));
    io_.BindInput("total_sequence_length",
                  Ort::Value::CreateTensor<int32_t>(cpu_, &total_length_, 1, nullptr, 0));
  } else if (s.genai()) {  // its op derives lengths and positions from an all-ones mask
    std::array<int64_t, 2> mask_shape{1, past + seq};
    io_.BindInput("attention_mask",
                  index_tensor("attention_mask", ones_.data(), size_t(past + seq), mask_shape.data(), 2));
  } else if (s.attention == "batched") {
    positions_[0] = past;  // write_indices: the row's length before this pass
    io_.BindInput("write_indices", Ort::Value::CreateTensor<int64_t>(cpu_, positions_.data(), 1, one.data(), 1));
  }
  if (s.concat())
    bind_concat(seq);
  else
    bind_cache(past, seq);
  std::array<int64_t, 3> out{1, keep, s.vocab_size};
  if (logits16_.empty())
    io_.BindOutput("logits", Ort::Value::CreateTensor<float>(cpu_, logits_.data(), size_t(keep * s.vocab_size),
                                                             out.data(), 3));
  else
    io_.BindOutput("logits", Ort::Value::CreateTensor(cpu_, logits16_.data(), size_t(keep * s.vocab_size) * 2,
                                                      out.data(), 3, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16));
  if (s.feature_size) {
    std::array<int64_t, 3> f{1, seq, s.feature_size};
    io_.BindOutput("features", Ort::Value::CreateTensor<float>(cpu_, features_.data(),
                                                               size_t(seq * s.feature_size), f.data(), 3));
  }
  try {
    graph_.session().Run(Ort::RunOptions{nullptr}, io_);
  } catch (const Ort::Exception& e) {
    throw Failure(SPECX_RUNTIME, "onnxruntime failed in a pass of " + s.graph + ": " + e.what());
  }
  if (!logits16_.empty())  // an fp16 graph's logits, read as float32 (exact)
    std::transform(logits16_.begin(), logits16_.begin() + keep * s.vocab_size, logits_.begin(), half_to_float);
  std::copy(tokens, tokens + seq, tokens_.begin() + past);
  if (s.concat()) {  // the other set now holds the slots; the new positions' slots follow
    front_ = 1 - front_;
    for (int64_t i = 0; i < seq; ++i) slot_of_[size_t(past + i)] = slots_ + i;
    slots_ += seq;
  }
  length_ += seq;
  ++passes_;
  return logits_.data();
}

const float* Runner::prefill(const int64_t* tokens, int64_t n) {
  const float* last = nullptr;
  for (int64_t start = 0; start < n; start += kMaxChunk) {
    int64_t seq = std::min<int64_t>(kMaxChunk, n - start);
    const int64_t keep = graph_.spec().logits_to_keep() ? 1 : seq;  // only the last row is read
    last = forward(tokens + start, seq, keep) + size_t(keep - 1) * size_t(vocab_size());
  }
  return last;
}

}  // namespace specx
