// ONNX Runtime custom ops over GGUF blocks (domain "specx"):
//   GgufMatMul(X float [..., K], B uint8 [N, row_bytes]) -> Y float [..., N]
//   GgufGather(B uint8 [V, row_bytes], ids int64 [...]) -> Y float [..., K]
// attributes: type (the GGML type id of B's blocks), K, and N for GgufMatMul. B is the file's
// blocks, row by row, unchanged. Output columns are split over ONNX Runtime's intra-op threads;
// each output is computed whole by one task, so the thread count changes no bit.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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
    Ort::UnownedSessionOptions(options).Add(*domain);
    std::lock_guard<std::mutex> hold(domains_lock);
    domains.push_back(std::move(domain));
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
