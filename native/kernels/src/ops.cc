// ONNX Runtime custom ops (domain "specx"):
//   GgufMatMul(X float [..., K], B uint8 [N, row_bytes]) -> Y float [..., N]
//   GgufGather(B uint8 [V, row_bytes], ids int64 [...]) -> Y float [..., K]
//   GroupQueryAttention: com.microsoft's inputs, outputs and attributes (attention.h), each
//     query row computed alone, so a verify pass's rows equal one-token passes bit for bit
// attributes: type (the GGML type id of B's blocks), K, and N for GgufMatMul. B is the file's
// blocks, row by row, unchanged. Output columns are split over ONNX Runtime's intra-op threads;
// each output is computed whole by one task, so the thread count changes no bit.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attention.h"
#include "matmul.h"
#include "specx_kernels.h"

namespace {

constexpr int64_t kColumnsPerTask = 16;
// Tasks are grouped into at most this many batches, each a contiguous run of columns: one
// dispatch per batch instead of per task; outputs stay computed whole by one task.
constexpr size_t kBatches = 32;

struct Attributes {
  const specx::BlockFormat* format = nullptr;
  int64_t k = 0, n = 0;
  size_t row_bytes = 0;
};

// Reads and checks the attributes; an error names the problem (a missing library is the caller's).
Attributes read_attributes(const OrtKernelInfo* info, const char* op, bool with_n) {
  Ort::ConstKernelInfo kernel_info(info);
  Attributes a;
  const int64_t type = kernel_info.GetAttribute<int64_t>("type");
  a.format = specx::find_format(static_cast<int>(type));
  if (a.format == nullptr) {
    throw std::invalid_argument(std::string(op) + ": GGML type " + std::to_string(type) +
                                " is not held by the specx kernels (held: " +
                                specx::held_formats() + "); export with --kernels ort");
  }
  a.k = kernel_info.GetAttribute<int64_t>("K");
  if (a.k <= 0 || a.k % a.format->elements != 0) {
    throw std::invalid_argument(std::string(op) + ": K = " + std::to_string(a.k) +
                                " is not a positive multiple of " + a.format->name + "'s " +
                                std::to_string(a.format->elements) + " weights a block");
  }
  a.n = with_n ? kernel_info.GetAttribute<int64_t>("N") : 0;
  if (with_n && a.n <= 0) throw std::invalid_argument(std::string(op) + ": N must be positive");
  a.row_bytes = static_cast<size_t>(a.k / a.format->elements * a.format->bytes);
  return a;
}

OrtStatusPtr error_status(const std::exception& e) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, e.what());
}

template <typename T>
T optional_attribute(const Ort::ConstKernelInfo& info, const char* name, T fallback) {
  try {
    return info.GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

void check_blocks(const std::vector<int64_t>& shape, const Attributes& a, int64_t rows,
                  const char* op) {
  if (shape.size() != 2 || (rows >= 0 && shape[0] != rows) ||
      shape[1] != static_cast<int64_t>(a.row_bytes)) {
    throw std::invalid_argument(std::string(op) + ": the block input must be [" +
                                (rows >= 0 ? std::to_string(rows) : std::string("rows")) + ", " +
                                std::to_string(a.row_bytes) + "] bytes of " + a.format->name);
  }
}

// The quantized activations of a call, reused: a decode step allocates nothing. Per thread, as
// ONNX Runtime may run a session from several threads; a node's Compute runs whole on the
// thread that called it.
thread_local specx::Activations scratch;

struct MatMulKernel {
  Attributes attrs;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) try {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue x = ctx.GetInput(0);
    const Ort::ConstValue b = ctx.GetInput(1);
    std::vector<int64_t> shape = x.GetTensorTypeAndShapeInfo().GetShape();
    if (shape.empty() || shape.back() != attrs.k) {
      throw std::invalid_argument("GgufMatMul: the input's last dimension must be K = " +
                                  std::to_string(attrs.k));
    }
    check_blocks(b.GetTensorTypeAndShapeInfo().GetShape(), attrs, attrs.n, "GgufMatMul");
    int64_t m = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
    shape.back() = attrs.n;
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    if (m == 0) return nullptr;
    const specx::QuantRows acts = scratch.quantize(specx::active_isa(), *attrs.format,
                                                   x.GetTensorData<float>(), m, attrs.k);
    const specx::MatMulJob job{attrs.format, b.GetTensorData<uint8_t>(), attrs.row_bytes, attrs.k,
                               attrs.n,      m, acts, out.GetTensorMutableData<float>()};
    const size_t tasks = static_cast<size_t>((attrs.n + kColumnsPerTask - 1) / kColumnsPerTask);
    auto run = [](void* data, size_t task) {
      const auto* j = static_cast<const specx::MatMulJob*>(data);
      const int64_t n0 = static_cast<int64_t>(task) * kColumnsPerTask;
      const int64_t n1 = n0 + kColumnsPerTask < j->n ? n0 + kColumnsPerTask : j->n;
      specx::matmul_columns(specx::active_isa(), *j, n0, n1);
    };
    ctx.ParallelFor(run, tasks, kBatches, const_cast<specx::MatMulJob*>(&job));
    return nullptr;
  } catch (const std::exception& e) {
    return error_status(e);
  }
};

struct GatherKernel {
  Attributes attrs;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) try {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue b = ctx.GetInput(0);
    const Ort::ConstValue ids = ctx.GetInput(1);
    const std::vector<int64_t> table = b.GetTensorTypeAndShapeInfo().GetShape();
    check_blocks(table, attrs, -1, "GgufGather");
    std::vector<int64_t> shape = ids.GetTensorTypeAndShapeInfo().GetShape();
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    shape.push_back(attrs.k);
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    const int64_t* id = ids.GetTensorData<int64_t>();
    const uint8_t* rows = b.GetTensorData<uint8_t>();
    float* y = out.GetTensorMutableData<float>();
    const int64_t vocab = table[0];
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = id[i] < 0 ? id[i] + vocab : id[i];
      if (row < 0 || row >= vocab) {
        throw std::out_of_range("GgufGather: id " + std::to_string(id[i]) +
                                " is outside the table's " + std::to_string(vocab) + " rows");
      }
      specx::dequantize_row(*attrs.format, rows + row * static_cast<int64_t>(attrs.row_bytes),
                            attrs.k, y + i * attrs.k);
    }
    return nullptr;
  } catch (const std::exception& e) {
    return error_status(e);
  }
};

