#include "device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "failure.h"

namespace specx {
namespace {

class HostMemory final : public DeviceMemory {
 public:
  HostMemory() : info_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)) {}
  const Ort::MemoryInfo& info() const override { return info_; }
  void* allocate_zeroed(size_t bytes) override {
    void* p = std::calloc(bytes == 0 ? 1 : bytes, 1);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* pointer) noexcept override { std::free(pointer); }

 private:
  Ort::MemoryInfo info_;
};

// The few CUDA runtime calls a cache needs, found at run time: libspecx itself never links
// CUDA, so one build serves CPU-only and GPU installs of ONNX Runtime.
struct CudaRuntime {
  using SetDevice = int (*)(int);
  using Malloc = int (*)(void**, size_t);
  using Memset = int (*)(void*, int, size_t);
  using Free = int (*)(void*);
  using ErrorString = const char* (*)(int);
  SetDevice set_device = nullptr;
  Malloc malloc = nullptr;
  Memset memset = nullptr;
  Free free = nullptr;
  ErrorString error_string = nullptr;

  static const CudaRuntime& get() {
    static std::once_flag once;
    static CudaRuntime runtime;
    static std::string missing;
    std::call_once(once, [] { missing = runtime.load(); });
    if (!missing.empty())
      throw Failure(SPECX_PROVIDER, missing + " (install the CUDA runtime that onnxruntime-gpu "
                                              "needs and make sure a GPU is visible)");
    return runtime;
  }

  void check(int status, const char* what) const {
    if (status != 0)
      throw Failure(SPECX_PROVIDER, std::string("CUDA ") + what + " failed: " + error_string(status));
  }

 private:
  std::string load() {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (lib == nullptr) return "the CUDA runtime (libcudart) was not found";
    set_device = reinterpret_cast<SetDevice>(dlsym(lib, "cudaSetDevice"));
    malloc = reinterpret_cast<Malloc>(dlsym(lib, "cudaMalloc"));
    memset = reinterpret_cast<Memset>(dlsym(lib, "cudaMemset"));
    free = reinterpret_cast<Free>(dlsym(lib, "cudaFree"));
    error_string = reinterpret_cast<ErrorString>(dlsym(lib, "cudaGetErrorString"));
    if (!set_device || !malloc || !memset || !free || !error_string)
      return "libcudart lacks cudaMalloc/cudaMemset/cudaFree";
    return "";
  }
};

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device_id)
      : device_id_(device_id),
        info_("Cuda", OrtDeviceAllocator, device_id, OrtMemTypeDefault),
        cuda_(CudaRuntime::get()) {}
  const Ort::MemoryInfo& info() const override { return info_; }
  void* allocate_zeroed(size_t bytes) override {
    void* p = nullptr;
    cuda_.check(cuda_.set_device(device_id_), "cudaSetDevice");
    cuda_.check(cuda_.malloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    int zeroed = cuda_.memset(p, 0, bytes);
    if (zeroed != 0) {
      cuda_.free(p);
      cuda_.check(zeroed, "cudaMemset");
    }
    return p;
  }
  void release(void* pointer) noexcept override { cuda_.free(pointer); }

 private:
  int device_id_;
  Ort::MemoryInfo info_;
  const CudaRuntime& cuda_;
};

}  // namespace

std::shared_ptr<DeviceMemory> device_memory(const std::string& provider, int device_id) {
  if (provider == "cpu") return std::make_shared<HostMemory>();
  return std::make_shared<CudaMemory>(device_id);
}

}  // namespace specx