struct AttentionKernel {
  int64_t heads = 0, kv_heads = 0, window = -1;
  float scale = 0.0f;
  bool rotary = false;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) try {
    Ort::KernelContext ctx(context);
    const std::vector<int64_t> q = ctx.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
    const Ort::ConstValue past_key = ctx.GetInput(3);
    const Ort::ConstValue past_value = ctx.GetInput(4);
    const std::vector<int64_t> cache = past_key.GetTensorTypeAndShapeInfo().GetShape();
    if (q.size() != 3 || cache.size() != 4 || q[2] % heads != 0 || cache[0] != q[0] ||
        cache[1] != kv_heads || cache[3] != q[2] / heads ||
        ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetShape() !=
            std::vector<int64_t>{q[0], q[1], kv_heads * cache[3]} ||
        ctx.GetInput(2).GetTensorTypeAndShapeInfo().GetShape() !=
            std::vector<int64_t>{q[0], q[1], kv_heads * cache[3]} ||
        past_value.GetTensorTypeAndShapeInfo().GetShape() != cache) {
      throw std::invalid_argument(
          "GroupQueryAttention: expected query [batch, seq, heads * head_dim], key and value "
          "[batch, seq, kv_heads * head_dim], past key and value [batch, kv_heads, capacity, "
          "head_dim]");
    }
    specx::AttentionShape s{q[0], q[1], heads, kv_heads, cache[3], cache[2], 0, window,
                            scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(cache[3]))};
    const Ort::ConstValue seqlens = ctx.GetInput(5);
    if (seqlens.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(s.batch)) {
      throw std::invalid_argument("GroupQueryAttention: seqlens_k must hold one length a row");
    }
    std::vector<int32_t> total(static_cast<size_t>(s.batch));
    for (int64_t b = 0; b < s.batch; ++b) {
      total[b] = seqlens.GetTensorData<int32_t>()[b] + 1;
      if (total[b] < s.seq || total[b] > s.capacity) {
        throw std::out_of_range("GroupQueryAttention: " + std::to_string(total[b]) +
                                " positions do not fit a cache of " + std::to_string(s.capacity) +
                                " after " + std::to_string(s.seq) + " new tokens");
      }
    }
    const float* cos = nullptr;
    const float* sin = nullptr;
    if (rotary) {
      const Ort::ConstValue c = ctx.GetInput(7), n = ctx.GetInput(8);
      const std::vector<int64_t> table = c.GetTensorTypeAndShapeInfo().GetShape();
      if (table.size() != 2 || 2 * table[1] > s.head_dim ||
          n.GetTensorTypeAndShapeInfo().GetShape() != table ||
          *std::max_element(total.begin(), total.end()) > table[0]) {
        throw std::invalid_argument(
            "GroupQueryAttention: cos and sin caches must be [positions, rotary_dim / 2] and "
            "cover every position");
      }
      s.rotary_dim = 2 * table[1];
      cos = c.GetTensorData<float>();
      sin = n.GetTensorData<float>();
    }
    Ort::UnownedValue out = ctx.GetOutput(0, q);
    Ort::UnownedValue present_key = ctx.GetOutput(1, cache);
    Ort::UnownedValue present_value = ctx.GetOutput(2, cache);
    float* keys = present_key.GetTensorMutableData<float>();
    float* values = present_value.GetTensorMutableData<float>();
    const size_t cache_bytes = past_key.GetTensorTypeAndShapeInfo().GetElementCount() * sizeof(float);
    if (keys != past_key.GetTensorData<float>()) {  // not bound in place: carry the past over
      std::memcpy(keys, past_key.GetTensorData<float>(), cache_bytes);
    }
    if (values != past_value.GetTensorData<float>()) {
      std::memcpy(values, past_value.GetTensorData<float>(), cache_bytes);
    }
    const specx::AttentionJob job{s,      ctx.GetInput(0).GetTensorData<float>(),
                                  ctx.GetInput(1).GetTensorData<float>(),
                                  ctx.GetInput(2).GetTensorData<float>(),
                                  total.data(), cos, sin, keys, values,
                                  out.GetTensorMutableData<float>()};
    for (int64_t b = 0; b < s.batch; ++b) specx::attention_store(job, b);
    auto run = [](void* data, size_t task) {
      const auto* j = static_cast<const specx::AttentionJob*>(data);
      const int64_t t = static_cast<int64_t>(task), groups = j->shape.kv_heads;
      const int64_t g = t % groups, i = t / groups % j->shape.seq;
      specx::attention_group(specx::active_isa(), *j, t / (groups * j->shape.seq), i, g);
    };
    const size_t tasks = static_cast<size_t>(s.batch * s.seq * s.kv_heads);
    ctx.ParallelFor(run, tasks, 0, const_cast<specx::AttentionJob*>(&job));
    return nullptr;
  } catch (const std::exception& e) {
    return error_status(e);
  }
};

struct AttentionOp : Ort::CustomOpBase<AttentionOp, AttentionKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const try {
    Ort::ConstKernelInfo ki(info);
    auto made = std::make_unique<AttentionKernel>();
    made->heads = ki.GetAttribute<int64_t>("num_heads");
    made->kv_heads = ki.GetAttribute<int64_t>("kv_num_heads");
    made->scale = optional_attribute<float>(ki, "scale", 0.0f);
    made->rotary = optional_attribute<int64_t>(ki, "do_rotary", 0) != 0;
    made->window = optional_attribute<int64_t>(ki, "local_window_size", -1);
    if (made->heads <= 0 || made->kv_heads <= 0 || made->heads % made->kv_heads != 0) {
      throw std::invalid_argument("GroupQueryAttention: num_heads must be a positive multiple "
                                  "of kv_num_heads");
    }
    if (optional_attribute<int64_t>(ki, "rotary_interleaved", 0) != 0 ||
        optional_attribute<float>(ki, "softcap", 0.0f) != 0.0f) {
      throw std::invalid_argument("GroupQueryAttention: the specx kernels hold neither "
                                  "interleaved rotary nor softcap; export with --kernels ort");
    }
    *kernel = made.release();
    return nullptr;
  } catch (const std::exception& e) {
    return error_status(e);
  }

  const char* GetName() const { return "GroupQueryAttention"; }
  size_t GetInputTypeCount() const { return 9; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 5 || i == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
                            : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= 7 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

template <typename Kernel, bool WithN>
struct Op : Ort::CustomOpBase<Op<Kernel, WithN>, Kernel, true> {
  Op(const char* name, ONNXTensorElementDataType in0, ONNXTensorElementDataType in1)
      : name_(name), inputs_{in0, in1} {}

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const try {
    auto made = std::make_unique<Kernel>();
    made->attrs = read_attributes(info, name_, WithN);
    *kernel = made.release();
    return nullptr;
  } catch (const std::exception& e) {
    return error_status(e);
  }

  const char* GetName() const { return name_; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return inputs_[i]; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }

  const char* name_;
  ONNXTensorElementDataType inputs_[2];
};

const Op<MatMulKernel, true> kMatMul("GgufMatMul", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                     ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8);
const Op<GatherKernel, false> kGather("GgufGather", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
const AttentionOp kAttention;

std::mutex domains_lock;
std::vector<std::unique_ptr<Ort::CustomOpDomain>> domains;  // alive as long as the sessions

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {  // an ONNX Runtime older than these headers: no status can be made
    return nullptr;
  }
  Ort::InitApi(api);
  try {
    auto domain = std::make_unique<Ort::CustomOpDomain>(SPECX_KERNELS_DOMAIN);
    domain->Add(&kMatMul);
    domain->Add(&kGather);
    domain->Add(&kAttention);
    Ort::UnownedSessionOptions(options).Add(*domain);
    std::lock_guard<std::mutex> hold(domains_lock);
    domains.push_back(std::move(domain));
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
